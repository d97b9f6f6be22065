"""The artifacts layer: one small class per file the pipeline writes, with its one reader and writer.

Each class owns its path relative to the run folder (:meth:`path`), the layout of its file
(TSV columns and their kinds, HDF5 groups/attributes; the schema is in the class docstring),
its writer (atomic, via :mod:`resdyn.io`, with the provenance sidecar where the step asks for
one) and its reader, which validates what it reads and names the file and what is wrong
(a missing column, a wrong kind, a non-finite number where none is allowed, a wrong shape).

The classes live in one module per family, all re-exported here (``artifacts.SpectraTable``):

* :mod:`~resdyn.artifacts.base`: :class:`Artifact`, :class:`TsvArtifact` (the TSV schema and its
  checks, the column kinds), :class:`ArtifactError`, the registry of artifact classes;
* :mod:`~resdyn.artifacts.study_a`: spectra (table and ``spectra.h5``), bottleneck, Schur,
  communities, coupling, checkpoints, partition similarity;
* :mod:`~resdyn.artifacts.beyond`: bridge, causal tests, bootstrap, scorecard, claims, paper comparison;
* :mod:`~resdyn.artifacts.study_b`: lens metrics, the lens folder and its training state, RSS,
  resolution, phase cuts, geometry, phase metrics, depth scaling;
* :mod:`~resdyn.artifacts.zoo_data`: training curve, corpus, samples, checkpoint record;
* :mod:`~resdyn.artifacts.activations` and :mod:`~resdyn.artifacts.jacobians`: the per-layer HDF5
  files, their streaming and resumable writers and their validated readers;
* :mod:`~resdyn.artifacts.figures`: the PNG + PDF pair and the render cache.

Concept modules (spectral, schur, topology, readout, phases, …) compute on arrays and tables;
the scripts under ``workflow/scripts`` read through these classes, compute, and write through
them; the engines that stream or resume (Jacobians, activations, lens training, figures) hand
their arrays to the writer classes here (:class:`JacobianSums`, :meth:`Activations.stream`,
:class:`LensCheckpoint`, :class:`Figure`). Only light imports here (numpy, pandas; h5py and
safetensors inside the methods that need them; torch only inside the writers/readers of torch's
own formats, which only the lens job calls) so a job that reads an artifact does not pay for
torch or scipy at start-up.

Every artifact class registers itself when its module is imported (:meth:`Artifact.__init_subclass__`);
this package imports every module, so :func:`artifact_classes` and :func:`by_relpath` see them all.
"""

from __future__ import annotations

from resdyn.artifacts import activations, base, beyond, figures, jacobians, study_a, study_b, zoo_data
from resdyn.artifacts.activations import Activations, BoundaryView
from resdyn.artifacts.base import Artifact, ArtifactError, TsvArtifact
from resdyn.artifacts.beyond import (
    ALIGNMENT_COLUMNS,
    BOOTSTRAP_COLUMNS,
    CAUSAL_COLUMNS,
    REPLICATE_COLUMNS,
    SCORECARD_COLUMNS,
    BootstrapFirstNTable,
    BootstrapReplicates,
    BootstrapTable,
    BridgeAlignment,
    BridgeTable,
    CausalTable,
    ClaimsTable,
    PaperComparison,
    ScorecardTable,
    SensitivityTable,
)
from resdyn.artifacts.figures import Figure, FigureCache
from resdyn.artifacts.jacobians import JacobianBlocks, JacobianFiles, JacobianSums
from resdyn.artifacts.study_a import (
    BottleneckTable,
    CheckpointsTable,
    CommunitiesSummary,
    CommunityPartitions,
    CouplingCounts,
    CouplingLayers,
    CouplingTable,
    PartitionSimilarity,
    SchurCurves,
    SpectraArrays,
    SpectraTable,
)
from resdyn.artifacts.study_b import (
    LENS_METRIC_COLUMNS,
    RSS_COLUMNS,
    LayerGeometry,
    LensCheckpoint,
    LensFiles,
    LensFolder,
    LensMetrics,
    PhaseCuts,
    PhaseMetrics,
    ResolutionTable,
    RssProfile,
    ScalingFits,
    ScalingWidths,
)
from resdyn.artifacts.zoo_data import CheckpointIntegrity, CheckpointRecord, Corpus, JsonRecord, Samples, TrainingCurve

__all__ = [
    "Artifact",
    "ArtifactError",
    "TsvArtifact",
    "SpectraTable",
    "SpectraArrays",
    "BottleneckTable",
    "SchurCurves",
    "CouplingTable",
    "CommunitiesSummary",
    "CommunityPartitions",
    "CheckpointsTable",
    "CouplingCounts",
    "CouplingLayers",
    "PartitionSimilarity",
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
    "RSS_COLUMNS",
    "LENS_METRIC_COLUMNS",
    "LensMetrics",
    "LensFiles",
    "LensFolder",
    "LensCheckpoint",
    "RssProfile",
    "ResolutionTable",
    "PhaseCuts",
    "LayerGeometry",
    "PhaseMetrics",
    "ScalingWidths",
    "ScalingFits",
    "TrainingCurve",
    "Corpus",
    "Samples",
    "CheckpointIntegrity",
    "JsonRecord",
    "CheckpointRecord",
    "Activations",
    "BoundaryView",
    "JacobianFiles",
    "JacobianBlocks",
    "JacobianSums",
    "Figure",
    "FigureCache",
    "MODULES",
    "artifact_classes",
    "by_relpath",
]

#: The modules that define artifact classes, in the order :func:`artifact_classes` lists them.
#: Naming them here (as values) also makes a code version that reaches the lookups below count
#: every one of them whole: a lookup by path can return any of their classes (docs/reruns.md).
MODULES = (base, study_a, beyond, study_b, zoo_data, activations, jacobians, figures)


def artifact_classes() -> list[type[Artifact]]:
    """Every artifact class of the package's modules that has a path (``relpath``): module by module
    in the order of :data:`MODULES`, each module's classes in the order it defines them."""
    order = {m.__name__: i for i, m in enumerate(MODULES)}
    found = [c for c in base.registered() if c.relpath and c.__module__ in order]
    return sorted(found, key=lambda c: order[c.__module__])  # stable: definition order within a module


def by_relpath(template: str) -> type[Artifact]:
    """The artifact class whose ``relpath`` is ``template`` (e.g. ``results/{model}/{ckpt}/rss.tsv``,
    as the figure catalogue writes its inputs); ValueError naming the template otherwise."""
    found = [c for c in artifact_classes() if c.relpath == template]
    if len(found) != 1:
        raise ValueError(
            f"no artifact class has the path {template!r}"
            if not found
            else f"artifact path {template!r} is claimed by {[c.__name__ for c in found]}"
        )
    return found[0]
