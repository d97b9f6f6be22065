"""resdyn.beyond.paper: the studies' statements next to a run's numbers, with verdicts, on planted tables.

Two planted runs: in ``planted(True)`` every testable statement holds, in ``planted(False)``
every one does not; the statements that no run of this size can test (setup figures,
magnitudes of other models) are not testable in both.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from resdyn import artifacts as A
from resdyn.beyond import paper
from resdyn.beyond import verdicts as vd

from helpers.paper_tables import FINAL, planted, widths

CLAIMS = A.ClaimsTable.load()
#: rows not testable in any planted run (the value is reported, the verdict says why)
UNTESTABLE_HERE = {
    "n_samples",
    "resolution_range",
    "erank_single_layer",
    "erank_full_depth",
    "significant_layers_mid",
    "significant_layers_final",
}


def rows_of(table: pd.DataFrame, claim: str) -> pd.DataFrame:
    return table[table["claim"] == claim].reset_index(drop=True)


def table(ok: bool, **kw) -> pd.DataFrame:
    t = paper.paper_comparison(CLAIMS, [planted(ok, **kw)], ["A", "B"], widths(ok), {"g": ["a", "b", "c"]})
    A.PaperComparison.validate(t, "paper_comparison.tsv")
    return t


@pytest.mark.parametrize("rule", ["tolerance", "beyond_noise"])
@pytest.mark.parametrize("ok", [True, False])
def test_every_testable_statement_holds_or_fails_as_planted(ok, rule):
    t = table(ok, rule=rule)
    assert set(t["claim"]) == set(CLAIMS["claim_id"])
    want = vd.HOLDS if ok else vd.FAILS
    for r in t.itertuples():
        untestable = r.claim in UNTESTABLE_HERE or "largest shift" in r.measure
        expected = vd.UNTESTABLE if untestable else want
        assert r.verdict.split(":")[0] == expected, (r.claim, r.measure, r.verdict)
    # every empty number has a reason, every row a verdict
    assert (t["run_value"].notna() | (t["reason"] != "")).all() and (t["verdict"] != "").all()


def test_values_behind_the_verdicts():
    t = table(True)
    one = {c: rows_of(t, c) for c in t["claim"].unique()}
    assert one["complex_share_early"].run_value.iloc[0] == pytest.approx(0.98)
    r = one["rotational_early_symmetric_late"]
    assert r.run_value.tolist() == pytest.approx([1.1 - 0.25, 0.98 - 0.1]) and r.ci_low.iloc[1] == 0.5
    # the single-layer baseline: P_1 first (default), P_0 beside it
    r = one["erank_single_layer"]
    assert r.run_value.tolist() == [30.0, 40.0] and "P_1" in r.measure.iloc[0]
    assert "d = 4096" in r.verdict.iloc[0] and "d = 8" in r.verdict.iloc[0]
    assert one["collapse_learned"].run_value.iloc[0] == pytest.approx(1.0 / 6.0)
    assert one["collapse_not_architectural"].run_value.iloc[0] == pytest.approx(0.75)
    assert one["schur_dissolves"].run_value.iloc[0] == pytest.approx(8.0)
    # coupling classes: 8 boundaries each, mean effect ±0.515
    r = one["coupling_amplified_symmetric"].iloc[0]
    assert r.run_value == pytest.approx(0.515) and "8 boundaries" in r.measure
    assert one["coupling_attenuated_nonnormal"].run_value.iloc[0] == pytest.approx(-0.515)
    got = [rows_of(t, c).run_value.iloc[0] for c in ("significant_layers_step0", "significant_layers_final")]
    assert got == [0.0, 6.0] and "of" not in rows_of(t, "significant_layers_final").stated_value.iloc[0]
    assert one["coupling_emerges_monotonically"].verdict.iloc[0] == "holds: 0 → 3 → 6"
    assert one["update_norm_growth_phase3"].run_value.iloc[0] == pytest.approx(10.0)
    assert one["hidden_erank_peaks_phase1"].run_value.iloc[0] == 1.0
    assert one["update_erank_peaks_phase2"].run_value.iloc[0] == 2.0
    assert one["hit1_phase2"].run_value.iloc[0] == 0.55 and one["logit_hit1_phase3"].run_value.iloc[0] == 0.4
    assert one["rss_rises_phase1"].run_value.iloc[0] == pytest.approx(0.3)
    assert one["middle_regime"].run_value.tolist() == [10.0, 1.0]
    assert one["phase2_width_slope"].ci_low.iloc[0] == pytest.approx(0.7)


def test_stated_phases_are_the_studies():
    by = CLAIMS.set_index("claim_id")
    assert "near the end of phase 1" in by.at["hidden_erank_peaks_phase1", "stated_value"]
    assert "56%" in by.at["hit1_phase2", "stated_value"] and "phase 2" in by.at["hit_ratio_falls_phase2", "statement"]
    assert by.at["complex_share_early", "stated_value"] == "about 98%"
    assert by.at["significant_layers_final", "stated_value"] == "24"
    for gone in ("hidden_erank_peaks_phase2", "hit_ratio_falls_phase3"):
        assert gone not in by.index


def test_magnitudes_are_tested_at_the_study_width():
    t = table(True, d=4096)
    r = rows_of(t, "erank_single_layer")
    assert r.verdict.iloc[0].startswith(vd.FAILS) and "436" in r.verdict.iloc[0]  # 30 is not ≈ 436
    r = rows_of(t, "erank_full_depth")  # 5 with interval [0.5, 1.5] against 7 ± 10%
    assert r.verdict.iloc[0].startswith(vd.FAILS) and "lies outside" in r.verdict.iloc[0]


def test_family_statement_needs_the_family():
    m = planted(True)
    m.model = "llama-tiny"
    t = paper.paper_comparison(CLAIMS, [m], ["B"])
    r = rows_of(t, "ffn_dominant_qwen_phase1").iloc[0]
    assert r.run_value == 2.0 and r.verdict == "not testable: stated for Qwen2.5 only; llama-tiny is not of that family"


def test_missing_tables_give_reasons():
    m = planted(True)
    m.coupling_counts = m.coupling_counts.drop(columns=["n_significant_layers", "n_layers"])
    m.bottleneck, m.geometry, m.phase_metrics, m.coupling, m.checkpoints = {}, None, None, None, None
    m.phases = {"b1": 1, "b2": 4}
    t = paper.paper_comparison(CLAIMS, [m], ["A", "B"])
    A.PaperComparison.validate(t, "paper_comparison.tsv")
    for c in ("significant_layers_step0", "significant_layers_mid", "significant_layers_final"):
        assert rows_of(t, c).reason.tolist() == [paper.NO_LAYER_COUNTS]
    assert rows_of(t, "erank_single_layer").reason.iloc[0] == "bottleneck.tsv not available"
    assert rows_of(t, "middle_regime").reason.tolist() == ["phases.json has no middle regime"] * 2
    assert rows_of(t, "coupling_amplified_symmetric").reason.iloc[0] == "coupling.tsv not available"
    assert rows_of(t, "rss_flat_phase2").reason.iloc[0] == "phases.json with a smoothed profile not available"
    empty = t[t["run_value"].isna()]
    assert (empty["reason"] != "").all() and empty["verdict"].str.startswith("not testable: ").all()
    assert rows_of(t, "phase1_width_slope").reason.iloc[0] == "no scaling group in config scaling.groups"


def test_study_switched_off_unknown_claim_and_one_checkpoint():
    claims = pd.concat([CLAIMS, CLAIMS.iloc[[0]].assign(claim_id="not_a_claim")], ignore_index=True)
    m = planted(True)
    m.ckpts = [FINAL]
    t = paper.paper_comparison(claims, [m], ["A"])
    for c in CLAIMS[CLAIMS.study == "B"].claim_id:
        r = rows_of(t, c)
        assert len(r) == 1 and "study B is not run" in r.reason.iloc[0], c
    assert "has no comparison" in rows_of(t, "not_a_claim").reason.iloc[0]
    for c in ("step0_near_symmetric", "collapse_learned", "training_pulls_rotational"):
        assert rows_of(t, c).verdict.iloc[0] == "not testable: only one checkpoint (no step 0)", c
    assert rows_of(t, "significant_layers_step0").reason.iloc[0] == "only one checkpoint"


def test_verdict_rules():
    assert vd.compare(math.nan, ">", 0).startswith("not testable")
    assert vd.in_range(0.5, 0.6, 1.0, (0.1, 0.55)).startswith(vd.FAILS)
    assert vd.in_range(0.5, 0.6, 1.0).startswith(vd.FAILS) and vd.in_range(0.7, 0.6, 1.0).startswith(vd.HOLDS)
    assert vd.phase_extreme({1: 0.1, 2: 0.1, 3: 0.5}, 2, lowest=True).startswith(vd.FAILS)  # a tie is not lowest
    assert vd.emerges([0, 0, 0]).startswith(vd.FAILS) and vd.emerges([0]).startswith("not testable")
    assert vd.class_sign([0.1, -0.2, 0.1, -0.1, 0.05], +1)[0].startswith(vd.FAILS)
    assert vd.class_sign([0.1, 0.2], +1)[0].startswith("not testable")


def test_interval_from_few_samples_is_reported_but_does_not_decide():
    m = planted(True)
    boot = m.bootstrap[FINAL].copy()
    boot["n_bootstrap_samples"] = 4
    boot.loc[boot.metric == "complex_fraction_early_minus_late", ["ci_low", "ci_high"]] = (-0.2, 0.1)
    m.bootstrap = {FINAL: boot}
    r = rows_of(paper.paper_comparison(CLAIMS, [m], ["A"]), "rotational_early_symmetric_late").iloc[1]
    assert (r.ci_low, r.ci_high) == (-0.2, 0.1) and r.verdict.startswith(vd.HOLDS) and "interval" not in r.verdict
    boot["n_bootstrap_samples"] = 20
    m.bootstrap = {FINAL: boot}
    r = rows_of(paper.paper_comparison(CLAIMS, [m], ["A"]), "rotational_early_symmetric_late").iloc[1]
    assert r.verdict.startswith(vd.FAILS) and "reaches 0" in r.verdict


def test_communities_against_the_permutation_null():
    t = table(True)
    r = rows_of(t, "communities_partly_architectural").iloc[0]
    assert r.run_value == pytest.approx(0.4625) and "4 of 4 boundaries" in r.verdict and r.ckpt == f"step0,{FINAL}"
    r = rows_of(table(False), "communities_partly_architectural").iloc[0]
    assert r.verdict.startswith(vd.FAILS) and "1 of 4 boundaries" in r.verdict
    # half the boundaries above the null is enough ("partly"); BH, not the raw p, decides
    assert vd.above_null([0.5] * 4, [0.1] * 4, [0.01, 0.01, 0.5, 0.9]).startswith(vd.HOLDS)
    assert vd.above_null([0.5] * 4, [0.1] * 4, [0.04, 0.5, 0.6, 0.9]).startswith(vd.FAILS)  # q = 0.16
    m = planted(True)
    m.partitions = m.partitions.drop(columns=["nmi_p"])
    r = rows_of(paper.paper_comparison(CLAIMS, [m], ["A"]), "communities_partly_architectural").iloc[0]
    assert "permutation null" in r.reason and r.verdict.startswith("not testable")


def test_width_slopes_say_how_many_fallback_widths_were_left_out():
    w = widths(True).assign(n_fallback=[0, 2, 0])
    t = paper.paper_comparison(CLAIMS, [planted(True)], ["B"], w, {"g": ["a", "b", "c"]})
    r = rows_of(t, "phase2_width_slope").iloc[0]
    assert "2 width(s) from Kneedle fallback cuts left out of the fit" in r.measure
    assert r.verdict == "holds: interval [0.7, 0.9] meets [0.6, 1]"
    assert "fallback" not in rows_of(t, "phase1_width_slope").measure.iloc[0]
    # the interval, not the point, meets the stated range
    w.loc[w.phase == 2, ["slope", "slope_ci_low", "slope_ci_high"]] = (0.5, 0.45, 0.58)
    t = paper.paper_comparison(CLAIMS, [planted(True)], ["B"], w, {"g": ["a", "b", "c"]})
    want = "does not hold: interval [0.45, 0.58] lies outside [0.6, 1]"
    assert rows_of(t, "phase2_width_slope").verdict.iloc[0] == want
