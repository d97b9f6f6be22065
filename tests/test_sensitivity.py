"""resdyn.beyond.sensitivity: every open choice computed both ways, on planted tables where a choice
flips a verdict and where it does not; the alternatives it computes checked against oracles."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest

from resdyn import artifacts as A
from resdyn.beyond import sensitivity as S
from resdyn.beyond import verdicts as vd
from resdyn.pipeline import config as rc
from resdyn.study_a import spectral

from helpers.paper_tables import FINAL, planted

CLAIMS = A.ClaimsTable.load()
DEFAULTS = {c: opts[0] for c, opts in S.CHOICES.items()}


def rows_of(table: pd.DataFrame, choice: str, claim: str) -> pd.DataFrame:
    return table[(table.choice == choice) & (table.claim == claim)].reset_index(drop=True)


def options_of(t, **over):
    """Every choice's options of one planted model; ``over`` replaces a choice's options."""
    out = {
        "single_layer_baseline": {"P_1": t, "P_0": t},
        "readout_matrix": {"I_plus_W": t, "W": "no lens in this planted run"},
        "boundary_rule": {"min_other_2": t, "min_other_1": "no partitions in this planted run"},
        "complex_rule": S.complex_options(t),
        "erank_weights": S.erank_options(t),
        "jacobian_product": S.product_options(t, "no per-sample Jacobians in this planted run"),
    }
    return out | over


def test_verdict_change_rules():
    held, failed, untested = ({"verdict": v} for v in ("holds: x", "does not hold: y", "not testable: z"))
    assert S.verdict_change(held, held, True) == "default"
    assert S.verdict_change(held, held, False) == "no"
    assert S.verdict_change(held, failed, False) == "yes: holds → does not hold"
    assert S.verdict_change(untested, untested, False) == "no: not testable under either option"
    assert S.verdict_change(held, untested, False) == "not known: not testable under this option"
    assert S.verdict_change(untested, held, False) == "not known: not testable under the default"


def test_complex_rule_flips_where_the_two_shares_disagree():
    """Planted: the beyond-noise share is rotational early (holds), the tolerance share the reverse."""
    t = planted(True, rule="beyond_noise")
    ck = t.checkpoints
    tol = ck.groupby("ckpt", sort=False)["complex_frac_beyond_noise"].transform(lambda v: v.to_numpy()[::-1])
    t.checkpoints = ck.assign(**{"complex_frac_J_tol1e-06": tol})
    out = S.sensitivity_table(CLAIMS, [options_of(t)], DEFAULTS)
    r = rows_of(out, "complex_rule", "rotational_early_symmetric_late")
    # two measures (symmetry index: the rule does not move it; complex share: it flips)
    assert r.option.tolist() == ["beyond_noise", "tolerance"] * 2 and r["default"].tolist() == [True, False] * 2
    assert r.verdict_changes.tolist() == ["default", "no", "default", "yes: holds → does not hold"]
    assert r.value.iloc[3] == pytest.approx(-r.value.iloc[2])
    # where both shares agree nothing changes
    same = planted(True, rule="beyond_noise")
    same.checkpoints = same.checkpoints.assign(
        **{"complex_frac_J_tol1e-06": same.checkpoints["complex_frac_beyond_noise"]}
    )
    r = rows_of(S.sensitivity_table(CLAIMS, [options_of(same)], DEFAULTS), "complex_rule", "complex_share_early")
    assert r.verdict_changes.tolist() == ["default", "no"] and r.value.iloc[0] == r.value.iloc[1]


def test_single_layer_baseline_at_the_study_width():
    """d = 4096: P_0 is planted at 436 (holds), P_1 at 30 (does not)."""
    t = planted(True, d=4096)
    t.bottleneck = {FINAL: pd.DataFrame({"s": range(4), "erank": [436.0, 30.0, 12.0, 5.0]})}
    r = rows_of(S.sensitivity_table(CLAIMS, [options_of(t)], DEFAULTS), "single_layer_baseline", "erank_single_layer")
    assert r.option.tolist() == ["P_1", "P_0"] and r.value.tolist() == [30.0, 436.0]
    assert r.verdict.iloc[0].startswith(vd.FAILS) and r.verdict.iloc[1].startswith(vd.HOLDS)
    assert r.verdict_changes.iloc[1] == "yes: does not hold → holds"
    # at another width neither is tested: the values are given, the verdict cannot change
    r = rows_of(
        S.sensitivity_table(CLAIMS, [options_of(planted(True))], DEFAULTS),
        "single_layer_baseline",
        "erank_single_layer",
    )
    assert r.value.tolist() == [30.0, 40.0] and r.verdict_changes.iloc[1] == "no: not testable under either option"


def test_erank_on_sigma_squared():
    """Planted: the σ erank collapses from step 0 to the final checkpoint, the σ² erank does not."""
    t = planted(True)
    t.checkpoints = t.checkpoints.assign(cum_erank_energy=4.0)
    b = t.bottleneck[FINAL]
    t.bottleneck = {FINAL: b.assign(erank_energy=b["erank"] / 2)}
    out = S.sensitivity_table(CLAIMS, [options_of(t)], DEFAULTS)
    r = rows_of(out, "erank_weights", "collapse_learned")
    assert (
        r.value.tolist() == pytest.approx([1.0 / 6.0, 1.0])
        and r.verdict_changes.iloc[1] == "yes: holds → does not hold"
    )
    r = rows_of(out, "erank_weights", "erank_full_depth")
    assert r.value.tolist() == [5.0, 2.5]
    # a run without the σ² column: the option says why, never a blank
    r = rows_of(S.sensitivity_table(CLAIMS, [options_of(planted(True))], DEFAULTS), "erank_weights", "collapse_learned")
    assert (
        math.isnan(r.value.iloc[1])
        and "erank_energy" in r.reason.iloc[1]
        and r.verdict.iloc[1].startswith("not testable")
    )


def _explicit_mean_of_products(stacks):
    """Oracle: the unrescaled products of every sample, averaged."""
    P = None
    for Js in stacks:
        P = Js.copy() if P is None else np.einsum("nij,njk->nik", Js, P)
    return P.mean(axis=0)


def test_mean_of_products_bottleneck_against_explicit_products():
    rng = np.random.default_rng(0)
    stacks = [rng.standard_normal((5, 6, 6)) * (1.0 + 0.5 * s) for s in range(6)]
    jac = {(s // 2, spectral.KINDS[s % 2]): stacks[s] for s in range(6)}
    got = spectral.mean_of_products_bottleneck(jac)
    assert got["n"].tolist() == [5] * 6 and got["s"].tolist() == list(range(6))
    for s in range(6):
        M = _explicit_mean_of_products(stacks[: s + 1])
        Q = np.linalg.multi_dot([st.mean(axis=0) for st in stacks[: s + 1][::-1]]) if s else stacks[0].mean(axis=0)
        assert got["erank_mean_of_products"].iloc[s] == pytest.approx(
            spectral.effective_rank(np.linalg.svd(M, compute_uv=False)), rel=1e-9
        )
        assert got["erank_product_of_means"].iloc[s] == pytest.approx(
            spectral.effective_rank(np.linalg.svd(Q, compute_uv=False)), rel=1e-9
        )
    # one sample: the mean of products is the product of means
    one = spectral.mean_of_products_bottleneck({k: v[:1] for k, v in jac.items()})
    np.testing.assert_allclose(one["erank_mean_of_products"], one["erank_product_of_means"], rtol=1e-9)
    with pytest.raises(ValueError, match=r"\(n, d, d\)"):
        spectral.mean_of_products_bottleneck({(0, "attn"): np.eye(3), (0, "mlp"): np.eye(3)})


def test_product_options_in_the_table():
    """Planted: two samples whose own products vanish while the product of their means does not."""
    a, b = np.diag([1.0, 0.0]), np.diag([0.0, 1.0])
    first_n = spectral.mean_of_products_bottleneck({(0, "attn"): np.stack([a, b]), (0, "mlp"): np.stack([b, a])})
    t = planted(True)
    out = S.sensitivity_table(CLAIMS, [options_of(t, jacobian_product=S.product_options(t, first_n))], DEFAULTS)
    r = rows_of(out, "jacobian_product", "erank_full_depth")
    assert r.option.tolist() == list(S.CHOICES["jacobian_product"])
    assert r.value.tolist() == [5.0, 2.0, 0.0]  # the run's own, then the first-n product of means and mean of products
    r = rows_of(out, "jacobian_product", "erank_single_layer")
    assert len(r) == 6 and r.value.iloc[3:].tolist() == [40.0, 2.0, 2.0]  # P_0 rows


def test_boundary_coupling_reads_either_rule_back():
    """Gains 3 for units reaching ≥ 2 other communities, 1 for the rest (10 with one, 20 with none):
    under ≥ 2 the log median ratio is log 3; under ≥ 1 the boundary holds 10 units at 3 and 10 at 1
    (median 2) against an interior at 1: log 2."""
    d = 40
    n_other = np.array([2] * 10 + [1] * 10 + [0] * 20)
    gains = np.where(n_other >= 2, 3.0, 1.0)
    part = pd.concat(
        pd.DataFrame(
            {
                "unit": np.arange(d),
                "community": 0,
                "participation": 0.0,
                "is_boundary": n_other >= 2,
                "n_other_communities": n_other,
                "layer": 0,
                "boundary": b,
            }
        )
        for b in ("pre_attn", "pre_mlp")
    )
    jac = {(0, "attn"): np.diag(gains), (0, "mlp"): np.diag(gains)}
    spectra = pd.DataFrame({"layer": [0, 0], "kind": ["attn", "mlp"], "henrici": [0.1, 0.2]})
    for k, want in ((2, math.log(3.0)), (1, math.log(2.0))):
        final, counts = S.boundary_coupling(
            {"step0": part, "final": part},
            {"step0": jac, "final": jac},
            {"step0": spectra, "final": spectra},
            k,
            "J",
            0.05,
        )
        assert final["effect_log_median_ratio"].tolist() == pytest.approx([want, want])
        assert final["n_boundary"].tolist() == [int((n_other >= k).sum())] * 2
        assert counts["ckpt"].tolist() == ["step0", "final"]
    with pytest.raises(ValueError, match="n_other_communities"):
        S.boundary_coupling({"f": part.drop(columns="n_other_communities")}, {"f": jac}, {"f": spectra}, 1, "J", 0.05)


def test_readout_phases_of_w_are_those_of_i_plus_w_shifted():
    """W's phases equal the I + W phases of translators A − I (the option only moves the identity),
    and the configured option's tables are the run's own."""
    rng = np.random.default_rng(1)
    As = [np.eye(12) + rng.standard_normal((12, 12)) * (0.3 + 0.1 * L) for L in range(8)]
    kw = dict(k_fractions=[0.1, 0.25, 0.5], phase_k_fraction=0.25, window=3, smoothing="moving_average")
    w = S.readout_phases(As, "W", **kw)
    shifted = S.readout_phases([A - np.eye(12) for A in As], "I_plus_W", **kw)
    assert w == shifted and {"b1", "b2", "regime", "smoothed"} <= set(w)
    assert S.readout_phases(As, "I_plus_W", **kw) != w
    t = planted(True)
    opts = S.readout_options(t, "W", w)
    assert opts["I_plus_W"] is t and opts["W"].phases["b1"] == w["b1"]
    assert set(opts["W"].phase_metrics["metric"]) >= {"hidden_erank", "update_erank"}


def test_readout_choice_moves_phase_statements_and_width_slopes():
    """Planted: under W the cut moves so that phase 1 holds every layer; the statements read at the new
    cut, and the width slopes come from the W fits."""
    t = planted(True)
    w = copy.deepcopy(t.phases) | {"b1": 6, "b2": 7, "peak": 6}
    fits = {
        "I_plus_W": pd.DataFrame(
            [
                {
                    "group": "g",
                    "phase": 2,
                    "status": "ok",
                    "slope": 0.8,
                    "slope_ci_low": 0.7,
                    "slope_ci_high": 0.9,
                    "n_fallback": 0,
                }
            ]
        ),
        "W": pd.DataFrame(
            [
                {
                    "group": "g",
                    "phase": 2,
                    "status": "ok",
                    "slope": 0.1,
                    "slope_ci_low": 0.0,
                    "slope_ci_high": 0.2,
                    "n_fallback": 1,
                }
            ]
        ),
    }
    out = S.sensitivity_table(
        CLAIMS,
        [options_of(t, readout_matrix=S.readout_options(t, "W", w))],
        DEFAULTS,
        group_fits=fits,
        groups={"g": ["a", "b", "c"]},
    )
    r = rows_of(out, "readout_matrix", "rss_rises_phase1")
    assert r.verdict_changes.tolist() == ["default", "no"] and r.value.iloc[0] != r.value.iloc[1]
    r = rows_of(out, "readout_matrix", "phase2_width_slope")
    assert r.value.tolist() == [0.8, 0.1] and r.verdict_changes.iloc[1] == "yes: holds → does not hold"
    assert "1 width(s) from Kneedle fallback cuts left out" in r.measure.iloc[1]


def test_table_is_complete_and_valid_and_says_why():
    out = S.sensitivity_table(CLAIMS, [options_of(planted(True))], DEFAULTS)
    A.SensitivityTable.validate(out, "sensitivity.tsv")
    assert set(out.choice) == set(S.CHOICES)
    assert (out.value.notna() | (out.reason != "")).all() and (out.verdict_changes != "").all()
    for choice, opts in S.CHOICES.items():
        sub = out[out.choice == choice]
        assert set(sub.option) == set(opts) and set(sub[sub["default"]].option) == {DEFAULTS[choice]}
        assert set(sub.claim) == set(S.HEADLINES[choice])
    r = out[(out.choice == "boundary_rule") & (out.option == "min_other_1")]
    assert (r.reason == "no partitions in this planted run").all() and r.value.isna().all()
    # a study switched off: one row per option saying so
    only_a = S.sensitivity_table(CLAIMS, [options_of(planted(True))], DEFAULTS, studies=["A"])
    r = only_a[only_a.choice == "readout_matrix"]
    assert len(r) == 2 and r.reason.str.startswith("study B is not run").all()


@pytest.mark.parametrize(
    "section, key, value, allowed",
    [
        ("readout", "matrix", "V", "['I_plus_W', 'W']"),
        ("topology", "boundary_min_other", 3, "[1, 2]"),
        ("spectra", "complex_rule", "both", "['beyond_noise', 'tolerance']"),
    ],
)
def test_unknown_choice_value_is_refused_in_one_line(root, section, key, value, allowed):
    cfg = rc.read_yaml(root / "configs" / "smoke.yaml")
    cfg.setdefault(section, {})[key] = value
    with pytest.raises(rc.ConfigError) as err:
        rc.validate_config(cfg, root)
    lines = [line for line in str(err.value).splitlines() if f"{section}.{key}" in line]
    assert len(lines) == 1 and repr(value) in lines[0] and allowed in lines[0]


def test_costly_options_are_left_out_with_their_estimate():
    """An option above config sensitivity.max_gflop is not computed; its rows carry the estimate."""
    assert S.product_gflop(16, 64, 4096) == pytest.approx(64 * 40 * 4096**3 / 1e9)
    assert S.readout_gflop(33, 4096) == pytest.approx(33 * 44 * 4096**3 / 1e9)
    assert S.over_budget(S.product_gflop(2, 12, 32), 1000.0, "x") == ""
    why = S.over_budget(S.product_gflop(16, 64, 4096), 1000.0, "the mean of the first n samples' products")
    assert why.startswith("the mean of the first n samples' products is not computed: about ")
    assert why.endswith("GFLOP > sensitivity.max_gflop 1000")
    t = planted(True)
    out = S.sensitivity_table(CLAIMS, [options_of(t, jacobian_product=S.product_options(t, why))], DEFAULTS)
    r = out[(out.choice == "jacobian_product") & (out.option != "product_of_means")]
    assert len(r) == 6 and (r.reason == why).all() and r.value.isna().all()
