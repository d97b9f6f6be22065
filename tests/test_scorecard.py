"""resdyn.beyond.scorecard: synthetic tables where each claim holds, fails or cannot be tested."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from resdyn.beyond import bootstrap as bs
from resdyn.beyond import scorecard as sc

COL = "complex_frac_J_tol1e-06"
S = 12  # sublayers: early third s 0-3, late third s 8-11


def ckpt_rows(
    ckpt: str, cf_early: float, cf_late: float, erank_end: float, n_sig: int, rho: float = -0.6, p: float = 0.01
) -> list[dict]:
    rows = []
    for s in range(S):
        cf = cf_early if s < 4 else (cf_late if s >= 8 else 0.5 * (cf_early + cf_late))
        rows.append(
            {
                "ckpt": ckpt,
                "layer": s // 2,
                "kind": ("attn", "mlp")[s % 2],
                "s": s,
                COL: cf,
                "henrici": 0.2 if s < 4 else 0.05,
                "cum_erank": 32.0 - (32.0 - erank_end) * s / (S - 1),
                "n_significant_layers": n_sig,
                "n_layers": 6,
                "sign_dependence_rho": rho,
                "sign_dependence_p": p,
            }
        )
    return rows


def checkpoints(*specs) -> pd.DataFrame:
    return pd.DataFrame([r for spec in specs for r in ckpt_rows(*spec)])


def schur(e_alpha1: float, e_alpha0: float, start: float = 32.0) -> pd.DataFrame:
    rows = []
    for alpha, end in ((0.0, e_alpha0), (0.5, 0.5 * (e_alpha0 + e_alpha1)), (1.0, e_alpha1)):
        for s in range(S):
            rows.append({"alpha": alpha, "s": s, "erank": start - (start - end) * s / (S - 1)})
    return pd.DataFrame(rows)


def phases_for(profile, **cut) -> dict:
    return {"n": len(profile), "smoothed": list(profile), "profile": list(profile), "k": 4, "reason": "", **cut}


THREE_PHASES = [0.2, 0.5, 0.8, 0.9, 0.92, 0.93, 0.92, 0.9, 0.8, 0.5, 0.2]


def lens_metrics(kl_tuned: float, kl_logit: float, n: int = 9) -> pd.DataFrame:
    rows = []
    for lens, kl in (("tuned", kl_tuned), ("logit", kl_logit)):
        for L in range(n + 1):
            rows.append({"lens": lens, "layer": L, "kl": kl if L < n else 0.0, "hit1": 0.9 if lens == "tuned" else 0.4})
    return pd.DataFrame(rows)


def widths(status: str = "ok", slope: float = 0.8, lo: float = 0.5, hi: float = 1.1, n_depths: int = 3) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "phase": 1,
                "status": status,
                "slope": 0.1,
                "slope_ci_low": -0.2,
                "slope_ci_high": 0.4,
                "n_depths": n_depths,
                "group": "g",
            },
            {
                "phase": 2,
                "status": status,
                "slope": slope,
                "slope_ci_low": lo,
                "slope_ci_high": hi,
                "n_depths": n_depths,
                "group": "g",
            },
        ]
    )


def verdicts(table: pd.DataFrame) -> dict[str, str]:
    return dict(zip(table["claim_id"], table["verdict"]))


def test_every_claim_holds():
    t = sc.scorecard(
        checkpoints(("step0", 0.5, 0.5, 31.0, 0), ("step500", 0.8, 0.5, 20.0, 3), ("step1000", 0.9, 0.1, 4.0, 7)),
        ["step0", "step500", "step1000"],
        schur_final=schur(e_alpha1=4.0, e_alpha0=20.0),
        phases=phases_for(THREE_PHASES, b1=2, peak=5, b2=8, b1_found=True, b2_found=True),
        lens_metrics=lens_metrics(0.1, 1.0),
        phase_widths=widths(),
        group="g",
    )
    assert list(t.columns) == sc.SCORECARD_COLUMNS
    assert list(t["claim_id"]) == list(sc.CLAIMS)
    assert set(verdicts(t).values()) == {"holds"}, t[["claim_id", "verdict", "reason"]]
    by = t.set_index("claim_id")
    assert by.loc["rotational_gradient", "value"] == pytest.approx(0.8)
    assert by.loc["gradient_learned", "value"] == pytest.approx(0.8)
    assert by.loc["collapse_learned", "value"] == pytest.approx(-27.0)
    assert by.loc["schur_dissolves_collapse", "value"] == pytest.approx(5.0)
    assert by.loc["coupling_grows", "value"] == 7.0
    assert by.loc["coupling_sign", "value"] == -0.6
    assert by.loc["rss_three_phases", "value"] == 1.0
    assert by.loc["tuned_beats_logit_early", "value"] == pytest.approx(10.0)
    assert by.loc["phase2_width_grows", "value"] == 0.8
    assert (by.loc["phase2_width_grows", "ci_low"], by.loc["phase2_width_grows", "ci_high"]) == (0.5, 1.1)
    assert by.loc["coupling_grows", "study_value"].startswith("0 FDR-significant layers (OLMo 3 7B, step 0)")
    assert by.loc["coupling_grows", "detail"].endswith(" layers")


def test_every_claim_fails():
    t = sc.scorecard(
        checkpoints(("step0", 0.8, 0.1, 4.0, 7, 0.5, 0.01), ("step1000", 0.2, 0.6, 30.0, 2, 0.5, 0.01)),
        ["step0", "step1000"],
        schur_final=schur(e_alpha1=4.0, e_alpha0=5.0),
        phases=phases_for(THREE_PHASES, b1=2, peak=5, b2=5, b1_found=True, b2_found=False),
        lens_metrics=lens_metrics(0.5, 0.6),
        phase_widths=widths(slope=-0.3, lo=-0.6, hi=-0.1),
        group="g",
    )
    assert set(verdicts(t).values()) == {"does not hold"}, t[["claim_id", "verdict", "reason"]]
    by = t.set_index("claim_id")
    assert "no knee found for b2" in by.loc["rss_three_phases", "reason"]
    assert "not < 0" in by.loc["coupling_sign", "reason"]


def test_point_estimate_in_the_claimed_direction_but_interval_not():
    # coupling sign: rho < 0 but not significant; scaling: slope > 0 but CI includes 0
    t = sc.scorecard(
        checkpoints(("step0", 0.5, 0.5, 31.0, 0, -0.3, 0.4)),
        ["step0"],
        phase_widths=widths(slope=0.4, lo=-0.1, hi=0.9),
        group="g",
    )
    by = t.set_index("claim_id")
    assert by.loc["coupling_sign", "verdict"] == "does not hold" and "p 0.4" in by.loc["coupling_sign", "reason"]
    assert by.loc["phase2_width_grows", "verdict"] == "does not hold"
    assert "includes 0" in by.loc["phase2_width_grows", "reason"]


def test_counts_that_dip_do_not_grow():
    t = sc.scorecard(
        checkpoints(("a", 0.5, 0.5, 30, 2), ("b", 0.5, 0.5, 30, 0), ("c", 0.5, 0.5, 30, 5)), ["a", "b", "c"]
    )
    row = t.set_index("claim_id").loc["coupling_grows"]
    assert row["verdict"] == "does not hold" and "decrease" in row["reason"]


def test_untestable_claims_say_why():
    t = sc.scorecard(
        checkpoints(("step30", 0.5, 0.5, 31.0, 1, np.nan, np.nan)),
        ["step30"],
        schur_final=schur(e_alpha1=31.0, e_alpha0=31.5),
        phases=phases_for([0.6, 0.58, 0.62, 0.69, 0.70], b1=0, peak=4, b2=4, b1_found=True, b2_found=False),
        lens_metrics=None,
        phase_widths=widths(status="too_few_depths", slope=np.nan, lo=np.nan, hi=np.nan, n_depths=1),
        group="g",
    )
    by = t.set_index("claim_id")
    untestable = {c for c, v in verdicts(t).items() if v == "not testable"}
    assert untestable == {
        "gradient_learned",
        "collapse_learned",
        "schur_dissolves_collapse",
        "coupling_grows",
        "coupling_sign",
        "rss_three_phases",
        "tuned_beats_logit_early",
        "phase2_width_grows",
    }
    assert by.loc["gradient_learned", "reason"] == "only one checkpoint"
    assert by.loc["collapse_learned", "reason"] == "only one checkpoint"
    assert by.loc["coupling_grows", "reason"] == "only one checkpoint"
    assert by.loc["phase2_width_grows", "reason"] == "fewer than 3 depths"
    assert "no collapse to dissolve" in by.loc["schur_dissolves_collapse", "reason"]
    assert "5 points" in by.loc["rss_three_phases", "reason"]
    assert "rho undefined" in by.loc["coupling_sign", "reason"]
    assert by.loc["tuned_beats_logit_early", "reason"] == "no lens_metrics.tsv"
    # the one claim the single checkpoint can decide: a flat complex-fraction profile fails
    assert by.loc["rotational_gradient", "verdict"] == "does not hold"
    assert (
        sc.scorecard(None, ["x"], group=None).set_index("claim_id").loc["phase2_width_grows", "reason"]
        == "the model is in no scaling group"
    )


def test_missing_tolerance_column_is_untestable():
    ck = checkpoints(("a", 0.9, 0.1, 4.0, 1)).rename(columns={COL: "complex_frac_J_tol1e-03"})
    row = sc.scorecard(ck, ["a"]).set_index("claim_id").loc["rotational_gradient"]
    assert row["verdict"] == "not testable" and "complex_frac_J_tol1e-06" in row["reason"]


def test_multiple_prominent_peaks_fail_unimodality():
    twin = [0.1, 0.5, 0.9, 0.5, 0.2, 0.5, 0.9, 0.5, 0.1]
    row = (
        sc.scorecard(None, ["a"], phases=phases_for(twin, b1=1, peak=2, b2=7, b1_found=True, b2_found=True))
        .set_index("claim_id")
        .loc["rss_three_phases"]
    )
    assert row["verdict"] == "does not hold" and row["value"] == 2.0 and "not unimodal" in row["reason"]


# ---------------------------------------------------------------- intervals from the bootstrap


def _boot(per_sample, seed=0, R=60):
    return bs.jacobian_bootstrap(per_sample, n_resamples=R, seed=seed)


def test_bootstrap_intervals_are_attached_and_paired():
    rng = np.random.default_rng(0)
    n, d = 4, 4
    keys = [(L, k) for L in range(2) for k in ("attn", "mlp")]
    per0 = {key: np.eye(d) + 0.05 * rng.standard_normal((n, d, d)) for key in keys}
    per1 = {key: 0.3 * np.eye(d) + 0.05 * rng.standard_normal((n, d, d)) for key in keys}
    (b0, r0), (b1, r1) = _boot(per0), _boot(per1)
    ck = checkpoints(("s0", 0.5, 0.5, 31.0, 0), ("s1", 0.9, 0.1, 4.0, 3))
    t = sc.scorecard(ck, ["s0", "s1"], bootstrap={"s0": b0, "s1": b1}, replicates={"s0": r0, "s1": r1})
    by = t.set_index("claim_id")
    row = b1[b1["metric"] == "complex_fraction_early_minus_late"].iloc[0]
    assert (by.loc["rotational_gradient", "ci_low"], by.loc["rotational_gradient", "ci_high"]) == (
        row["ci_low"],
        row["ci_high"],
    )
    assert by.loc["rotational_gradient", "ci_source"].startswith("bootstrap 60 resamples of 4/4 samples")
    # paired: replicate-wise difference of the two checkpoints' replicates
    a = r0[r0["metric"] == "cum_erank_full_depth"]["value"].to_numpy()
    b = r1[r1["metric"] == "cum_erank_full_depth"]["value"].to_numpy()
    lo, hi = bs.percentile_ci(b - a, 0.95)
    assert (by.loc["collapse_learned", "ci_low"], by.loc["collapse_learned", "ci_high"]) == (lo, hi)
    assert by.loc["collapse_learned", "ci_source"].startswith("paired bootstrap")
    # a different seed breaks the pairing: no interval, and the reason is given by the helper
    b2, r2 = _boot(per1, seed=1)
    ci, why, n_used = sc.paired_difference_ci(b0, r0, b2, r2, "cum_erank_full_depth", 0.95)
    assert ci is None and "seed" in why and n_used == 0
    t2 = sc.scorecard(ck, ["s0", "s1"], bootstrap={"s0": b0, "s1": b2}, replicates={"s0": r0, "s1": r2})
    assert np.isnan(t2.set_index("claim_id").loc["collapse_learned", "ci_low"])


def _straddling(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "metric": "complex_fraction_early_minus_late",
                "bootstrapped": True,
                "ci_low": -0.1,
                "ci_high": 0.4,
                "estimate": 0.2,
                "n_resamples": 100,
                "n_bootstrap_samples": n,
                "n_samples_total": 50,
                "level": 0.95,
            }
        ]
    )


def test_interval_that_straddles_zero_fails_the_claim():
    t = sc.scorecard(checkpoints(("a", 0.6, 0.4, 30, 1)), ["a"], bootstrap={"a": _straddling(sc.MIN_BOOTSTRAP_SAMPLES)})
    row = t.set_index("claim_id").loc["rotational_gradient"]
    assert row["verdict"] == "does not hold" and "includes 0" in row["reason"]


def test_interval_from_too_few_samples_is_reported_but_does_not_decide():
    n = sc.MIN_BOOTSTRAP_SAMPLES - 1
    t = sc.scorecard(checkpoints(("a", 0.6, 0.4, 30, 1)), ["a"], bootstrap={"a": _straddling(n)})
    row = t.set_index("claim_id").loc["rotational_gradient"]
    assert (row["ci_low"], row["ci_high"]) == (-0.1, 0.4)
    assert row["verdict"] == "holds" and f"only {n} samples" in row["reason"]


def test_validation():
    with pytest.raises(ValueError, match="ckpt_order is empty"):
        sc.scorecard(None, [])
    with pytest.raises(ValueError, match="level"):
        sc.scorecard(None, ["a"], level=1.5)


def test_scaling_group():
    cfg = {"scaling": {"groups": {"llama": ["l8", "l12"], "olmo": ["o8"]}}}
    assert sc.scaling_group(cfg, "l12") == "llama" and sc.scaling_group(cfg, "o8") == "olmo"
    assert sc.scaling_group(cfg, "x") is None and sc.scaling_group({"scaling": {}}, "l8") is None


@pytest.mark.parametrize("ran", [["A"], ["B"]])
def test_claims_of_a_study_not_run_say_not_run(ran, tmp_path):
    """The scorecard of a one-study run (config key studies): the tables of the other study are
    absent, and its claims say "not run" (not "not testable"); the claims that ran are unchanged."""
    a_claims = {
        "rotational_gradient",
        "gradient_learned",
        "collapse_learned",
        "schur_dissolves_collapse",
        "coupling_grows",
        "coupling_sign",
    }
    ck = checkpoints(("step0", 0.5, 0.5, 31.0, 0), ("step9", 0.9, 0.1, 4.0, 7))
    study_a = {"checkpoints": ck, "schur_final": schur(4.0, 20.0)}
    study_b = {
        "phases": phases_for(THREE_PHASES, b1=2, peak=5, b2=8, b1_found=True, b2_found=True),
        "lens_metrics": lens_metrics(0.1, 1.0),
        "phase_widths": widths(),
    }
    inputs = {**(study_a if "A" in ran else {"checkpoints": None}), **(study_b if "B" in ran else {})}
    t = sc.scorecard(ckpt_order=["step0", "step9"], group="g", studies=ran, **inputs)
    expected_not_run = set(sc.CLAIMS) - a_claims if ran == ["A"] else a_claims
    got = verdicts(t)
    assert {c for c, v in got.items() if v == "not run"} == expected_not_run
    assert {v for c, v in got.items() if c not in expected_not_run} == {"holds"}
    other = "B" if ran == ["A"] else "A"
    reasons = t.set_index("claim_id").loc[sorted(expected_not_run), "reason"]
    assert all(r == f"study {other} is not run (config studies: {ran})" for r in reasons)
    full = sc.scorecard(ckpt_order=["step0", "step9"], group="g", **study_a, **study_b)
    same = t.set_index("claim_id").drop(index=sorted(expected_not_run))
    pd.testing.assert_frame_equal(same, full.set_index("claim_id").loc[same.index])
    with pytest.raises(ValueError, match="studies"):
        sc.scorecard(None, ["a"], studies=["C"])


def test_scorecard_quotes_only_figures_of_the_claims_table():
    """Every number in a study_value is in the claims table's stated figures (a number the
    study never states, such as "≈45 at alpha = 0", must not be quoted as its value)."""
    import re

    from resdyn import artifacts as A

    claims = A.ClaimsTable.load()
    stated = " ".join(claims["stated_value"])
    t = sc.scorecard(None, ["step0"])
    quoted = " ".join(t["study_value"])
    numbers = re.findall(r"\d+(?:\.\d+)?", re.sub(r"\([^)]*\)", "", quoted))  # figures, not model names
    assert numbers and all(n in re.findall(r"\d+(?:\.\d+)?", stated) for n in numbers), (numbers, stated)
    assert "45" not in quoted and t.set_index("claim_id").loc["schur_dissolves_collapse", "study_value"] == ""
    for cid, ids in sc.STUDY_REFERENCES.items():
        assert cid in sc.CLAIMS and set(ids) <= set(claims["claim_id"]), cid
    # a scorecard figure the table lacks is refused, naming it
    with pytest.raises(ValueError, match="erank_full_depth"):
        sc.scorecard(None, ["step0"], claims=claims[claims.claim_id != "erank_full_depth"])


def test_coupling_grows_counts_layers_when_available():
    ck = checkpoints(("step0", 0.5, 0.5, 30, 4), ("step1000", 0.5, 0.5, 30, 9))
    ck["n_significant_layers"] = np.where(ck["ckpt"] == "step0", 0, 5)
    row = sc.scorecard(ck, ["step0", "step1000"]).set_index("claim_id").loc["coupling_grows"]
    assert row["value"] == 5.0 and "layers" in row["statistic"] and "boundaries" not in row["detail"]
