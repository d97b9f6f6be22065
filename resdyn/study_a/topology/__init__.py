"""Activation-correlation topology: signed correlation graphs, signed Leiden communities,
boundary units and how they couple to Jacobian gain.

Pipeline (one boundary of one checkpoint)::

    activations (tokens × d) ─► correlation_graph ─► signed_leiden_partition ─► labels
        labels ─► boundary_units / participation_coefficient ─► community_table
    mean Jacobian J ─► unit_gains ─► coupling_stats(gains, is_boundary)
    per-boundary rows ─► coupling_table (Benjamini–Hochberg q-values, significance)
    per-boundary p-values ─► layer_significance (Simes per layer, BH over layers: the layer count)

Everything here is pure (numpy / scipy / igraph / leidenalg); nothing reads config or files.
Memory: :func:`correlation_matrix` streams the tokens in chunks and never holds more than one
d×d float64 matrix (128 MiB at d = 4096) plus one token chunk and one row block.

Modules, one concept each: :mod:`~resdyn.study_a.topology.graph` (correlation, sparsification, the
graph), :mod:`~resdyn.study_a.topology.communities` (signed Leiden CPM, signed modularity),
:mod:`~resdyn.study_a.topology.boundary` (boundary units, participation, the unit table),
:mod:`~resdyn.study_a.topology.coupling` (gain of boundary vs interior units, BH, Simes, counts)
and :mod:`~resdyn.study_a.topology.analysis` (one boundary end to end). Every public name is
importable from the package.
"""

from resdyn.study_a.topology.analysis import (
    BOUNDARY_RULES,
    analyse_boundary,
)
from resdyn.study_a.topology.boundary import (
    boundary_units,
    boundary_units_by_participation,
    check_min_other,
    community_table,
    other_communities,
    participation_coefficient,
)
from resdyn.study_a.topology.communities import (
    GridPoint,
    SignedPartition,
    check_labels,
    community_summary,
    edge_arrays,
    signed_leiden,
    signed_leiden_partition,
    signed_modularity,
)
from resdyn.study_a.topology.coupling import (
    BOUNDARY_KIND,
    GAINS,
    LAYER_COLUMNS,
    bh_fdr,
    coupling_from_tables,
    coupling_stats,
    coupling_table,
    coupling_test,
    layer_significance,
    sign_dependence,
    significant_counts,
    simes_p,
    unit_gains,
)
from resdyn.study_a.topology.graph import (
    correlation_graph,
    correlation_matrix,
    top_k_edges,
)

__all__ = [
    "analyse_boundary",
    "bh_fdr",
    "BOUNDARY_KIND",
    "BOUNDARY_RULES",
    "boundary_units",
    "other_communities",
    "check_min_other",
    "boundary_units_by_participation",
    "check_labels",
    "community_summary",
    "community_table",
    "correlation_graph",
    "correlation_matrix",
    "coupling_from_tables",
    "coupling_stats",
    "coupling_table",
    "coupling_test",
    "edge_arrays",
    "GAINS",
    "GridPoint",
    "LAYER_COLUMNS",
    "layer_significance",
    "participation_coefficient",
    "sign_dependence",
    "signed_leiden",
    "signed_leiden_partition",
    "signed_modularity",
    "SignedPartition",
    "significant_counts",
    "simes_p",
    "top_k_edges",
    "unit_gains",
]
