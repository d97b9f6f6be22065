"""Every open choice computed both ways: ``results/sensitivity.tsv``.

The studies leave choices open that move the numbers of the paper table
(:mod:`resdyn.beyond.paper`; docs/design.md "Choices the studies leave open"). For each choice of
:data:`CHOICES` and each of its options, this module reruns the paper table's own comparisons
(:data:`resdyn.beyond.paper.COMPARISONS`, :func:`resdyn.beyond.paper_b.slopes`) of the headline
statements the choice moves (:data:`HEADLINES`) on the model's tables as that option gives them,
and says for every row whether the verdict differs from the configured option's
(``verdict_changes``). An option whose numbers the run did not compute gets rows with the reason.

How each option's tables arise (the builders below take them from the run's tables or from
alternatives the sensitivity script computes on stored data):

- ``single_layer_baseline``: P_1 (the first whole layer) or P_0 (the first attention half) of
  ``bottleneck.tsv``;
- ``readout_matrix``: readout subspaces of I + W or of W (:func:`readout_phases` recomputes RSS,
  resolution sweep, phase cut and middle regime from the lens; phase means from ``geometry.tsv``);
- ``boundary_rule``: boundary units with positive neighbours in ≥ 2 or ≥ 1 other communities
  (:func:`boundary_coupling` recomputes the coupling of every checkpoint from the
  ``n_other_communities`` column of the partitions);
- ``complex_rule``: the complex share above the sampling-noise bound or above the tolerance;
- ``erank_weights``: Roy–Vetterli effective rank on p = σ/Σσ or on σ²/Σσ² (``erank_energy``);
- ``jacobian_product``: the product of the mean Jacobians over all samples, over the stored
  first n, or the mean of the first n samples' own products
  (:func:`resdyn.study_a.spectral.mean_of_products_bottleneck`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from resdyn import artifacts
from resdyn.beyond import paper_a
from resdyn.beyond import verdicts as vd
from resdyn.beyond.paper import COMPARISONS
from resdyn.beyond.paper_b import slopes
from resdyn.beyond.paper_rows import ModelTables, final, row

__all__ = [
    "CHOICES",
    "HEADLINES",
    "CHOICE_STUDY",
    "SENSITIVITY_COLUMNS",
    "Options",
    "choice_rows",
    "sensitivity_table",
    "verdict_change",
    "complex_options",
    "erank_options",
    "product_options",
    "readout_options",
    "boundary_options",
    "readout_phases",
    "boundary_coupling",
    "width_fits",
    "product_gflop",
    "readout_gflop",
    "over_budget",
]

SENSITIVITY_COLUMNS = list(artifacts.SensitivityTable.columns)

#: choice → its options (the pipeline's default first)
CHOICES: dict[str, tuple[str, ...]] = {
    "single_layer_baseline": ("P_1", "P_0"),
    "readout_matrix": ("I_plus_W", "W"),
    "boundary_rule": ("min_other_2", "min_other_1"),
    "complex_rule": ("beyond_noise", "tolerance"),
    "erank_weights": ("sigma", "sigma_squared"),
    "jacobian_product": ("product_of_means", "product_of_means_first_n", "mean_of_products_first_n"),
}
#: choice → the study its statements belong to
CHOICE_STUDY = {c: ("B" if c == "readout_matrix" else "A") for c in CHOICES}
#: the phase statements of study B that read the cut (every per-model one but the setup and the lens KL)
_PHASE_CLAIMS = (
    "middle_regime",
    "rss_unimodal",
    "rss_rises_phase1",
    "hidden_erank_peaks_phase1",
    "updates_orthogonal_phase1",
    "ffn_dominant_qwen_phase1",
    "hit1_phase1",
    "logit_lens_ineffective_phase1",
    "rss_flat_phase2",
    "hidden_erank_stabilises_phase2",
    "update_cos_lowest_phase2",
    "update_erank_peaks_phase2",
    "hit1_phase2",
    "hit_ratio_falls_phase2",
    "logit_lens_low_phase2",
    "rss_falls_phase3",
    "update_erank_falls_phase3",
    "update_cos_highest_phase3",
    "update_norm_growth_phase3",
    "ffn_dominant_phase3",
    "logit_hit1_phase3",
)
#: choice → the statements whose numbers it moves
HEADLINES: dict[str, tuple[str, ...]] = {
    "single_layer_baseline": ("erank_single_layer",),
    "readout_matrix": _PHASE_CLAIMS,
    "boundary_rule": (
        "coupling_amplified_symmetric",
        "coupling_attenuated_nonnormal",
        "significant_layers_step0",
        "significant_layers_mid",
        "significant_layers_final",
        "coupling_emerges_monotonically",
    ),
    "complex_rule": ("complex_share_early", "rotational_early_symmetric_late", "training_pulls_rotational"),
    "erank_weights": ("erank_single_layer", "erank_full_depth", "collapse_not_architectural", "collapse_learned"),
    "jacobian_product": ("erank_single_layer", "erank_full_depth"),
}
#: the width-slope statements (one row per scaling group) that the readout matrix moves
READOUT_GROUP_CLAIMS = ("phase1_width_slope", "phase2_width_slope", "phase3_width_constant", "capacity_in_phase2")

#: option → what its rows are computed from (the model's tables under it), or why the run has none
Options = Mapping[str, Any]


def verdict_change(default: Mapping[str, Any] | None, other: Mapping[str, Any], is_default: bool) -> str:
    """Whether ``other``'s verdict differs from the default option's row ``default``: ``default``,
    ``no``, ``yes: <default> → <other>``, or ``not known: …`` when one side is not testable.

    Example:
        >>> verdict_change({"verdict": "holds: 1 > 0"}, {"verdict": "does not hold: -1 is not > 0"}, False)
        'yes: holds → does not hold'
    """
    if is_default:
        return "default"
    if default is None:
        return "not known: the default option has no row for this measure"
    a, b = (str(r["verdict"]).split(":")[0] for r in (default, other))
    if a == vd.UNTESTABLE and b == vd.UNTESTABLE:
        return "no: not testable under either option"
    if vd.UNTESTABLE in (a, b):
        return f"not known: not testable under {'the default' if a == vd.UNTESTABLE else 'this option'}"
    return "no" if a == b else f"yes: {a} → {b}"


def _out(choice: str, option: str, is_default: bool, r: Mapping[str, Any], change: str) -> dict:
    """One sensitivity row from a paper row ``r``."""
    return {
        "model": r["model"],
        "ckpt": r["ckpt"],
        "choice": choice,
        "option": option,
        "default": bool(is_default),
        "claim": r["claim"],
        "measure": r["measure"],
        "value": float(r["run_value"]),
        "verdict": r["verdict"],
        "verdict_changes": change,
        "reason": r["reason"],
        "source": r["source_table"],
    }


def _missing(rows: Sequence[Mapping[str, Any]], why: str) -> list[dict]:
    """The default's rows as an option without numbers: same measures, no value, the reason."""
    return [dict(r, run_value=math.nan, reason=why, verdict=vd.untestable(why), source_table="") for r in rows]


def choice_rows(
    choice: str,
    claim: Mapping[str, str],
    model: str,
    options: Options,
    default: str,
    compute: Callable[[Mapping[str, str], Any, str], list[dict]] | None = None,
) -> list[dict]:
    """The sensitivity rows of one statement of ``model`` under every option of ``choice``.

    ``compute(claim, tables, option)`` gives the paper rows (default: the paper table's own
    comparison of the claim on :class:`ModelTables`); the rows of each option are paired with the default option's by
    position, so each measure is listed under every option. An option given as a string (why the
    run has no numbers for it) repeats the default's measures with that reason; when the default
    itself has none, every option gets one row with its reason.
    """
    run = compute or (lambda c, t, _o: COMPARISONS[c["claim_id"]](c, t))
    rows = {o: run(claim, t, o) for o, t in options.items() if not isinstance(t, str)}
    base = rows.get(default)
    if base is None:
        why = options.get(default)
        base = [row(claim, model, "", "", reason=str(why) if isinstance(why, str) else "the default is not available")]
    for o, t in options.items():
        if isinstance(t, str):
            rows[o] = _missing(base, t)
    out = []
    for i, ref in enumerate(base):
        for o in options:
            r = rows[o][i] if i < len(rows[o]) else _missing([ref], "this option gives no row for this measure")[0]
            out.append(_out(choice, o, o == default, r, verdict_change(ref, r, o == default)))
    return out


def complex_options(t: ModelTables) -> dict[str, ModelTables]:
    """``complex_rule``: the same tables read with either complex-share rule."""
    return {rule: replace(t, complex_rule=rule) for rule in CHOICES["complex_rule"]}


def erank_options(t: ModelTables) -> dict[str, ModelTables | str]:
    """``erank_weights``: erank on σ (the tables as they are) or on σ² (``erank_energy`` of the final
    ``bottleneck.tsv``, ``cum_erank_energy`` of ``checkpoints.tsv``); the bootstrap interval is of
    the σ reading, so the σ² option has none."""
    ck = final(t)
    b, c = t.bottleneck.get(ck), t.checkpoints
    if b is None or "erank_energy" not in b.columns or c is None or "cum_erank_energy" not in c.columns:
        return {"sigma": t, "sigma_squared": "bottleneck.tsv or checkpoints.tsv has no erank on σ² (erank_energy)"}
    energy = replace(
        t,
        bottleneck={ck: b.assign(erank=b["erank_energy"])},
        checkpoints=c.assign(cum_erank=c["cum_erank_energy"]),
        bootstrap={},
    )
    return {"sigma": t, "sigma_squared": energy}


def product_options(t: ModelTables, first_n: pd.DataFrame | str) -> dict[str, ModelTables | str]:
    """``jacobian_product``: the bottleneck of the product of means over all samples (the tables as
    they are), and from :func:`resdyn.study_a.spectral.mean_of_products_bottleneck` on the stored
    first n samples the product of their means and the mean of their products (or why not)."""
    if isinstance(first_n, str):
        return {"product_of_means": t, "product_of_means_first_n": first_n, "mean_of_products_first_n": first_n}
    ck = final(t)
    out: dict[str, ModelTables | str] = {"product_of_means": t}
    for option, col in (
        ("product_of_means_first_n", "erank_product_of_means"),
        ("mean_of_products_first_n", "erank_mean_of_products"),
    ):
        table = pd.DataFrame({"s": first_n["s"], "erank": first_n[col]})
        out[option] = replace(t, bottleneck={ck: table}, bootstrap={})
    return out


def readout_options(t: ModelTables, other: str, phases_json: Mapping[str, Any] | str) -> dict[str, ModelTables | str]:
    """``readout_matrix``: the tables as the run made them (its configured matrix) and, for the
    ``other`` matrix, the phases of :func:`readout_phases` with phase means recomputed from
    ``geometry.tsv`` at those cuts (:func:`resdyn.study_b.geometry.phase_table`)."""
    from resdyn.study_b.geometry import phase_table  # only this option needs the geometry module

    configured = next(o for o in CHOICES["readout_matrix"] if o != other)
    if isinstance(phases_json, str):
        return {configured: t, other: phases_json}
    pm = None if t.geometry is None else phase_table(t.geometry, phases_json)
    return {configured: t, other: replace(t, phases=dict(phases_json), phase_metrics=pm)}


def boundary_options(
    t: ModelTables, other: str, coupling: tuple[pd.DataFrame, pd.DataFrame] | str
) -> dict[str, ModelTables | str]:
    """``boundary_rule``: the tables as the run made them and, for the ``other`` neighbour count,
    the final checkpoint's coupling and every checkpoint's counts of :func:`boundary_coupling`."""
    configured = next(o for o in CHOICES["boundary_rule"] if o != other)
    if isinstance(coupling, str):
        return {configured: t, other: coupling}
    return {configured: t, other: replace(t, coupling=coupling[0], coupling_counts=coupling[1])}


def readout_phases(
    translators: Sequence[np.ndarray],
    matrix: str,
    k_fractions: Sequence[float],
    phase_k_fraction: float,
    window: int,
    smoothing: str,
) -> dict[str, Any]:
    """The ``phases.json`` object the pipeline makes (rules rss, resolution, phases) with the
    readout subspaces of ``matrix`` (:func:`resdyn.study_b.readout.readout_matrices`): RSS profile,
    cut at ``phase_k_fraction``, and the middle regime's cuts."""
    from resdyn.study_b import phases, readout

    mats = readout.readout_matrices(translators, matrix)
    ks = sorted({readout.k_from_fraction(mats[0].shape[0], f) for f in k_fractions})
    rss = readout.rss_profile(mats, ks)
    profile, k = phases.profile_at(rss, phase_k_fraction)
    cuts = phases.cutpoints(profile, window=window, method=smoothing).at_k(k, phase_k_fraction)
    regime = phases.middle_regime(readout.resolution_table(mats, k_fractions))
    regime = phases.regime_agreement(rss, regime, window=window, method=smoothing)
    return cuts.with_regime(regime).to_json()


def boundary_coupling(
    partitions: Mapping[str, pd.DataFrame],
    jacobians: Mapping[str, Mapping[tuple[int, str], Any]],
    spectra: Mapping[str, pd.DataFrame],
    min_other: int,
    gain: str,
    q_level: float,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Coupling with boundary units read back as ``n_other_communities ≥ min_other``.

    Per checkpoint (keys in training order): ``coupling.tsv`` and ``coupling_layers.tsv`` as the
    coupling rule makes them (:func:`resdyn.study_a.topology.coupling_from_tables`,
    :func:`resdyn.study_a.topology.layer_significance`) on the same partitions and Jacobians; returns
    (the final checkpoint's coupling table, the counts of every checkpoint,
    :func:`resdyn.study_a.topology.significant_counts`).
    """
    from resdyn.study_a import topology

    topology.check_min_other(min_other)
    tables, layers = {}, {}
    for ckpt, part in partitions.items():
        if "n_other_communities" not in part.columns:
            raise ValueError(f"communities of {ckpt!r} have no n_other_communities column; rerun the communities rule")
        part = part.assign(is_boundary=part["n_other_communities"] >= min_other)
        tables[ckpt] = topology.coupling_from_tables(part, jacobians[ckpt], spectra[ckpt], gain=gain, q_level=q_level)
        layers[ckpt] = topology.layer_significance(tables[ckpt], q_level=q_level)
    return tables[list(tables)[-1]], topology.significant_counts(tables, layers)


def width_fits(
    phases_of: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Sequence[str]], n_layers: Mapping[str, int]
) -> pd.DataFrame:
    """``phase_widths.tsv`` from the phase cuts ``phases_of`` (model → ``phases.json`` object) of the
    scaling groups' models, as the scaling rule fits it (fallback widths left out)."""
    from resdyn.study_b import geometry

    return geometry.group_fits(geometry.phase_widths(phases_of, groups, n_layers))


def _group_rows(
    claims: pd.DataFrame,
    groups: Mapping[str, Sequence[str]],
    fits: Mapping[str, pd.DataFrame | str | None],
    default: str,
) -> list[dict]:
    """The width-slope statements under each readout matrix (one row per scaling group)."""
    out = []
    for cid in READOUT_GROUP_CLAIMS:
        claim = _claim(claims, cid)
        out += choice_rows("readout_matrix", claim, "", fits, default, lambda c, f, _o: slopes(c, f, groups))
    return out


def _claim(claims: pd.DataFrame, cid: str) -> dict[str, str]:
    """The claims-table row of ``cid`` as a mapping (with its ``claim_id``)."""
    return claims.set_index("claim_id").loc[cid].to_dict() | {"claim_id": cid}


def sensitivity_table(
    claims: pd.DataFrame,
    options: Sequence[Mapping[str, Options]],
    defaults: Mapping[str, str],
    studies: Sequence[str] = ("A", "B"),
    group_fits: Mapping[str, pd.DataFrame | str | None] | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> pd.DataFrame:
    """``results/sensitivity.tsv``: :data:`SENSITIVITY_COLUMNS`, choice by choice, model by model.

    ``options``: per model, choice → option → its tables (or why the run has none);
    ``defaults``: choice → the configured option; ``group_fits``: readout option → the
    ``phase_widths.tsv`` fits under it (or why not) for the width-slope rows of ``groups``.
    A choice of a study that does not run gets one row per option saying so.
    """
    rows: list[dict] = []
    for choice in CHOICES:
        if CHOICE_STUDY[choice] not in studies:
            why = f"study {CHOICE_STUDY[choice]} is not run (config studies: {sorted(studies)})"
            claim = _claim(claims, HEADLINES[choice][0])
            rows += choice_rows(choice, claim, "", dict.fromkeys(CHOICES[choice], why), defaults[choice])
            continue
        compute = _single_layer if choice == "single_layer_baseline" else None
        for model_options in options:
            opts = model_options[choice]
            model = next((t.model for t in opts.values() if isinstance(t, ModelTables)), "")
            for cid in HEADLINES[choice]:
                rows += choice_rows(choice, _claim(claims, cid), model, opts, defaults[choice], compute)
        if choice == "readout_matrix" and groups and group_fits:
            rows += _group_rows(claims, groups, group_fits, defaults[choice])
    return pd.DataFrame(rows, columns=SENSITIVITY_COLUMNS)


def _single_layer(claim: Mapping[str, str], t: ModelTables, option: str) -> list[dict]:
    """The single-layer row with P_1 or P_0 as the baseline."""
    return [paper_a.single_layer_row(claim, t, int(option[-1]))]


def product_gflop(n: int, n_sublayers: int, d: int) -> float:
    """Estimated GFLOP of :func:`resdyn.study_a.spectral.mean_of_products_bottleneck`: n products
    of d × d per sublayer (2 n d³) and two singular-value decompositions (≈ 2 · 4 d³) each."""
    return n_sublayers * (2.0 * n + 8.0) * d**3 / 1e9


def readout_gflop(n_translators: int, d: int) -> float:
    """Estimated GFLOP of :func:`readout_phases`: one SVD with vectors per translator for the RSS
    profile and one for the resolution sweep (≈ 22 d³ each, Golub–Van Loan)."""
    return n_translators * 2 * 22.0 * d**3 / 1e9


def over_budget(gflop: float, max_gflop: float, what: str) -> str:
    """Why ``what`` is not computed (its estimate exceeds config ``sensitivity.max_gflop``), or "".

    Example:
        >>> over_budget(5e3, 1e3, "the mean of per-sample products")
        'the mean of per-sample products is not computed: about 5000 GFLOP > sensitivity.max_gflop 1000'
    """
    if gflop <= max_gflop:
        return ""
    return f"{what} is not computed: about {gflop:.4g} GFLOP > sensitivity.max_gflop {max_gflop:g}"
