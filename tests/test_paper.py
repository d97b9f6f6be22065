"""resdyn.beyond.paper: the stated figures next to a run's numbers, computed on hand-made tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from resdyn import artifacts as A
from resdyn.beyond import paper
from resdyn.beyond.paper import ModelTables

CLAIMS = A.ClaimsTable.load()


def rows_of(table: pd.DataFrame, claim: str) -> pd.DataFrame:
    return table[table["claim"] == claim].reset_index(drop=True)


def coupling_counts() -> pd.DataFrame:
    # the CONTRACT of per-layer counts: int n_significant_layers, n_layers per checkpoint
    return pd.DataFrame(
        {
            "ckpt": ["step0", "step500", "step1000"],
            "n_significant": [0, 5, 9],
            "n_boundaries": 16,
            "n_significant_layers": [0, 3, 6],
            "n_layers": 8,
            "sign_dependence_rho": -0.5,
            "sign_dependence_p": 0.01,
            "model": "m",
        }
    )


def bottleneck(erank: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"s": range(len(erank)), "erank": erank})


def bootstrap_rows(metric: str, lo: float, hi: float) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "metric": [metric, "complex_fraction_early_minus_late"],
            "bootstrapped": [True, True],
            "ci_low": [lo, 0.1],
            "ci_high": [hi, 0.5],
            "n_bootstrap_samples": 20,
            "n_samples_total": 50,
        }
    )


def checkpoints_table(ckpt: str) -> pd.DataFrame:
    # 6 sublayers: first third s 0-1, last third s 4-5; two tolerances, the bootstrap's is 1e-06
    return pd.DataFrame(
        {
            "ckpt": ckpt,
            "s": range(6),
            "complex_frac_J_tol1e-09": [0.9] * 6,
            "complex_frac_J_tol1e-06": [0.5, 0.3, 0.2, 0.2, 0.1, 0.1],
        }
    )


def geometry(n: int, update_norm, hidden_erank) -> pd.DataFrame:
    g = pd.DataFrame(
        {
            "layer": range(n + 1),
            "state": ["h_L"] * n + ["output"],
            "update_norm": [*update_norm, np.nan],
            "hidden_erank": hidden_erank,
        }
    )
    return g


def phase_metrics_table(values: dict[str, tuple[float, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"phase": ph, "metric": m, "mean": v[ph - 1], "reason": "" if math.isfinite(v[ph - 1]) else "no layer"}
            for m, v in values.items()
            for ph in (1, 2, 3)
        ]
    )


def full_model() -> ModelTables:
    ck = "step1000"
    return ModelTables(
        model="m",
        ckpts=["step0", "step500", ck],
        lens_ckpt=ck,
        coupling_counts=coupling_counts(),
        bottleneck={ck: bottleneck([40.0, 30.0, 12.0, 5.0])},
        bootstrap={ck: bootstrap_rows("cum_erank_full_depth", 4.0, 6.5)},
        checkpoints=checkpoints_table(ck),
        # layers 0-1 phase 1, 2-4 phase 2, 5-7 phase 3 (b1 = 1, b2 = 4)
        phases={
            "b1": 1,
            "b2": 4,
            "regime": {
                "k": [3, 6, 10],
                "k_fraction": [0.05, 0.1, 0.15],
                "k_center": 6,
                "b1_shift": 1,
                "b2_shift": 2,
                "max_shift": 2,
                "reason": "",
            },
        },
        geometry=geometry(8, [1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 10.0, 20.0], [3, 4, 5, 9, 6, 5, 4, 3, 2]),
        phase_metrics=phase_metrics_table(
            {
                "update_erank": (5.0, 8.0, 2.0),
                "tuned_hit1": (0.1, 0.3, 0.8),
                "tuned_hit5_over_hit1": (3.0, 2.0, math.nan),
            }
        ),
    )


def test_stated_figures_next_to_hand_computed_values():
    t = paper.paper_comparison(CLAIMS, [full_model()], ["A", "B"])
    A.PaperComparison.validate(t, "paper_comparison.tsv")
    one = {c: rows_of(t, c) for c in t["claim"].unique()}
    r = one["erank_single_layer"].iloc[0]
    assert (r.run_value, r.ckpt, r.stated_value) == (40.0, "step1000", "≈436 (Llama 3.1 8B, final)")
    r = one["erank_full_depth"].iloc[0]
    assert (r.run_value, r.ci_low, r.ci_high) == (5.0, 4.0, 6.5) and "20 of 50 samples" in r.source_table
    # complex share: (0.5 + 0.3)/2 − (0.1 + 0.1)/2 at the bootstrap's tolerance, with its interval
    r = one["complex_share_early"].iloc[0]
    assert r.run_value == pytest.approx(0.3) and (r.ci_low, r.ci_high) == (0.1, 0.5) and "tol 1e-06" in r.measure
    # significant layers: first, middle and final checkpoints, from the per-layer columns
    got = [
        (c, rows_of(t, c).iloc[0].ckpt, rows_of(t, c).iloc[0].run_value)
        for c in ("significant_layers_step0", "significant_layers_mid", "significant_layers_final")
    ]
    assert got == [
        ("significant_layers_step0", "step0", 0.0),
        ("significant_layers_mid", "step500", 3.0),
        ("significant_layers_final", "step1000", 6.0),
    ]
    assert rows_of(t, "significant_layers_final").iloc[0].measure == "FDR-significant layers (of 8)"
    # update norm: max phase 3 (20) / mean phase 2 (2) = 10; the output row never counts
    assert one["update_norm_growth_phase3"].iloc[0].run_value == pytest.approx(10.0)
    assert one["update_erank_falls_phase3"].iloc[0].run_value == pytest.approx(2.0 / 8.0)
    r = one["hidden_erank_peaks_phase2"].iloc[0]
    assert r.run_value == 2.0 and "layer 3" in r.measure
    hits = one["hit_ratio_falls_phase3"]
    assert hits.run_value.tolist()[:3] == [0.1, 0.3, 0.8] and hits.unit.tolist()[0] == "share of tokens"
    assert np.isnan(hits.run_value.iloc[5]) and hits.reason.iloc[5] == "no layer"
    reg = one["middle_regime"]
    assert reg.run_value.tolist() == [10.0, 2.0] and reg.unit.tolist() == ["% of d", "layers"]
    # every empty number has a reason
    assert (t["run_value"].notna() | (t["reason"] != "")).all()


def test_missing_layer_counts_and_tables_give_reasons():
    m = full_model()
    m.coupling_counts = coupling_counts().drop(columns=["n_significant_layers", "n_layers"])
    m.bottleneck, m.geometry, m.phase_metrics = {}, None, None
    m.phases = {"b1": 1, "b2": 4}
    t = paper.paper_comparison(CLAIMS, [m], ["A", "B"])
    A.PaperComparison.validate(t, "paper_comparison.tsv")
    for c in ("significant_layers_step0", "significant_layers_mid", "significant_layers_final"):
        assert rows_of(t, c).reason.tolist() == [paper.NO_LAYER_COUNTS]
    assert rows_of(t, "erank_single_layer").reason.iloc[0] == "bottleneck.tsv not available"
    assert rows_of(t, "middle_regime").reason.tolist() == ["phases.json has no middle regime"] * 2
    assert t["run_value"].isna().sum() == (t["reason"] != "").sum()


def test_study_switched_off_unknown_claim_and_two_checkpoints():
    claims = pd.concat([CLAIMS, CLAIMS.iloc[[0]].assign(claim_id="not_a_claim")], ignore_index=True)
    m = full_model()
    m.ckpts = ["step0", "step1000"]
    t = paper.paper_comparison(claims, [m], ["A"])
    for c in CLAIMS[CLAIMS.study == "B"].claim_id:
        r = rows_of(t, c)
        assert len(r) == 1 and "study B is not run" in r.reason.iloc[0], c
    assert "has no comparison" in rows_of(t, "not_a_claim").reason.iloc[0]
    assert rows_of(t, "significant_layers_mid").reason.iloc[0] == "no checkpoint between the first and the final"


def test_slopes_one_row_per_group():
    widths = pd.DataFrame(
        [
            {
                "group": "g",
                "phase": p,
                "status": "ok",
                "slope": s,
                "slope_ci_low": s - 0.1,
                "slope_ci_high": s + 0.1,
                "reason": "",
            }
            for p, s in ((1, 0.2), (2, 0.8))
        ]
        + [
            {
                "group": "h",
                "phase": p,
                "status": "too_few_depths",
                "slope": np.nan,
                "slope_ci_low": np.nan,
                "slope_ci_high": np.nan,
                "reason": "too_few_depths: 1 depth(s)",
            }
            for p in (1, 2)
        ]
    )
    t = paper.paper_comparison(CLAIMS, [full_model()], ["B"], widths, {"g": ["a", "b", "c"], "h": ["d"]})
    r = rows_of(t, "phase2_width_slope")
    assert r.model.tolist() == ["g", "h"] and r.run_value.iloc[0] == 0.8
    assert (r.ci_low.iloc[0], r.ci_high.iloc[0]) == pytest.approx((0.7, 0.9))
    assert r.reason.iloc[1].startswith("too_few_depths")
    none = paper.paper_comparison(CLAIMS, [full_model()], ["B"])
    assert rows_of(none, "phase1_width_slope").reason.iloc[0] == "no scaling group in config scaling.groups"
