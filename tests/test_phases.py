"""Smoothing and the two-stage Kneedle: planted knees, documented fallbacks, validation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from resdyn.study_b.phases import cutpoints, phase_of_layer, phase_spans, profile_at, smooth

METHODS = [("none", 1), ("moving_average", 3), ("savgol", 5)]


def rise_plateau_descent(m: int, seed: int, noise: float = 0.005, hump: float = 0.03):
    """Piecewise-linear RSS-like profile with knees at b1 = round(m/4), b2 = round(0.7 m).

    Rise 0.3 → 0.9 on [0, b1], a plateau at 0.9 with a small parabolic hump (peak inside it)
    on [b1, b2], a linear descent to 0.4 on [b2, m−1], plus seeded Gaussian noise.
    """
    rng = np.random.default_rng(seed)
    b1, b2 = round(0.25 * m), round(0.7 * m)
    x = np.arange(m, dtype=float)
    y = np.empty(m)
    y[: b1 + 1] = 0.3 + 0.6 * x[: b1 + 1] / b1
    t = (x[b1 : b2 + 1] - b1) / (b2 - b1)
    y[b1 : b2 + 1] = 0.9 + hump * 4 * t * (1 - t)
    y[b2:] = 0.9 - 0.5 * (x[b2:] - b2) / (m - 1 - b2)
    return y + rng.normal(0.0, noise, m), b1, b2


# ---------------------------------------------------------------- smoothing


def test_moving_average_known_values_and_edges():
    np.testing.assert_allclose(smooth([0.0, 3.0, 0.0, 3.0, 0.0], 3, "moving_average"), [0, 1, 2, 1, 0])
    # window 5: radius shrinks symmetrically at the edges (endpoints kept)
    y = np.array([1.0, 2.0, 6.0, 2.0, 1.0, 0.0])
    np.testing.assert_allclose(smooth(y, 5, "moving_average"), [1.0, 3.0, 12 / 5, 11 / 5, 1.0, 0.0], rtol=1e-15)


@pytest.mark.parametrize("method,window", [("moving_average", 3), ("moving_average", 7), ("savgol", 5), ("savgol", 3)])
def test_smoothing_reproduces_a_line(method, window):
    y = 0.2 + 0.05 * np.arange(11)
    np.testing.assert_allclose(smooth(y, window, method), y, rtol=1e-13)


def test_savgol_reproduces_a_quadratic_and_none_copies():
    x = np.arange(9.0)
    y = 1 + x - 0.1 * x**2
    np.testing.assert_allclose(smooth(y, 5, "savgol"), y, rtol=1e-12)
    out = smooth(y, 99, "none")  # window ignored
    np.testing.assert_array_equal(out, y)
    assert out is not y


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(profile=np.ones(5), window=4, method="moving_average"), "odd positive"),
        (dict(profile=np.ones(5), window=0, method="moving_average"), "odd positive"),
        (dict(profile=np.ones(5), window=2.0, method="moving_average"), "odd positive"),
        (dict(profile=np.ones(5), window=7, method="moving_average"), r"window=7.*5 points"),
        (dict(profile=np.ones(5), window=1, method="savgol"), "polyorder=2"),
        (dict(profile=np.ones(5), window=3, method="lowess"), "one of"),
        (dict(profile=np.ones((2, 3)), window=3, method="moving_average"), r"1-D.*\(2, 3\)"),
        (dict(profile=[1.0, np.nan, 1.0], window=3, method="moving_average"), r"indices \[1\]"),
    ],
)
def test_smooth_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        smooth(**kwargs)


# ---------------------------------------------------------------- planted knees


@pytest.mark.parametrize("method,window", METHODS)
@pytest.mark.parametrize("m", [12, 16, 20, 24, 30, 40])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_planted_knees(method, window, m, seed):
    y, b1, b2 = rise_plateau_descent(m, seed)
    c = cutpoints(y, window=window, method=method)
    # (with savgol-5 on short profiles the rounded corner can put the peak right after b1, so
    # stage 1 has too short a tail for Kneedle's threshold and falls back to b1 = peak: still ±1)
    assert c.b1_found or c.b1 == c.peak
    assert abs(c.b1 - b1) <= 1, (c.b1, b1)
    assert abs(c.b2 - b2) <= 1, (c.b2, b2)
    assert 0 <= c.b1 <= c.peak <= c.b2 <= m - 1
    assert b1 <= c.peak <= b2 + 1


@pytest.mark.parametrize("m", [20, 30, 40])
def test_knees_found_without_fallback_on_longer_profiles(m):
    for method, window in METHODS:
        for seed in range(3):
            c = cutpoints(rise_plateau_descent(m, seed)[0], window=window, method=method)
            assert c.b1_found and c.b2_found and c.reason == ""


def test_noise_free_knees_are_exact():
    y, b1, b2 = rise_plateau_descent(20, 0, noise=0.0)
    c = cutpoints(y, method="none")
    assert (c.b1, c.b2) == (b1, b2)


def test_result_layout_and_audit_is_json_serialisable():
    y, _, _ = rise_plateau_descent(16, 0)
    c = cutpoints(y)
    json.dumps(c.to_json(), allow_nan=False)
    assert c.spans == tuple(phase_spans(16, c.b1, c.b2))
    assert sum(c.widths) == 16
    assert len(c.smoothed) == 16 and list(c.profile) == pytest.approx(list(y))
    rise = c.stages["rise"]
    assert rise["x"] == list(range(c.peak + 1)) and rise["knee"] == c.b1
    assert len(rise["y_difference"]) == c.peak + 1 and rise["thresholds"]
    assert c.stages["descent"]["x"] == list(range(c.peak, 16))


# ---------------------------------------------------------------- fallbacks (never raise)


@pytest.mark.parametrize("method,window", METHODS)
def test_monotone_increasing(method, window):
    x = np.arange(15.0)
    c = cutpoints(1 - np.exp(-x / 3), window=window, method=method)  # saturating rise
    assert c.peak == 14 and c.b2 == 14 and not c.b2_found
    assert c.b1_found and 3 <= c.b1 <= 7
    assert "descent (b2)" in c.reason and "fallback b2 = peak = 14" in c.reason
    assert c.widths[2] == 0
    c = cutpoints(x, window=window, method=method)  # straight ramp: no knee anywhere
    assert (c.b1, c.peak, c.b2) == (14, 14, 14)
    assert not c.b1_found and "rise (b1): Kneedle found no knee" in c.reason


@pytest.mark.parametrize("method,window", METHODS)
def test_monotone_decreasing(method, window):
    x = np.arange(15.0)
    c = cutpoints(1 - (x / 14) ** 2, window=window, method=method)  # plateau-then-fall
    assert c.peak == 0 and c.b1 == 0 and not c.b1_found
    assert "fallback b1 = peak = 0" in c.reason
    assert c.b2_found and 4 <= c.b2 <= 10
    c = cutpoints(np.exp(-x / 3), window=window, method=method)  # convex decay: no concave knee
    assert (c.b1, c.peak, c.b2) == (0, 0, 0)
    assert not c.b2_found and "descent (b2)" in c.reason


@pytest.mark.parametrize("method,window", METHODS)
def test_flat_profile(method, window):
    c = cutpoints(np.full(12, 0.7), window=window, method=method)
    assert (c.b1, c.peak, c.b2) == (0, 0, 0)
    assert not c.b1_found and not c.b2_found
    assert "flat" in c.reason
    assert c.widths == (1, 0, 11)


@pytest.mark.parametrize("method,window", METHODS)
@pytest.mark.parametrize("y", [[0.1, 0.9, 0.8, 0.2], [0.5, 0.6, 0.7, 0.2], [0.9, 0.5, 0.4, 0.3], [0.2, 0.4, 0.4, 0.4]])
def test_four_point_profiles(method, window, y):
    c = cutpoints(y, window=window, method=method)
    assert 0 <= c.b1 <= c.peak <= c.b2 <= 3
    assert sum(c.widths) == 4
    # a 4-point profile cannot give both knees (a stage needs >= 3 points on each side)
    assert c.reason != ""
    if method == "savgol":
        assert c.notes == ("window 5 > profile length 4: reduced to 3",) and c.window == 3


def test_three_point_profile():
    c = cutpoints([0.2, 0.9, 0.3])
    assert (c.b1, c.peak, c.b2) == (1, 1, 1)
    assert "2 point(s)" in c.reason


@pytest.mark.parametrize(
    "profile,match",
    [
        ([1.0, 2.0], "at least 3 points, got 2"),
        ([[1.0, 2.0, 3.0]], r"1-D.*\(1, 3\)"),
        ([0.1, np.nan, 0.3, 0.2], r"indices \[1\]"),
        ([0.1, np.inf, 0.3, 0.2], "finite"),
        (["a", "b", "c"], "real numbers"),
    ],
)
def test_cutpoints_rejects_bad_profiles(profile, match):
    with pytest.raises(ValueError, match=match):
        cutpoints(profile)


def test_cutpoints_rejects_bad_options():
    with pytest.raises(ValueError, match="one of"):
        cutpoints(np.arange(5.0), method="spline")
    with pytest.raises(ValueError, match="odd"):
        cutpoints(np.arange(5.0), window=2)
    with pytest.raises(ValueError, match="sensitivity"):
        cutpoints(np.arange(5.0), sensitivity=0)


# ---------------------------------------------------------------- spans and labels


def test_phase_spans_and_labels():
    assert phase_spans(10, 2, 6) == [(0, 3), (3, 7), (7, 10)]
    assert phase_spans(5, 4, 4) == [(0, 5), (5, 5), (5, 5)]
    assert phase_spans(5, 0, 0) == [(0, 1), (1, 1), (1, 5)]
    assert phase_of_layer(8, 1, 4).tolist() == [1, 1, 2, 2, 2, 3, 3, 3]
    for n, b1, b2 in [(10, 2, 6), (5, 4, 4), (5, 0, 0), (1, 0, 0)]:
        labels = phase_of_layer(n, b1, b2)
        widths = [b - a for a, b in phase_spans(n, b1, b2)]
        assert [int(np.sum(labels == p)) for p in (1, 2, 3)] == widths


@pytest.mark.parametrize("n,b1,b2", [(5, 3, 2), (5, -1, 2), (5, 1, 5), (0, 0, 0), (5, 1.0, 2)])
def test_phase_spans_validation(n, b1, b2):
    with pytest.raises(ValueError):
        phase_spans(n, b1, b2)
    with pytest.raises(ValueError):
        phase_of_layer(n, b1, b2)


# ---------------------------------------------------------------- profile_at (rss.tsv → profile)


def test_profile_at_picks_k_and_orders_layers():
    from resdyn.study_b.readout import rss_profile

    rng = np.random.default_rng(0)
    d, n = 16, 6
    As = [np.eye(d) + 0.4 * rng.standard_normal((d, d)) for _ in range(n)]
    table = rss_profile(As, [2, 4, 8]).sample(frac=1.0, random_state=0)  # shuffled rows
    prof, k = profile_at(table, 0.25)
    assert k == 4 and len(prof) == n - 1 and all(isinstance(v, float) for v in prof)
    expected = table[table.k == 4].sort_values("layer").rss.tolist()
    assert prof == expected
    assert profile_at(table, 0.3)[1] == 4  # k_from_fraction(16, 0.3) = 5 absent: nearest fraction
    assert profile_at(table, 0.5)[1] == 8
    c = cutpoints(prof, window=3).at_k(k, 0.25)
    assert json.loads(json.dumps(c.to_json(), allow_nan=False))["k"] == 4


def test_profile_at_validation():
    import pandas as pd

    with pytest.raises(ValueError, match=r"lacks columns \['rss'\]"):
        profile_at(pd.DataFrame({"layer": [0], "k": [1], "k_fraction": [0.5], "d": [2]}), 0.5)
    bad = pd.DataFrame({"layer": [0, 2], "k": [1, 1], "k_fraction": [0.5, 0.5], "d": 2, "rss": [0.1, 0.2]})
    with pytest.raises(ValueError, match=r"layers must be exactly 0..1, got \[0, 2\]"):
        profile_at(bad, 0.5)


# ---------------------------------------------------------------- Cutpoints and phases.json

PHASES_JSON_KEYS = ["b1", "b2", "peak", "b1_found", "b2_found", "reason", "spans", "widths", "n", "window", "method",
                    "sensitivity", "notes", "profile", "smoothed", "stages"]  # fmt: skip


def test_cutpoints_is_a_frozen_dataclass_whose_json_keeps_the_phases_json_layout():
    import dataclasses

    y, _, _ = rise_plateau_descent(16, 0)
    c = cutpoints(y)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.b1 = 0
    assert list(c.to_json()) == PHASES_JSON_KEYS and c.k is None
    labelled = c.at_k(4, 0.25)
    js = labelled.to_json()
    assert list(js) == PHASES_JSON_KEYS + ["k", "k_fraction_requested"]
    assert (js["k"], js["k_fraction_requested"]) == (4, 0.25) and c.k is None  # at_k returns a copy
    assert js["spans"] == [list(s) for s in phase_spans(16, c.b1, c.b2)] and js["widths"] == list(c.widths)
    assert js["profile"] == [float(v) for v in y] and isinstance(js["notes"], list)
    assert js["stages"]["rise"]["knee"] == c.b1
    # the file round trip gives the same object back
    back = type(c).from_json(json.loads(json.dumps(js, allow_nan=False)))
    assert back == labelled


def _phases_json(**change):
    y, _, _ = rise_plateau_descent(16, 0)
    js = cutpoints(y).at_k(4, 0.25).to_json()
    js.update(change)
    return js


@pytest.mark.parametrize(
    "change, match",
    [
        ({"b1": 9, "peak": 5}, r"cut points must satisfy 0 <= b1 <= peak <= b2 <= n-1, got b1=9"),
        ({"widths": [1, 1, 14]}, "widths .* do not match spans"),
        ({"spans": [[0, 2], [2, 9], [9, 16]]}, "spans .* do not match"),
        ({"profile": [0.5] * 15 + [None]}, "profile must be a list of numbers"),
        ({"smoothed": [0.5] * 15 + [float("nan")]}, "smoothed has non-finite values"),
        ({"b1_found": "yes"}, "b1_found must be true or false"),
        ({"n": 16.0}, "n must be an integer"),
        ({"method": "spline"}, "method must be one of"),
        ({"k_fraction_requested": 2.0}, r"k_fraction_requested must be in \(0, 1\]"),
    ],
)
def test_cutpoints_from_json_names_the_file_and_the_problem(change, match):
    from resdyn.study_b.phases import Cutpoints

    with pytest.raises(ValueError, match="^results/m/c/phases.json: " + match):
        Cutpoints.from_json(_phases_json(**change), source="results/m/c/phases.json")


def test_cutpoints_from_json_refuses_missing_keys_and_non_objects():
    from resdyn.study_b.phases import Cutpoints

    js = _phases_json()
    del js["smoothed"], js["b2"]
    with pytest.raises(ValueError, match=r"phases.json: lacks keys \['b2', 'smoothed'\]"):
        Cutpoints.from_json(js)
    with pytest.raises(ValueError, match="expected a JSON object"):
        Cutpoints.from_json([1, 2, 3])


def test_profile_at_reads_d_from_the_table():
    """d comes from the d column, not from k / k_fraction: change d, and the target k follows."""
    from resdyn.study_b.readout import rss_profile

    rng = np.random.default_rng(1)
    table = rss_profile([np.eye(16) + 0.4 * rng.standard_normal((16, 16)) for _ in range(5)], [2, 4, 8])
    assert profile_at(table, 0.25)[1] == 4  # k_from_fraction(16, 0.25)
    assert profile_at(table.assign(d=32), 0.25)[1] == 8  # k_from_fraction(32, 0.25): a tabulated k
    with pytest.raises(ValueError, match=r"lacks columns \['d'\]"):
        profile_at(table.drop(columns="d"), 0.25)
    mixed = table.assign(d=np.where(table["layer"] == 0, 16, 17))
    with pytest.raises(ValueError, match=r"column d must hold one hidden size.*got \[16, 17\]"):
        profile_at(mixed, 0.25)
    with pytest.raises(ValueError, match=r"an integer >= every k \(max k = 8\), got \[4\]"):
        profile_at(table.assign(d=4), 0.25)


# ---------------------------------------------------------------- middle resolution regime


def _rss_table(profiles: dict[int, np.ndarray], d: int = 100):
    import pandas as pd

    rows = [
        {"layer": L, "k": k, "k_fraction": k / d, "d": d, "rss": float(v), "grassmann_distance": 0.0, "energy": 0.0}
        for k, y in profiles.items()
        for L, v in enumerate(y)
    ]
    return pd.DataFrame(rows)


def _kneed_cut(y: np.ndarray) -> tuple[int, int]:
    """The independent check: kneed's KneeLocator on the two segments around the peak."""
    from kneed import KneeLocator

    x = np.arange(y.size)
    p = int(np.argmax(y))
    b1 = KneeLocator(x[: p + 1], y[: p + 1], S=1.0, curve="concave", direction="increasing").knee
    b2 = KneeLocator(x[p:], y[p:], S=1.0, curve="concave", direction="decreasing").knee
    return int(b1), int(b2)


def _knees_at(m: int, b1: int, b2: int) -> np.ndarray:
    """Rise 0 → 1 on [0, b1], a slow rise to a peak at the middle of the plateau, a fall after b2."""
    x = np.arange(m, dtype=float)
    peak = (b1 + b2) // 2
    y = np.where(x <= b1, x / b1, 1.0 + 0.02 * (x - b1) / (peak - b1))
    y = np.where(x > peak, 1.02 - 0.02 * (x - peak) / (b2 - peak), y)
    return np.where(x > b2, 1.0 - 0.8 * (x - b2) / (m - 1 - b2), y)


def test_regime_agreement_on_known_knees_matches_kneed():
    from resdyn.study_b.phases import regime_agreement

    m = 24
    planted = {5: (5, 16), 10: (6, 16), 15: (5, 19)}  # k -> (b1, b2): b1 moves 1, b2 moves 3
    profiles = {k: _knees_at(m, *cut) for k, cut in planted.items()}
    reg = regime_agreement(
        _rss_table(profiles),
        {"k": [5, 10, 15], "k_fraction": [0.05, 0.1, 0.15], "k_center": 10, "how": "test"},
        method="none",
    )
    for cut in reg["cuts"]:
        assert (cut["b1"], cut["b2"]) == planted[cut["k"]] == _kneed_cut(profiles[cut["k"]]), cut
        assert cut["b1_found"] and cut["b2_found"]
    assert (reg["b1_shift"], reg["b2_shift"], reg["max_shift"]) == (1, 3, 3) and reg["reason"] == ""
    same = regime_agreement(
        _rss_table({5: profiles[5], 10: profiles[5]}), {"k": [5, 10], "k_fraction": [0.05, 0.1]}, method="none"
    )
    assert same["max_shift"] == 0
    one = regime_agreement(_rss_table({5: profiles[5]}), {"k": [5], "k_fraction": [0.05]}, method="none")
    assert one["max_shift"] == 0 and "one k" in one["reason"]
    with pytest.raises(ValueError, match="k=7"):
        regime_agreement(_rss_table({5: profiles[5]}), {"k": [7], "k_fraction": [0.07]})


def test_middle_regime_is_the_compromise_point_and_its_neighbours():
    import pandas as pd

    from resdyn.study_b.phases import middle_regime

    # study B's grid; energy rises and visibility falls with k (all on the frontier)
    frac = [0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5]
    energy = [0.05, 0.1, 0.3, 0.62, 0.75, 0.82, 0.9, 1.0]
    vis = [0.9, 0.88, 0.8, 0.6, 0.4, 0.3, 0.2, 0.1]
    t = pd.DataFrame(
        {"k_fraction": frac, "k": [round(100 * f) for f in frac], "energy": energy, "visibility": vis, "pareto": True}
    )
    # by hand: normalised distances to (1, 1); the smallest is at k = 10
    e = (np.array(energy) - 0.05) / 0.95
    v = (np.array(vis) - 0.1) / 0.8
    assert int(np.argmin(np.hypot(1 - e, 1 - v))) == 3
    reg = middle_regime(t)
    assert reg["k"] == [5, 10, 15] and reg["k_fraction"] == [0.05, 0.1, 0.15] and reg["k_center"] == 10
    assert "k = 10" in reg["how"]
    # every k on the frontier: the frontier selects nothing, and the regime says so
    assert reg["frontier_selects"] is False and "selects no k" in reg["how"]
    # off-frontier rows never count; at the frontier's end the regime is shorter
    t.loc[t.k == 5, "pareto"] = False
    assert middle_regime(t)["k"] == [2, 10, 15]
    assert middle_regime(t)["frontier_selects"] is True and "selects no k" not in middle_regime(t)["how"]
    assert middle_regime(t.iloc[[0]])["k"] == [1]
    with pytest.raises(ValueError, match="no Pareto-frontier row"):
        middle_regime(t.assign(pareto=False))
    with pytest.raises(ValueError, match=r"lacks columns \['pareto'\]"):
        middle_regime(t.drop(columns="pareto"))


def test_regime_round_trips_through_phases_json():
    from resdyn.study_b.phases import Cutpoints, regime_agreement

    y = _knees_at(24, 5, 16)
    reg = regime_agreement(_rss_table({5: y, 10: y}), {"k": [5, 10], "k_fraction": [0.05, 0.1]}, method="none")
    js = json.loads(json.dumps(cutpoints(y).at_k(10, 0.1).with_regime(reg).to_json(), allow_nan=False))
    assert js["regime"]["max_shift"] == 0
    back = Cutpoints.from_json(js)
    assert back.regime == js["regime"] and back.to_json() == js
    js["regime"]["b2_shift"] = -1
    with pytest.raises(ValueError, match="regime.b2_shift"):
        Cutpoints.from_json(js, source="x/phases.json")
