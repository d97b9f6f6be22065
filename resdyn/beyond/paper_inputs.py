"""The tables of each model that the paper table and the sensitivity table read, through the
artifact classes: one reader for both scripts (``paper_comparison``, ``sensitivity``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from resdyn import artifacts
from resdyn.beyond.paper_rows import ModelTables
from resdyn.study_b import phases

__all__ = ["PER_MODEL_READERS", "read_model_tables"]


def _cuts(path: str) -> dict[str, Any]:
    return phases.Cutpoints.from_json(artifacts.PhaseCuts.read(path), source=path).to_json()


#: input key → the reader of its per-model file (one entry per model, in config order)
PER_MODEL_READERS: dict[str, Callable[[str], Any]] = {
    "checkpoints": artifacts.CheckpointsTable.read,
    "coupling_counts": artifacts.CouplingCounts.read,
    "bottleneck": artifacts.BottleneckTable.read,
    "bootstrap": artifacts.BootstrapTable.read,
    "phases": _cuts,
    "geometry": artifacts.LayerGeometry.read,
    "phase_metrics": artifacts.PhaseMetrics.read,
    "coupling": artifacts.CouplingTable.read,
    "schur": artifacts.SchurCurves.read,
    "partitions": artifacts.PartitionSimilarity.read,
    "lens_metrics": artifacts.LensMetrics.read,
}


def read_model_tables(inputs: Mapping[str, Sequence[str]], params: Any) -> list[ModelTables]:
    """One :class:`ModelTables` per model of ``params.models`` from the rule's inputs.

    ``inputs``: key of :data:`PER_MODEL_READERS` → one path per model (a key the rule does not
    have, e.g. of a study switched off, leaves that table None); ``params``: ``models``,
    ``ckpts``, ``lens_ckpts``, ``complex_tol``, ``complex_rule``, ``n_samples`` (the rule's params).
    The final checkpoint's ``bottleneck`` and ``bootstrap`` are keyed by that checkpoint.
    """
    tables = {
        key: {m: read(f) for m, f in zip(params.models, inputs.get(key), strict=True)}
        for key, read in PER_MODEL_READERS.items()
        if inputs.get(key) is not None
    }

    def of(key: str, m: str) -> Any:
        return tables.get(key, {}).get(m)

    out = []
    for m in params.models:
        last = params.ckpts[m][-1]
        by_final = {k: ({last: of(k, m)} if of(k, m) is not None else {}) for k in ("bottleneck", "bootstrap")}
        plain = ("checkpoints", "coupling_counts", "phases", "geometry", "phase_metrics", "coupling", "schur")
        out.append(
            ModelTables(
                model=m,
                ckpts=params.ckpts[m],
                lens_ckpt=params.lens_ckpts[m],
                **{k: of(k, m) for k in plain},
                **by_final,
                partitions=of("partitions", m),
                lens_metrics=of("lens_metrics", m),
                complex_tol=params.complex_tol,
                complex_rule=params.complex_rule,
                n_samples=params.n_samples,
            )
        )
    return out
