"""resdyn in a notebook: the engines of both studies on an in-memory model, one function each.

Every function here is a thin wrapper over the engine the pipeline runs (named in its docstring),
with the pipeline's defaults: a default that the config schema has (``resdyn/schemas/config.schema.yaml``)
is read from it, so a call without options computes what a default run writes. The formulas are
those of docs/design.md ("Definitions"); docs/library.md shows each function with its output.

Study A (a model and token ids in, numpy and pandas out)::

    J = sublayer_jacobians(model, ids)                 # {(layer, "attn" | "mlp"): (d, d)}
    spectrum(J[0, "attn"]); operator_metrics(J[0, "attn"])
    spectra_table(J); bottleneck(J); schur_bottleneck(J); schur_surgery(J[0, "mlp"], 0.5)
    acts = boundary_activations(model, ids_batch)     # {(layer, "pre_attn" | "pre_mlp"): (tokens, d)}
    parts = {b: communities(X)[0] for b, X in acts.items()}
    coupling(parts, J)                                 # boundary vs interior gain, BH q-values

Study B (a trained or loaded lens in)::

    lens = train_lens(model, ids_batch)                # lens.save(dir), lens.export_tuned_lens(dir)
    lens = load_lens(dir, model); lens = import_tuned_lens(dir, model)
    readout_subspaces(lens); rss_profile(lens); resolution_sweep(lens); phases(lens)

Bad input (a tensor of the wrong shape, a model of an unsupported family, a lens fitted through
another model's readout) raises one ValueError naming the argument and what was expected; the
engines' own checks, where they have one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from resdyn import io
from resdyn.lm import structure
from resdyn.numerics.checks import is_int
from resdyn.numerics.linalg import k_from_fraction
from resdyn.study_a import activations as _activations
from resdyn.study_a import jacobian as _jacobian
from resdyn.study_a import schur as _schur
from resdyn.study_a import spectral as _spectral
from resdyn.study_a import topology as _topology
from resdyn.study_b import lens as _lens
from resdyn.study_b import lens_import as _lens_import
from resdyn.study_b import phases as _phases
from resdyn.study_b import readout as _readout
from resdyn.study_b.lens import Lens
from resdyn.study_b.phases import Cutpoints

__all__ = [
    "Cutpoints",
    "Lens",
    "boundary_activations",
    "bottleneck",
    "communities",
    "coupling",
    "import_tuned_lens",
    "load_lens",
    "operator_metrics",
    "phases",
    "readout_subspaces",
    "resolution_sweep",
    "rss_profile",
    "schur_bottleneck",
    "schur_surgery",
    "spectra_table",
    "spectrum",
    "sublayer_jacobians",
    "train_lens",
    "translators",
]

# The config schema's defaults: the values a run without these keys uses.
_JACOBIAN = io.schema_defaults("jacobian")
_ACTIVATIONS = io.schema_defaults("activations")
_SPECTRA = io.schema_defaults("spectra")
_SCHUR = io.schema_defaults("schur")
_TOPOLOGY = io.schema_defaults("topology")
_READOUT = io.schema_defaults("readout")
_PHASES = io.schema_defaults("phases")
_LENS = io.schema_defaults("lens")
_SEED: int = io.read_config_schema()["properties"]["seed"]["default"]  # every stage seed not given

#: A Lens, or its translator matrices A_0 … A_{n−1} (each (d, d)).
LensLike = Lens | Sequence[np.ndarray]
#: {(layer, kind): (d, d) matrix}, as :func:`sublayer_jacobians` returns, or a list in sublayer order.
Jacobians = Mapping[tuple[int, str], Any] | Sequence[Any]


# ----------------------------------------------------------------------------------------------
# Study A: Jacobians and their spectra
# ----------------------------------------------------------------------------------------------


def _one_sample(input_ids: Any) -> torch.Tensor:
    """Token ids of one sample as a (T,) LongTensor; (1, T) is taken as that sample."""
    ids = torch.as_tensor(input_ids)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"input_ids: expected integer token ids, got dtype {ids.dtype}")
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"input_ids: expected one sample of token ids, shape (T,) or (1, T), got {tuple(ids.shape)}")
    return ids.long()


def _samples(input_ids: Any, name: str = "input_ids") -> np.ndarray:
    """Token ids of N samples as an (N, T) int64 array; (T,) is one sample."""
    ids = np.asarray(input_ids.cpu() if isinstance(input_ids, torch.Tensor) else input_ids)
    if ids.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected integer token ids, got dtype {ids.dtype}")
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.size == 0:
        raise ValueError(f"{name}: expected token ids of shape (N, T) or (T,), got {ids.shape}")
    return ids.astype(np.int64, copy=False)


def sublayer_jacobians(
    model: nn.Module,
    input_ids: torch.Tensor | np.ndarray | Sequence[int],
    positions: int | str | Sequence[int] | None = _JACOBIAN["positions"],
    *,
    layers: Sequence[int] | None = None,
) -> dict[tuple[int, str], np.ndarray]:
    """Exact Jacobian of every sublayer at token positions of one sample.

    For layer L, position t and kind ``attn`` (h_L → m_L) or ``mlp`` (m_L → h_{L+1})::

        J = ∂ out[t] / ∂ in[t]     (d × d, J[i, j] = ∂ out_i / ∂ in_j)

    with the other positions held fixed (their keys and values frozen), differentiated in fp32
    (:func:`resdyn.study_a.jacobian.sublayer_jacobians`, the pipeline's engine; docs/design.md,
    "Sublayers and boundaries"). A parallel-residual layer (GPT-NeoX/Pythia) gives kind
    ``layer`` (the operator I + J_A + J_F) and the branches ``attn_branch``, ``mlp_branch``.

    Args:
        model: a causal LM of a supported family (README, "Supported architectures"), eval mode.
        input_ids: one sample's token ids, (T,) or (1, T).
        positions: ``"last"`` (the pipeline's default) or an int: each J is (d, d); ``"all"`` or a
            list of ints: each J is (P, d, d), in the order given.
        layers: the layers to differentiate (default all).
    Returns:
        {(layer, kind): float32 array}.
    """
    ids = _one_sample(input_ids)
    jacs = _jacobian.sublayer_jacobians(model, ids, positions, layers=layers)
    single = positions is None or positions == "last" or is_int(positions)
    return {key: (j[0] if single else j).cpu().numpy() for key, j in jacs.items()}


def spectrum(J: Any) -> dict[str, np.ndarray]:
    """Eigenvalues λ of J, singular values σ of J and of J − I (:func:`resdyn.study_a.spectral.spectrum`).

    Returns ``eigenvalues`` (d,) complex128 by descending |λ|, ``singular_values`` and
    ``singular_values_JmI`` (d,) float64, descending: the arrays of ``spectra.h5``.
    """
    return _spectral.spectrum(J)


def operator_metrics(
    J: Any,
    *,
    k_fraction: float = _SPECTRA["k_fraction"],
    tolerances: Sequence[float] = tuple(_SPECTRA["complex_tolerances"]),
) -> dict[str, Any]:
    """Every operator metric of one matrix, one row of ``spectra.tsv``
    (:func:`resdyn.study_a.spectral.sublayer_metrics`).

    With eigenvalues λ, SVD J = U Σ Vᵀ and N the strictly upper part of the Schur factor:
    ``henrici`` ‖N‖_F / ‖J‖_F (``henrici_JmI``: / ‖J − I‖_F); ``symmetry`` ‖J − Jᵀ‖_F / ‖J‖_F;
    ``complex_frac_J_tol{t}`` share with |Im λ| > t·max(1, |λ|) and ``complex_frac_JmI_tol{t}`` share
    with |Im λ| > t·|λ − 1|; ``expansive_frac_eig`` share |λ| > 1, ``expansive_frac_sv`` share σ > 1;
    ``spectral_radius`` max|λ|; ``condition_number`` σ_max/σ_min; ``self_alignment_k*``
    ‖U_kᵀ V_k‖_F² / k at k = clip(⌊k_fraction·d + 1/2⌋, 1, d), 1 and round(erank); ``erank_J`` exp(−Σ p log p) with
    p = σ/Σσ, ``pr_J`` (Σσ²)²/Σσ⁴, and both for J − I.

    Args:
        J: (d, d) matrix.
        k_fraction: the self-alignment k as a share of d (config ``spectra.k_fraction``).
        tolerances: complex-fraction tolerances (config ``spectra.complex_tolerances``).
    """
    return _spectral.sublayer_metrics(J, k_fraction, tolerances)


def _operators(jacobians: Jacobians, what: str = "jacobians") -> Mapping[tuple[int, str], Any]:
    """The sublayer chain of ``jacobians``: a mapping without the parallel layers' branch
    Jacobians; a list in sublayer order s = 0, 1, … keyed (s // 2, attn | mlp)."""
    if isinstance(jacobians, Mapping):
        return {key: J for key, J in jacobians.items() if not (isinstance(key, tuple) and key[-1] in _BRANCHES)}
    if isinstance(jacobians, (str, bytes)) or not isinstance(jacobians, (Sequence, np.ndarray)):
        raise ValueError(
            f"{what}: expected {{(layer, kind): (d, d)}} or a list of (d, d), got {type(jacobians).__name__}"
        )
    if len(jacobians) % 2:
        raise ValueError(
            f"{what}: a list is read as sublayers s = 0..S−1 (attn, mlp of each layer) and needs an even length, "
            f"got {len(jacobians)}; pass a mapping {{(layer, kind): J}} for other chains"
        )
    return {(s // 2, _spectral.KINDS[s % 2]): J for s, J in enumerate(jacobians)}


#: The branch Jacobians of a parallel-residual layer: beside its operator, not in the chain.
_BRANCHES = set(_jacobian.PARALLEL_KINDS) - set(_spectral.OPERATOR_KINDS)


def spectra_table(
    jacobians: Jacobians,
    *,
    k_fraction: float = _SPECTRA["k_fraction"],
    tolerances: Sequence[float] = tuple(_SPECTRA["complex_tolerances"]),
) -> pd.DataFrame:
    """``spectra.tsv``: :func:`operator_metrics` of every sublayer, one row each, ordered by depth
    s = 2L (attn), 2L + 1 (mlp, or a parallel layer's operator) (:func:`resdyn.study_a.spectral.spectra_table`).

    Args:
        jacobians: {(layer, kind): (d, d)} (branch Jacobians of parallel layers are left out) or
            a list in sublayer order.
        k_fraction, tolerances: as :func:`operator_metrics`.
    """
    table, _ = _spectral.spectra_table(_operators(jacobians), k_fraction=k_fraction, tolerances=tolerances)
    return table


def bottleneck(jacobians: Jacobians) -> pd.DataFrame:
    """The cumulative bottleneck: ranks of P_s = J_s J_{s−1} ⋯ J_0 along depth (``bottleneck.tsv``).

    ``erank`` = exp(−Σ p_i log p_i), p = σ(P_s)/Σσ(P_s); ``participation_ratio`` (Σσ²)²/Σσ⁴;
    ``log10_fro`` log10 ‖P_s‖_F (the product is formed in float64 and rescaled each step);
    ``erank_single``, ``pr_single`` of J_s alone (:func:`resdyn.study_a.spectral.bottleneck_table`).

    Args:
        jacobians: {(layer, kind): (d, d)} forming the chain h_0 → h_n, or a list of 2n matrices
            in sublayer order (attn, mlp of layer 0, then layer 1, …).
    """
    return _spectral.bottleneck_table(_operators(jacobians))


def schur_surgery(J: Any, alpha: float, *, form: str = "auto") -> np.ndarray:
    """J(α): the non-normal part of J scaled by α, its eigenvalues kept (:func:`resdyn.study_a.schur.scale_nonnormal`).

    Complex form J = Q (Λ + N) Q^H ⇒ J(α) = Q (Λ + αN) Q^H; for real J the real Schur form,
    whose 2×2 blocks are rescaled so that J(α) stays real. J(1) = J, J(0) is normal and
    ‖J(α)‖_F² = Σ|λ|² + α²‖N‖_F².

    Args:
        J: (d, d) matrix. alpha: a finite real. form: ``auto`` (real for real J), ``real``, ``complex``.
    """
    return _schur.scale_nonnormal(J, alpha, form)


def schur_bottleneck(
    jacobians: Jacobians, *, alphas: Sequence[float] = tuple(_SCHUR["alphas"]), form: str = "auto"
) -> pd.DataFrame:
    """Bottleneck curves of the surgically altered chain: ranks of P_s(α) = J_s(α) ⋯ J_0(α) per α
    (``schur.tsv``, :func:`resdyn.study_a.schur.schur_bottleneck`).

    Columns ``alpha, s, layer, kind, erank, pr, log10_fro, henrici_single`` (the Henrici departure
    of J_s(α): α‖N‖_F / sqrt(Σ|λ|² + α²‖N‖_F²)); α = 1 is the plain :func:`bottleneck`.

    Args:
        jacobians: as :func:`bottleneck`. alphas: distinct reals (config ``schur.alphas``).
        form: as :func:`schur_surgery`.
    """
    return _schur.schur_bottleneck(_operators(jacobians), alphas, form)


# ----------------------------------------------------------------------------------------------
# Study A: activation communities and their coupling to Jacobian gain
# ----------------------------------------------------------------------------------------------


def boundary_activations(
    model: nn.Module,
    input_ids: torch.Tensor | np.ndarray,
    *,
    skip_positions: int = _ACTIVATIONS["skip_positions"],
) -> dict[tuple[int, str], np.ndarray]:
    """Residual states at every boundary, tokens × units, as the communities are built from.

    Boundary ``pre_attn`` of layer L is h_L (entering it), ``pre_mlp`` is m_L (before its MLP
    half; a parallel-residual layer has only h_L), from the sublayer split the Jacobians
    differentiate (:func:`resdyn.study_a.activations.collect_boundary_states`). The first
    ``skip_positions`` tokens of each sample are left out (config ``activations.skip_positions``).

    Args:
        model: a causal LM of a supported family.
        input_ids: (N, T) token ids (or (T,): one sample).
    Returns:
        {(layer, boundary): float32 (N·(T − skip_positions), d)}.
    """
    ids = _samples(input_ids)
    states = _activations.collect_boundary_states(model, ids, skip_positions, progress=False)
    d = states.shape[-1]
    names = ("pre_attn",) if structure.residual_kind(model) == "parallel" else tuple(_topology.BOUNDARY_KIND)
    n_layers = (states.shape[1] - 1) // 2
    return {
        (layer, name): states[:, 2 * layer + i].reshape(-1, d)
        for layer in range(n_layers)
        for i, name in enumerate(names)
    }


def communities(
    activations: Any,
    *,
    top_k: int = _TOPOLOGY["top_k"],
    min_abs_r: float = _TOPOLOGY["min_abs_r"],
    resolution: float | Sequence[float] = _TOPOLOGY["resolution"],
    seed: int = _SEED,
    boundary_rule: str = _TOPOLOGY["boundary_rule"],
    participation_quantile: float = _TOPOLOGY["participation_quantile"],
    boundary_min_other: int = _TOPOLOGY["boundary_min_other"],
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Signed Leiden communities and boundary units of one boundary (:func:`resdyn.study_a.topology.analyse_boundary`).

    Pearson correlation of the units over tokens, sparsified to the top-k |r| per unit, signed;
    Leiden CPM on the positive layer with the negative layer weighted −1; a boundary unit has
    positive neighbours in ≥ ``boundary_min_other`` (default 2) other communities
    (``boundary_rule="participation"``: the top participation-coefficient quantile). Defaults: the
    config's ``topology`` section.

    Args:
        activations: (tokens, units), e.g. one entry of :func:`boundary_activations`.
    Returns:
        (units, summary): units has ``unit, community, is_boundary, participation, …`` (one
        boundary of ``communities/layer{L:03d}.tsv``); summary the ``communities_summary.tsv`` row.
    """
    return _topology.analyse_boundary(
        activations,
        top_k=top_k,
        min_abs_r=min_abs_r,
        resolution=resolution,
        seed=seed,
        boundary_rule=boundary_rule,
        participation_quantile=participation_quantile,
        min_other=boundary_min_other,
    )


def coupling(
    partitions: Mapping[tuple[int, str], pd.DataFrame] | pd.DataFrame,
    jacobians: Mapping[tuple[int, str], Any],
    *,
    gain: str = _TOPOLOGY["gain"],
    fdr_q: float = _TOPOLOGY["fdr_q"],
    spectra: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Do a partition's boundary units carry other Jacobian gain than its interior units? (``coupling.tsv``)

    Unit gain g_i = ‖J e_i‖ (``gain="J_minus_I"``: ‖(J − I) e_i‖) with J the Jacobian that reads
    the boundary (pre_attn of layer L: (L, 'attn'); pre_mlp: (L, 'mlp')); per boundary the effect
    log(median g_boundary / median g_interior), the rank-biserial correlation and the two-sided
    Mann–Whitney p; Benjamini–Hochberg q over the boundaries, ``significant`` q ≤ ``fdr_q``
    (:func:`resdyn.study_a.topology.coupling_from_tables`).

    Args:
        partitions: {(layer, boundary): units table of :func:`communities`}, or one table with
            columns ``layer, boundary, unit, is_boundary``.
        jacobians: {(layer, kind): (d, d)}, e.g. :func:`sublayer_jacobians`.
        gain, fdr_q: config ``topology.gain``, ``topology.fdr_q``.
        spectra: :func:`spectra_table` of the same Jacobians, to carry each sublayer's Henrici
            departure along (NaN without it).
    """
    if isinstance(partitions, Mapping):
        if not partitions:
            raise ValueError("partitions: empty; expected {(layer, boundary): units table}")
        table = pd.concat(
            [units.assign(layer=int(layer), boundary=str(b)) for (layer, b), units in partitions.items()],
            ignore_index=True,
        )
    else:
        table = partitions
    if not isinstance(table, pd.DataFrame):
        raise ValueError(f"partitions: expected a DataFrame or {{(layer, boundary): DataFrame}}, got {type(table)}")
    return _topology.coupling_from_tables(
        table, jacobians, pd.DataFrame() if spectra is None else spectra, gain=gain, q_level=fdr_q
    )


# ----------------------------------------------------------------------------------------------
# Study B: the tuned lens
# ----------------------------------------------------------------------------------------------


def train_lens(
    model: nn.Module,
    input_ids: torch.Tensor | np.ndarray,
    *,
    heldout_ids: torch.Tensor | np.ndarray | None = None,
    **options: Any,
) -> Lens:
    """Train one affine translator per layer, T_L(h) = h + W_L h + b_L (W, b from 0), by distillation
    KL(p_final ‖ p_lens) through the model's own final norm and unembedding
    (:func:`resdyn.study_b.lens.train_lens`, the pipeline's trainer).

    Batches are consecutive rows of ``input_ids``, ``tokens_per_step // T`` rows each, as the
    pipeline's lens rule cuts them. Defaults of every option are the pipeline's (the config
    schema's ``lens`` section, :class:`resdyn.study_b.lens.LensOptions`); without ``heldout_ids``
    training runs all ``steps`` and no layer is reported converged.

    Args:
        model: a causal LM.
        input_ids: (N, T) training token ids. heldout_ids: (M, T) for the held-out KL and the
            convergence rule.
        options: :class:`resdyn.study_b.lens.LensOptions` fields (``steps``, ``lr``, ``seed``,
            ``progress``, …) and :func:`resdyn.study_b.lens.train_lens`'s keywords (``checkpoint``, ``model_id``, …).
    Returns:
        :class:`Lens`: ``lens.save(dir)`` writes the lens folder, ``lens.export_tuned_lens(dir)``
        tuned-lens's format; ``lens.translator_matrix(L)`` is A_L = I + W_L.
    """
    ids = _samples(input_ids)
    tokens = options.get("tokens_per_step", _lens.LensOptions.tokens_per_step)
    batch = max(1, tokens // ids.shape[1]) if tokens else ids.shape[0]
    heldout = None if heldout_ids is None else _lens.token_batches(_samples(heldout_ids, "heldout_ids"), batch)
    return _lens.train_lens(model, _lens.token_batches(ids, batch), heldout_batches=heldout, **options)


def load_lens(directory: str | Path, model: nn.Module) -> Lens:
    """A lens folder written by ``Lens.save`` (or the pipeline's ``results/{model}/{ckpt}/lens``),
    bound to ``model`` (:meth:`resdyn.study_b.lens.Lens.load`).

    Raises ValueError when the model's readout (head, final norm, softcap: its hash), layer count
    or width differ from those the lens was trained through.
    """
    return Lens.load(directory, model)


def import_tuned_lens(
    path: str | Path,
    model: nn.Module,
    *,
    repo: str | None = None,
    revision: str | None = None,
    repo_type: str = _LENS["repo_type"],
) -> Lens:
    """A lens in EleutherAI tuned-lens's format (``params.pt`` + ``config.json``), bound to ``model``
    (:func:`resdyn.study_b.lens_import.import_tuned_lens`; the translator ``h + W h + b`` is ours exactly).

    ``path`` is the folder, or with ``repo`` the folder inside that hub repository (e.g.
    ``lens/pythia-160m-deduped`` in the Space ``AlignmentResearch/tuned-lens``), read from the
    Hugging Face cache. Raises ValueError when the lens's layer count or width differ from the
    model's or its recorded ``unembed_hash`` is not the model's unembedding's.
    """
    folder = _lens_import.fetch_tuned_lens(str(path), repo, revision, repo_type)
    return _lens_import.import_tuned_lens(folder, model)


def translators(lens: LensLike) -> list[np.ndarray]:
    """The translator matrices A_L = I + W_L, L = 0 … n−1, float64 (d, d) (``Lens.translator_matrix``):
    the pipeline's readout input (the identity at index n carries no subspace and is left out)."""
    if isinstance(lens, Lens):
        return [lens.translator_matrix(layer) for layer in range(lens.n_layers)]
    return list(lens)


def readout_subspaces(lens: LensLike, k: int | None = None) -> list[np.ndarray]:
    """Readout subspaces S_L^(k): the top-k right singular vectors of each A_L, (d, k) orthonormal
    (:func:`resdyn.study_b.readout.readout_subspace`).

    Args:
        lens: a :class:`Lens` or its translators. k: the dimension (default: config
            ``readout.phase_k_fraction`` of d, the k the phases are cut at).
    """
    mats = translators(lens)
    if not mats:
        raise ValueError("lens: no translators")
    d = np.shape(mats[0])[-1]
    k = k_from_fraction(d, _READOUT["phase_k_fraction"]) if k is None else k
    return [_readout.readout_subspace(A, k) for A in mats]


def _ks(mats: list[np.ndarray], k_fractions: Sequence[float]) -> list[int]:
    d = np.shape(mats[0])[-1] if mats else 0
    return sorted({k_from_fraction(d, f) for f in k_fractions})


def rss_profile(lens: LensLike, *, k_fractions: Sequence[float] = tuple(_READOUT["k_fractions"])) -> pd.DataFrame:
    """``rss.tsv``: RSS_L(k) = (1/k) Σ cos θ_i, θ the principal angles between S_L^(k) and S_{L+1}^(k),
    with the Grassmann distance sqrt(Σθ²) and the top-k energy share of A_L, for L = 0 … n−2 and
    every distinct k = k_from_fraction(d, f) (:func:`resdyn.study_b.readout.rss_profile`).

    Args:
        lens: a :class:`Lens` or its translators. k_fractions: config ``readout.k_fractions``.
    """
    mats = translators(lens)
    return _readout.rss_profile(mats, _ks(mats, k_fractions))


def resolution_sweep(lens: LensLike, *, k_fractions: Sequence[float] = tuple(_READOUT["k_fractions"])) -> pd.DataFrame:
    """``resolution.tsv``: per k, energy(k) = mean_L Σ_{i≤k} σ_i(A_L)² / Σ σ_i(A_L)², visibility(k) =
    1 − mean_L RSS_L(k), and the Pareto frontier of the two (:func:`resdyn.study_b.readout.resolution_table`).

    Args:
        lens: a :class:`Lens` or its translators. k_fractions: config ``readout.k_fractions``.
    """
    return _readout.resolution_table(translators(lens), k_fractions)


def phases(
    lens: LensLike,
    *,
    k_fraction: float = _READOUT["phase_k_fraction"],
    k_fractions: Sequence[float] = tuple(_READOUT["k_fractions"]),
    window: int = _PHASES["window"],
    smoothing: str = _PHASES["smoothing"],
) -> Cutpoints:
    """Three phases of the RSS profile, as the pipeline's ``phases.json``.

    The profile at k = k_from_fraction(d, ``k_fraction``) is smoothed (``smoothing``, ``window``);
    peak p = argmax; b1 = Kneedle knee on [0, p] (concave, increasing), b2 = Kneedle knee on
    [p, end] (concave, decreasing); no knee ⇒ b = p with the reason given
    (:func:`resdyn.study_b.phases.cutpoints`). The middle resolution regime (the Pareto point of
    :func:`resolution_sweep` nearest (1, 1) and its neighbours) is cut too, with the shift of
    b1, b2 across its k (``regime``, :func:`resdyn.study_b.phases.regime_agreement`).

    Args:
        lens: a :class:`Lens` or its translators (n ≥ 4: the profile needs 3 points).
        k_fraction, k_fractions: config ``readout.phase_k_fraction``, ``readout.k_fractions``.
        window, smoothing: config ``phases.window``, ``phases.smoothing``.
    Returns:
        :class:`Cutpoints` (``b1, peak, b2, spans, widths, reason, regime`` …; ``to_json()`` is phases.json).
    """
    mats = translators(lens)
    rss = rss_profile(mats, k_fractions=k_fractions)
    profile, k = _phases.profile_at(rss, k_fraction)
    cuts = _phases.cutpoints(profile, window=window, method=smoothing).at_k(k, k_fraction)
    regime = _phases.middle_regime(resolution_sweep(mats, k_fractions=k_fractions))
    return cuts.with_regime(_phases.regime_agreement(rss, regime, window=window, method=smoothing))
