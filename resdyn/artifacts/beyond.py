"""The artifacts beyond the two studies: the bridge (transport, alignment), the causal tests, the
bootstrap, the scorecard, the packaged claims table and the paper comparison; and the column lists
of the tables the concept modules build (defined once, by the classes).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from resdyn.artifacts.base import CKPT_DIR, ArtifactError, TsvArtifact, kinds
from resdyn.io import PathLike

__all__ = [
    "CausalTable",
    "BridgeTable",
    "BridgeAlignment",
    "BootstrapTable",
    "BootstrapFirstNTable",
    "BootstrapReplicates",
    "ScorecardTable",
    "ClaimsTable",
    "PaperComparison",
    "SensitivityTable",
    "BOOTSTRAP_COLUMNS",
    "REPLICATE_COLUMNS",
    "CAUSAL_COLUMNS",
    "ALIGNMENT_COLUMNS",
    "SCORECARD_COLUMNS",
]


class CausalTable(TsvArtifact):
    """``results/{model}/{ckpt}/causal.tsv``: readout-subspace interventions per layer.

    One row per (layer, intervention) (:func:`resdyn.beyond.causal.causal_table`), :data:`CAUSAL_COLUMNS`:
    ``layer`` int, ``intervention`` str (project | patch), ``k``, ``d`` int, ``kl``, ``flip_rate``,
    ``random_kl_mean``, ``random_kl_sd``, ``random_flip_mean``, ``random_flip_sd``, ``kl_z``,
    ``kl_p`` float, ``n_random``, ``n_samples``, ``n_tokens`` int, ``phase`` int (NaN for the
    last layer, outside the cut RSS profile).
    """

    relpath = CKPT_DIR + "causal.tsv"
    columns = kinds(
        "layer:int intervention:str k:int d:int kl:float flip_rate:float random_kl_mean:float "
        "random_kl_sd:float random_flip_mean:float random_flip_sd:float kl_z:float kl_p:float "
        "n_random:int n_samples:int n_tokens:int phase:int"
    )
    allow_nan = ("phase",)
    units = {
        "kl": "nats",
        "random_kl_mean": "nats",
        "random_kl_sd": "nats",
        "flip_rate": "fraction",
        "random_flip_mean": "fraction",
        "random_flip_sd": "fraction",
        "n_tokens": "tokens",
    }


class BridgeTable(TsvArtifact):
    """``results/{model}/{ckpt}/bridge.tsv``: subspace transport next to Jacobian and RSS profiles.

    One row per layer L = 0 … n−1 (:func:`resdyn.beyond.bridge.bridge_tables`): :data:`TRANSPORT_COLUMNS`
    (``layer``, ``k``, ``d`` int, ``transport``, ``random_mean``, ``random_sd``, ``random_p``
    float, ``n_random`` int, ``chance`` float), then the Jacobian profiles (extra float columns
    such as ``complex_frac_attn``, ``henrici_mlp``, ``cum_erank``), ``rss``, ``rss_k`` and
    ``phase``; a row whose numbers are empty (the last layer) says why in ``reason``. For
    parallel-residual models the attn/mlp profile columns are NaN (one operator per layer:
    ``complex_frac_layer``, ``henrici_layer``).
    """

    relpath = CKPT_DIR + "bridge.tsv"
    allow_nan = ("complex_frac_attn", "complex_frac_mlp", "henrici_attn", "henrici_mlp")
    columns = kinds(
        "layer:int k:int d:int transport:float random_mean:float random_sd:float random_p:float "
        "n_random:int chance:float rss:float rss_k:int phase:int"
    )
    extra_columns = True


class BridgeAlignment(TsvArtifact):
    """``results/{model}/{ckpt}/bridge_alignment.tsv``: where each Jacobian profile changes vs the phase cuts.

    One row per profile (:func:`resdyn.beyond.bridge.alignment_table`), :data:`ALIGNMENT_COLUMNS`:
    ``profile`` str, ``change_layer`` int, ``delta`` float, ``b1``, ``b2`` int, ``b1_found``,
    ``b2_found`` bool, ``dist_b1``, ``dist_b2``, ``dist_nearest`` int, ``chance_dist_nearest``
    float, ``n_positions`` int.
    """

    relpath = CKPT_DIR + "bridge_alignment.tsv"
    columns = kinds(
        "profile:str change_layer:int delta:float b1:int b2:int b1_found:bool b2_found:bool "
        "dist_b1:int dist_b2:int dist_nearest:int chance_dist_nearest:float n_positions:int"
    )


class BootstrapTable(TsvArtifact):
    """``results/{model}/{ckpt}/bootstrap.tsv``: bootstrap intervals over samples.

    :data:`BOOTSTRAP_COLUMNS` (:func:`resdyn.beyond.bootstrap.jacobian_bootstrap` +
    :func:`resdyn.beyond.bootstrap.not_bootstrapped_rows`): ``metric`` str, ``layer`` int, ``kind`` str,
    ``s`` int (NaN for whole-model rows), ``estimate``, ``ci_low``, ``ci_high``, ``level`` float,
    ``n_resamples``, ``n_bootstrap_samples``, ``n_samples_total`` int, ``estimate_all_samples``
    float, ``seed`` int, ``bootstrapped`` bool, ``note`` str, ``reason`` str (non-empty where the
    row was not bootstrapped; its numbers are then NaN), ``method``, ``interval`` str.
    """

    relpath = CKPT_DIR + "bootstrap.tsv"
    columns = kinds(
        "metric:str layer:int kind:str s:int estimate:float ci_low:float ci_high:float level:float "
        "n_resamples:int n_bootstrap_samples:int n_samples_total:int estimate_all_samples:float "
        "seed:int bootstrapped:bool note:str reason:str method:str interval:str"
    )
    allow_nan = ("layer", "s")


class BootstrapFirstNTable(BootstrapTable):
    """``results/{model}/{ckpt}/bootstrap_first_n.tsv``: the second method's intervals, the bootstrap of
    the stored first n samples (:func:`resdyn.beyond.bootstrap.first_n_bootstrap_files`), beside the
    all-sample group jackknife of ``bootstrap.tsv``; the columns of :class:`BootstrapTable`. Without
    group means it holds one row saying why (``bootstrap.tsv`` is then this method)."""

    relpath = CKPT_DIR + "bootstrap_first_n.tsv"


class BootstrapReplicates(TsvArtifact):
    """``results/{model}/{ckpt}/bootstrap_replicates.tsv``: replicate values of the whole-model statistics.

    :data:`REPLICATE_COLUMNS`: ``replicate`` int, ``metric`` str, ``value`` float (finite).
    """

    relpath = CKPT_DIR + "bootstrap_replicates.tsv"
    columns = kinds("replicate:int metric:str value:float")


class ScorecardTable(TsvArtifact):
    """``results/{model}/scorecard.tsv``: one row per claim with its verdict.

    :data:`SCORECARD_COLUMNS` (:func:`resdyn.beyond.scorecard.scorecard`): ``claim_id``, ``claim``,
    ``statistic`` str, ``value``, ``ci_low``, ``ci_high`` float (NaN only in a row with a
    ``reason``), ``ci_source``, ``study_value``, ``verdict``, ``reason``, ``detail``, ``ckpts`` str.
    """

    relpath = "results/{model}/scorecard.tsv"
    columns = kinds(
        "claim_id:str claim:str statistic:str value:float ci_low:float ci_high:float ci_source:str "
        "study_value:str verdict:str reason:str detail:str ckpts:str"
    )


class ClaimsTable(TsvArtifact):
    """``resdyn/data/claims.tsv`` (package data, not a run output): the studies' stated figures.

    One row per figure (docs/claims.md): ``claim_id`` (unique), ``study`` (A | B),
    ``study_model``, ``study_ckpt``, ``stated_value`` (the figure as the study states it, text),
    ``unit``, ``statement`` and ``our_output`` (where a run's comparable number lives), all str.
    The scorecard's ``study_value`` and ``paper_comparison.tsv``'s ``stated_value`` quote it.
    """

    relpath = ""  # shipped with the package: :meth:`packaged`, read with :meth:`load`
    columns = kinds(
        "claim_id:str study:str study_model:str study_ckpt:str stated_value:str unit:str statement:str our_output:str"
    )

    @staticmethod
    def packaged() -> Path:
        """The table shipped in the package."""
        return Path(__file__).resolve().parents[1] / "data" / "claims.tsv"

    @classmethod
    def load(cls, path: PathLike | None = None) -> pd.DataFrame:
        """The claims (the packaged table by default), checked: unique ids, study A or B, a figure each."""
        path = cls.packaged() if path is None else path
        table = cls.read(path).fillna("")
        dup = table["claim_id"][table["claim_id"].duplicated()].tolist()
        bad = table.loc[~table["study"].isin(["A", "B"]) | (table["stated_value"].str.strip() == ""), "claim_id"]
        if dup or len(bad):
            raise ArtifactError(
                f"{path}: claim ids must be unique (repeated: {dup}) and each needs study A or B "
                f"and a stated value (bad: {bad.tolist()})"
            )
        return table


class PaperComparison(TsvArtifact):
    """``results/paper_comparison.tsv``: each stated figure of the studies next to this run's number.

    One row per (claim, model, checkpoint, measure) (:func:`resdyn.beyond.paper.paper_comparison`):
    ``claim`` (a :class:`ClaimsTable` id), ``study``, ``model``, ``ckpt``, ``measure`` (what
    ``run_value`` is), ``stated_value`` (the study's figure as text, with its model), str;
    ``run_value``, ``ci_low``, ``ci_high`` float (the interval NaN where none exists);
    ``unit``, ``source_table``, ``reason`` str (why ``run_value`` is empty: a study switched
    off, a table without the metric, a claim the comparison does not know), ``verdict`` str
    (``holds: …``, ``does not hold: …`` or ``not testable: <reason>``, :mod:`resdyn.beyond.verdicts`).
    """

    relpath = "results/paper_comparison.tsv"
    columns = kinds(
        "claim:str study:str model:str ckpt:str measure:str stated_value:str run_value:float "
        "ci_low:float ci_high:float unit:str source_table:str reason:str verdict:str"
    )
    allow_nan = ("ci_low", "ci_high")


class SensitivityTable(TsvArtifact):
    """``results/sensitivity.tsv``: each open choice's options and what they do to the paper table's verdicts.

    One row per (choice, model, claim, measure, option) (:func:`resdyn.beyond.sensitivity.sensitivity_table`):
    ``model``, ``ckpt``, ``choice`` (a key of :data:`resdyn.beyond.sensitivity.CHOICES`), ``option``
    str; ``default`` bool (the option the run is configured with); ``claim`` (a
    :class:`ClaimsTable` id), ``measure`` str; ``value`` float (NaN only in a row with a
    ``reason``); ``verdict`` str (the paper table's rule under this option); ``verdict_changes`` str
    (``default``, ``no``, ``yes: <default> → <this>``, ``not known: …``); ``reason`` (why ``value``
    is empty: the run did not compute what the option needs), ``source`` str.
    """

    relpath = "results/sensitivity.tsv"
    columns = kinds(
        "model:str ckpt:str choice:str option:str default:bool claim:str measure:str value:float "
        "verdict:str verdict_changes:str reason:str source:str"
    )


# column lists of the tables that concept modules build (defined once, by the classes above)
BOOTSTRAP_COLUMNS = list(BootstrapTable.columns)
REPLICATE_COLUMNS = list(BootstrapReplicates.columns)
CAUSAL_COLUMNS = list(CausalTable.columns)
ALIGNMENT_COLUMNS = list(BridgeAlignment.columns)
SCORECARD_COLUMNS = list(ScorecardTable.columns)
