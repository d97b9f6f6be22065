"""The figure catalogue: every figure of the pipeline, declared once.

One :class:`FigureSpec` per figure names its file stem, the scope it is drawn for, the artifacts
it reads (path templates, in the order of the plot function's positional arguments), the plot
function, its caption, its report category and the studies it needs. Everything else is derived
from this table: the figure rules' inputs and outputs (``workflow/rules/figures.smk``), the
targets of ``rule all``, the report captions and categories, the study check and the dispatch
in ``workflow/scripts/figure.py``.

Scopes (one figure job per scope instance, drawing all of that scope's figures):

* ``ckpt``: every checkpoint of a model, ``results/figures/{model}/{ckpt}/{name}.png``;
* ``lens``: the checkpoints with a tuned lens (config ``lens.checkpoints``), same paths;
* ``model``: once per model, ``results/figures/{model}/{name}.png``;
* ``zoo``: once per model the pipeline trains itself (same paths as ``model``);
* ``global``: once per run, ``results/figures/scaling/{name}.png``;
* ``trajectory`` / ``lens_trajectory``: once per run, across checkpoints and models,
  ``results/figures/trajectory/{name}.png``: each input template is read for every checkpoint
  (``lens_trajectory``: every checkpoint with a tuned lens) of every model, and the plot
  function gets one table per template, the files concatenated with ``model``, ``ckpt`` and
  ``step`` columns (:func:`trajectory_inputs`, :func:`resdyn.plots.render.trajectory_table`).

This module imports neither matplotlib nor the figure modules, so the Snakefile reads it at
parse time for free; the plot functions are named as ``"module:function"`` in
``resdyn.plots``. A figure's own code version (:func:`figure_code_version`) covers its plot
function, the helpers of its module and every ``resdyn`` module that module imports, but not the
other figure functions of the module: it keys the render cache (:mod:`resdyn.plots.render`), so
editing one figure re-renders that figure only.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

from resdyn.provenance.codeversion import PACKAGE_DIR, import_closure, module_file

__all__ = [
    "FigureSpec",
    "FIGURES",
    "SCOPES",
    "TRAJECTORY_SCOPES",
    "CATEGORIES",
    "by_name",
    "of_scope",
    "studies_on",
    "enabled",
    "not_drawn",
    "require_studies",
    "output_path",
    "input_paths",
    "trajectory_inputs",
    "figure_code_version",
]

SCOPES = ("ckpt", "lens", "model", "zoo", "global", "trajectory", "lens_trajectory")
#: Scopes whose figures read each input for every (model, checkpoint) of the run.
TRAJECTORY_SCOPES = ("trajectory", "lens_trajectory")

#: Every trajectory figure also reads each checkpoint's integrity record: duplicates are marked.
INTEGRITY = "models/{model}/{ckpt}/integrity.json"

#: Report categories: one per stage of the pipeline (the table rules use the same names).
CATEGORIES = ("Zoo", "Study A", "Study B", "Beyond the studies")

_CKPT = "results/{model}/{ckpt}"


@dataclass(frozen=True)
class FigureSpec:
    """One figure: what it reads, how it is drawn, where it goes in the report."""

    name: str  #: file stem of the PNG/PDF
    scope: str  #: one of :data:`SCOPES`
    inputs: tuple[str, ...]  #: artifact path templates ({model}, {ckpt}); the plot function's positional args
    plot: str  #: ``"module:function"`` in ``resdyn.plots``
    caption: str
    category: str  #: report category (one of :data:`CATEGORIES`)
    subcategory: str
    studies: frozenset[str]  #: studies whose outputs it draws on ("A", "B"; the bridge both)

    @property
    def module(self) -> str:
        return f"resdyn.plots.{self.plot.split(':')[0]}"

    @property
    def function(self) -> str:
        return self.plot.split(":")[1]


A, B, AB, NONE = frozenset("A"), frozenset("B"), frozenset("AB"), frozenset()

FIGURES: tuple[FigureSpec, ...] = (
    # --- the zoo
    FigureSpec(
        "training",
        "zoo",
        ("models/{model}/training.tsv",),
        "zoo:training_curve",
        "Zoo training: train and held-out loss vs unigram baseline",
        "Zoo",
        "training",
        NONE,
    ),
    # --- study A, per checkpoint
    FigureSpec(
        "eigenvalues",
        "ckpt",
        (f"{_CKPT}/spectra.h5",),
        "study_a_spectra:eigenvalue_grid",
        "Eigenvalues of each sublayer's mean Jacobian in the complex plane (unit circle drawn)",
        "Study A",
        "spectra",
        A,
    ),
    FigureSpec(
        "operator",
        "ckpt",
        (f"{_CKPT}/spectra.tsv",),
        "study_a_spectra:operator_profile",
        "Operator type vs depth: complex fraction, Henrici departure, self-alignment",
        "Study A",
        "spectra",
        A,
    ),
    FigureSpec(
        "funnel",
        "ckpt",
        (f"{_CKPT}/bottleneck.tsv",),
        "study_a_spectra:funnel",
        "Cumulative bottleneck: effective rank of P_s = J_s ... J_0 vs depth",
        "Study A",
        "spectra",
        A,
    ),
    FigureSpec(
        "schur",
        "ckpt",
        (f"{_CKPT}/schur.tsv",),
        "study_a_spectra:schur_curves",
        "Schur surgery: cumulative effective rank of J(alpha) = Q(Lambda + alpha N)Q* per alpha",
        "Study A",
        "spectra",
        A,
    ),
    FigureSpec(
        "communities",
        "ckpt",
        (f"{_CKPT}/communities_summary.tsv",),
        "study_a_topology:community_sizes",
        "Signed Leiden community sizes per residual boundary",
        "Study A",
        "topology",
        A,
    ),
    FigureSpec(
        "coupling",
        "ckpt",
        (f"{_CKPT}/coupling.tsv",),
        "study_a_topology:coupling_profile",
        "Topology-dynamics coupling effect per boundary (filled: FDR-significant)",
        "Study A",
        "topology",
        A,
    ),
    FigureSpec(
        "coupling_henrici",
        "ckpt",
        (f"{_CKPT}/coupling.tsv",),
        "study_a_topology:coupling_vs_henrici",
        "Coupling effect vs Henrici departure of the sublayer (Spearman rho)",
        "Study A",
        "topology",
        A,
    ),
    # --- study A, per model
    # --- study A, across checkpoints and models
    FigureSpec(
        "trajectory_a",
        "trajectory",
        (f"{_CKPT}/bootstrap.tsv", INTEGRITY),
        "trajectory:study_a_trajectory",
        "Study A whole-model statistics vs training step, all models (bootstrap percentile intervals)",
        "Study A",
        "across checkpoints",
        A,
    ),
    FigureSpec(
        "checkpoints",
        "model",
        ("results/{model}/checkpoints.tsv",),
        "study_a_spectra:checkpoint_comparison",
        "Study A metrics vs depth, one line per checkpoint (step 0 = null)",
        "Study A",
        "checkpoints",
        A,
    ),
    FigureSpec(
        "significant",
        "model",
        ("results/{model}/coupling_counts.tsv",),
        "study_a_topology:significant_counts",
        "FDR-significant coupling layers per checkpoint (Simes over a layer's boundaries, BH over layers)",
        "Study A",
        "topology",
        A,
    ),
    FigureSpec(
        "partitions",
        "model",
        ("results/{model}/partition_similarity.tsv",),
        "study_a_topology:partition_similarity_plot",
        "Communities across checkpoints: NMI and adjusted Rand vs the final and the first checkpoint, "
        "and signed modularity, per boundary",
        "Study A",
        "topology",
        A,
    ),
    # --- study B, per lens checkpoint
    FigureSpec(
        "lens",
        "lens",
        (f"{_CKPT}/lens_metrics.tsv", f"{_CKPT}/lens"),
        "study_b:lens_curves",
        "Tuned vs logit lens: KL, cross-entropy, Hit@1, Hit@5 per layer; the fit's held-out KL against "
        "training tokens seen (converged when flat at its end)",
        "Study B",
        "lens",
        B,
    ),
    FigureSpec(
        "rss",
        "lens",
        (f"{_CKPT}/rss.tsv", f"{_CKPT}/phases.json"),
        "study_b:rss_profile_plot",
        "RSS profile per k with Kneedle phase cuts",
        "Study B",
        "readout",
        B,
    ),
    FigureSpec(
        "resolution",
        "lens",
        (f"{_CKPT}/resolution.tsv",),
        "study_b:resolution_frontier",
        "Resolution sweep: energy vs visibility, Pareto frontier",
        "Study B",
        "readout",
        B,
    ),
    FigureSpec(
        "phase_metrics",
        "lens",
        (f"{_CKPT}/geometry.tsv", f"{_CKPT}/phases.json"),
        "study_b:phase_metric_profiles",
        "Phase metrics vs depth with the three phases shaded",
        "Study B",
        "phases",
        B,
    ),
    # --- study B, across checkpoints and models
    FigureSpec(
        "trajectory_b",
        "lens_trajectory",
        (f"{_CKPT}/phase_metrics.tsv", INTEGRITY),
        "trajectory:study_b_trajectory",
        "Study B phase metrics vs training step, all models (mean +/- sd over the layers of each phase)",
        "Study B",
        "across checkpoints",
        B,
    ),
    # --- study B, across models
    FigureSpec(
        "phase_widths",
        "global",
        ("results/scaling/widths.tsv", "results/scaling/phase_widths.tsv"),
        "study_b:phase_width_scaling",
        "Phase width vs depth with OLS slope and 95% CI",
        "Study B",
        "phases",
        B,
    ),
    # --- beyond the two studies
    FigureSpec(
        "bridge",
        "lens",
        (f"{_CKPT}/bridge.tsv", f"{_CKPT}/phases.json"),
        "bridge:bridge_profiles",
        "Study A and B profiles on one depth axis: RSS, Jacobian transport of readout subspaces vs random, "
        "operator type, cumulative rank",
        "Beyond the studies",
        "bridge",
        AB,
    ),
    FigureSpec(
        "causal",
        "lens",
        (f"{_CKPT}/causal.tsv",),
        "bridge:causal_effects",
        "Causal test: KL and top-1 flips after projecting off / patching the readout subspace vs random subspaces",
        "Beyond the studies",
        "causal",
        B,
    ),
    FigureSpec(
        "uncertainty",
        "ckpt",
        (f"{_CKPT}/bootstrap.tsv",),
        "bridge:uncertainty_bands",
        "Bootstrap percentile intervals (over samples) of the Jacobian metrics vs depth",
        "Beyond the studies",
        "uncertainty",
        A,
    ),
)


def _check_catalogue() -> None:
    names = [f.name for f in FIGURES]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"figure catalogue: duplicate names {dup}")
    for f in FIGURES:
        if f.scope not in SCOPES or f.category not in CATEGORIES or not f.studies <= set("AB"):
            raise ValueError(
                f"figure catalogue: {f.name}: scope {f.scope!r} (allowed {SCOPES}), category "
                f"{f.category!r} (allowed {CATEGORIES}), studies {sorted(f.studies)} (allowed A, B)"
            )


_check_catalogue()


def by_name(name: str) -> FigureSpec:
    """The catalogue entry of figure ``name``; ValueError naming the known figures otherwise."""
    for f in FIGURES:
        if f.name == name:
            return f
    raise ValueError(f"unknown figure {name!r}; known: {', '.join(f.name for f in FIGURES)}")


def studies_on(config: dict) -> set[str]:
    """Studies switched on by config key ``studies`` (both when absent)."""
    return set(config.get("studies", ("A", "B")))


def trajectory_off(config: dict, spec: FigureSpec) -> str:
    """Why a trajectory figure of ``spec`` is not drawn, "" when it is (or ``spec`` is no
    trajectory figure): every model has fewer than two checkpoints (``lens_trajectory``: fewer
    than two with a tuned lens), so there is no trajectory to draw."""
    if spec.scope not in TRAJECTORY_SCOPES or not config.get("models"):
        return ""
    from resdyn.pipeline import config as rc

    lens = spec.scope == "lens_trajectory"
    of = rc.lens_checkpoints if lens else rc.checkpoints
    try:
        most = max(len(of(config, m)) for m in config["models"])
    except (KeyError, TypeError):  # a partial config (a unit test): no checkpoint list to count
        return ""
    if most >= 2:
        return ""
    what = " with a tuned lens (config lens.checkpoints: final)" if lens else ""
    return f"every model has {most} checkpoint(s){what}; a trajectory needs at least 2"


def not_drawn(config: dict) -> list[str]:
    """One line per trajectory figure whose studies run but which is not drawn, saying why
    (:func:`trajectory_off`), e.g. "figure trajectory_b is not drawn: every model has 1
    checkpoint(s) with a tuned lens (config lens.checkpoints: final); a trajectory needs at least 2".
    """
    out = []
    for spec in FIGURES:
        why = trajectory_off(config, spec)
        if why and spec.studies <= studies_on(config):
            out.append(f"figure {spec.name} is not drawn: {why}")
    return out


def enabled(config: dict, spec: FigureSpec) -> bool:
    """Whether every study ``spec`` draws on runs (and, for the scaling figures, a
    ``scaling.groups`` entry exists: with none, the scaling tables are not scheduled; for a
    trajectory figure, some model has two checkpoints: :func:`trajectory_off`)."""
    if spec.scope == "global" and not (config.get("scaling") or {}).get("groups"):
        return False
    if trajectory_off(config, spec):
        return False
    return spec.studies <= studies_on(config)


def of_scope(scope: str, config: dict | None = None) -> tuple[FigureSpec, ...]:
    """The figures of ``scope`` in catalogue order; with ``config``, only those whose studies run."""
    if scope not in SCOPES:
        raise ValueError(f"unknown figure scope {scope!r}; allowed: {', '.join(SCOPES)}")
    return tuple(f for f in FIGURES if f.scope == scope and (config is None or enabled(config, f)))


def require_studies(config: dict, name: str, path: str = "") -> None:
    """Stop with one line when figure ``name`` needs a study that ``config['studies']`` leaves out."""
    from resdyn.pipeline.config import ConfigError

    missing = sorted(by_name(name).studies - studies_on(config))
    where = f" ({path})" if path else ""
    why = trajectory_off(config, by_name(name))
    if why and not missing:
        raise ConfigError(f"figure {name!r}{where} is not drawn: {why}")
    if missing:
        raise ConfigError(
            f"config key 'studies': {config['studies']} leaves out study {' and '.join(missing)}, which figure "
            f"{name!r}{where} needs; add it to studies or do not request this figure"
        )


def output_path(spec: FigureSpec, ext: str = "png", **wildcards: str) -> str:
    """``results/figures/…/<name>.<ext>`` of ``spec``; wildcards not given stay as ``{model}``/``{ckpt}``."""
    folder = {
        "ckpt": "{model}/{ckpt}/",
        "lens": "{model}/{ckpt}/",
        "model": "{model}/",
        "zoo": "{model}/",
        "global": "scaling/",
        "trajectory": "trajectory/",
        "lens_trajectory": "trajectory/",
    }[spec.scope]
    path = f"results/figures/{folder}{spec.name}.{ext}"
    for key, value in wildcards.items():
        path = path.replace("{" + key + "}", value)
    return path


def input_paths(spec: FigureSpec, **wildcards: str) -> list[str]:
    """The artifacts ``spec`` reads, with ``{model}``/``{ckpt}`` filled in."""
    return [p.format(**wildcards) for p in spec.inputs]


def trajectory_inputs(spec: FigureSpec, pairs: list[tuple[str, str]]) -> list[str]:
    """The artifacts a trajectory figure reads: each template for every (model, ckpt) of ``pairs``,
    template by template (the order :func:`resdyn.plots.render.render` groups them back by)."""
    return [t.format(model=m, ckpt=c) for t in spec.inputs for m, c in pairs]


# --- a figure's own code version -------------------------------------------------------------


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


@functools.lru_cache(maxsize=256)
def _figure_code(name: str, package_dir: Path, stamp: tuple) -> str:
    spec = by_name(name)
    path = module_file(spec.module, package_dir)
    if path is None:
        raise ValueError(f"figure {name!r}: module {spec.module} not found under {package_dir}")
    tree = ast.parse(path.read_bytes(), filename=str(path))
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if spec.function not in defs:
        raise ValueError(f"figure {name!r}: {spec.module} defines no function {spec.function}")
    # Other figure functions of the module drop out unless this one reaches them.
    others = {f.function for f in FIGURES if f.module == spec.module} - {spec.function}
    keep, todo = {spec.function}, [spec.function]
    while todo:
        for ref in _names(defs[todo.pop()]) & others - keep:
            keep.add(ref)
            todo.append(ref)
    tree.body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name in others - keep)]
    h = hashlib.sha256(ast.unparse(tree).encode())
    for mod in sorted(_closure(spec.module, package_dir) - {spec.module}):
        h.update(b"\0" + mod.encode() + b"\0" + module_file(mod, package_dir).read_bytes())
    return h.hexdigest()[:16]


def figure_code_version(name: str, package_dir: Path | str = PACKAGE_DIR) -> str:
    """Short hash of the code that draws figure ``name`` (16 hex digits).

    It covers the figure's module with the other catalogue figure functions removed (unless this
    figure's function calls them), as parsed code (comments and formatting do not count), and
    the source of :data:`RENDER_MODULE` and of every ``resdyn`` module these two import,
    transitively.
    """
    package_dir = Path(package_dir).resolve()
    files = [module_file(m, package_dir) for m in sorted(_closure(by_name(name).module, package_dir))]
    stamp = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files if f is not None)
    return _figure_code(name, package_dir, stamp)


#: The module that loads a figure's inputs and saves it: part of every figure's code.
RENDER_MODULE = "resdyn.plots.render"


def _closure(module: str, package_dir: Path) -> set[str]:
    """``module``, the render module and every ``resdyn`` module either imports, transitively."""
    out = {module, RENDER_MODULE}
    for mod in (module, RENDER_MODULE):
        path = module_file(mod, package_dir)
        if path is None:
            raise ValueError(f"figure code: module {mod} not found under {package_dir}")
        out |= import_closure(path, package_dir)
    return out
