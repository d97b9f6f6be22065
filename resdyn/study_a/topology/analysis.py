"""One residual boundary end to end: graph, communities, boundary units and their tables
(:func:`analyse_boundary`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from resdyn.study_a.topology.boundary import (
    boundary_units_by_participation,
    check_min_other,
    community_table,
    other_communities,
    participation_coefficient,
)
from resdyn.study_a.topology.communities import community_summary, signed_leiden_partition
from resdyn.study_a.topology.graph import correlation_graph

#: How :func:`analyse_boundary` picks boundary units: :func:`boundary_units` or :func:`boundary_units_by_participation`.
BOUNDARY_RULES = ("neighbours", "participation")


def analyse_boundary(
    X: Any,
    top_k: int,
    min_abs_r: float = 0.0,
    resolution: float | Sequence[float] = 0.05,
    seed: int = 0,
    boundary_rule: str = "neighbours",
    participation_quantile: float = 0.9,
    *,
    min_other: int = 2,
    chunk_size: int | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Communities and boundary units of one residual boundary.

    ``X`` (tokens × units) → :func:`correlation_graph` → :func:`signed_leiden_partition` →
    :func:`participation_coefficient` and boundary units by ``boundary_rule``: ``neighbours``
    (:func:`boundary_units`, positive neighbours in ≥ ``min_other`` other communities, default 2)
    or ``participation`` (:func:`boundary_units_by_participation` at ``participation_quantile``).

    Returns ``(units, summary)``: units is :func:`community_table` with ``n_other_communities``
    (so the other neighbour-count rule can be read back); summary is
    :func:`community_summary` with ``sizes`` as a comma-joined string (one TSV cell), plus
    ``resolution`` (chosen γ), ``modularity``, ``n_edges``, ``n_negative_edges``, ``n_boundary``,
    ``n_tokens``, ``n_constant_units``.
    """
    if boundary_rule not in BOUNDARY_RULES:
        raise ValueError(f"boundary_rule must be one of {BOUNDARY_RULES}, got {boundary_rule!r}")
    check_min_other(min_other)
    g = correlation_graph(X, top_k, min_abs_r, chunk_size=chunk_size)
    part = signed_leiden_partition(g, resolution, seed)
    pc = participation_coefficient(g, part.labels)
    n_other = other_communities(g, part.labels)
    if boundary_rule == "neighbours":
        is_b = n_other >= min_other
    else:
        is_b = boundary_units_by_participation(pc, participation_quantile)
    units = community_table(g, part.labels, is_b, pc, n_other)
    summary = community_summary(part.labels, part.quality)
    w = np.asarray(g.es["weight"]) if g.ecount() else np.zeros(0)
    summary.update(
        sizes=",".join(map(str, summary["sizes"])),
        resolution=part.resolution,
        modularity=part.modularity,
        n_edges=int(g.ecount()),
        n_negative_edges=int((w < 0).sum()),
        n_boundary=int(is_b.sum()),
        n_tokens=g["n_tokens"],
        n_constant_units=g["n_constant_units"],
    )
    return units, summary
