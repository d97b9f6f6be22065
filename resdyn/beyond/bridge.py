"""Bridge between Study A (Jacobians) and Study B (readout subspaces and phases).

Two questions, both answered from artifacts the pipeline already has.

(a) **Does the layer map carry a readout subspace onto the next one?** For layer L the
layer Jacobian (stream entering layer L to stream entering layer L+1) is

    J_L = J_mlp(L) · J_attn(L)                                   (d × d, mean Jacobians)

and ``V_L = readout_subspace(A_L, k)`` (top-k right singular vectors of the tuned-lens
translator ``A_L``, d × k, orthonormal). The *transport* of ``S_L`` into ``S_{L+1}`` is the
share of the pushed-forward subspace's energy that lands in the next readout subspace,

    transport_L = ‖P_{L+1} J_L V_L‖_F² / ‖J_L V_L‖_F²,          P_{L+1} = V_{L+1} V_{L+1}ᵀ,

in [0, 1]: 1 when ``J_L S_L ⊆ S_{L+1}``, 0 when ``J_L S_L ⊥ S_{L+1}``. Because ``V_{L+1}`` is
orthonormal, ``‖P_{L+1} X‖_F = ‖V_{L+1}ᵀ X‖_F``. Rows L = 0 … n−2 (translator n−1 has no
successor: index n is the identity reference, which carries no readout subspace).

Null models: (i) ``n_random`` Haar-random k-subspaces replacing ``V_L`` (J_L and P_{L+1}
fixed) give ``random_mean``, ``random_sd`` (ddof 1) and the empirical
``random_p = #{draws with transport ≥ observed} / n_random`` (0 means < 1/n_random);
(ii) ``chance = k/d``, the expected share of a uniformly random direction's energy inside a
fixed k-subspace (what the ratio would be if J_L V_L pointed nowhere in particular).

(b) **Do Study B's phase cut points sit where Study A's operator type changes?** Per layer:
complex fraction (at one tolerance, from ``spectra.tsv``) and Henrici departure of the
attention and MLP sublayers, the cumulative effective rank after the layer (``bottleneck.tsv``
at s = 2L+1) and the transport. For each profile x_0 … x_{m−1} the largest change is at the
layer ``L* = argmax_{L ≥ 1} |x_L − x_{L−1}|`` (first on ties, NaNs skipped): the operator type
changes *between layers L*−1 and L**. Phase boundary b (between RSS points b and b+1, the
updates of layers b and b+1, :mod:`resdyn.study_b.phases`) and that change coincide iff ``L* = b + 1``,
so the distance is ``|L* − (b + 1)|`` layers. ``chance_dist_nearest`` is the expected distance
to the nearer cut point of a change position drawn uniformly from the profile's possible
positions L = 1 … m−1, so "aligned" can be judged against chance.

Everything is float64; random draws are seeded per layer (``default_rng([seed, L])``), so a
layer's null does not depend on how many layers the model has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from resdyn import artifacts
from resdyn.numerics.checks import is_int
from resdyn.study_b import phases as ph
from resdyn.study_b.readout import readout_subspace

__all__ = [
    "haar_subspace",
    "layer_jacobian",
    "transport_ratio",
    "transport_table",
    "largest_change",
    "operator_profiles",
    "alignment_table",
    "bridge_tables",
    "TRANSPORT_COLUMNS",
    "ALIGNMENT_COLUMNS",
]

TRANSPORT_COLUMNS = ["layer", "k", "d", "transport", "random_mean", "random_sd", "random_p", "n_random", "chance"]
ALIGNMENT_COLUMNS = artifacts.ALIGNMENT_COLUMNS  # defined by resdyn.artifacts.BridgeAlignment
_ORTHO_TOL = 1e-8


# --------------------------------------------------------------------------------------------
# validation


def _matrix(a: Any, name: str) -> np.ndarray:
    arr = np.asarray(a() if callable(a) else a)
    if arr.ndim != 2 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array, got shape {arr.shape}")
    if np.iscomplexobj(arr):
        raise ValueError(f"{name} must be real, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} (shape {arr.shape}) has non-finite entries")
    return arr


def _square(a: Any, name: str) -> np.ndarray:
    arr = _matrix(a, name)
    if arr.shape[0] != arr.shape[1]:
        raise ValueError(f"{name} must be square (d × d), got shape {arr.shape}")
    return arr


def _orthonormal(V: Any, d: int, name: str) -> np.ndarray:
    arr = _matrix(V, name)
    if arr.shape[0] != d:
        raise ValueError(f"{name} has {arr.shape[0]} rows; expected d = {d} (shape d × k)")
    err = float(np.max(np.abs(arr.T @ arr - np.eye(arr.shape[1]))))
    if err > _ORTHO_TOL:
        raise ValueError(f"{name} must have orthonormal columns (VᵀV = I); max |VᵀV − I| = {err:.2e} > {_ORTHO_TOL:g}")
    return arr


def _int(v: Any, name: str, low: int, high: int | None = None) -> int:
    if not is_int(v):
        raise ValueError(f"{name} must be an integer, got {v!r} ({type(v).__name__})")
    v = int(v)
    if v < low or (high is not None and v > high):
        allowed = f"≥ {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {allowed}, got {v}")
    return v


# --------------------------------------------------------------------------------------------
# (a) transport


def haar_subspace(d: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Orthonormal basis (d × k) of a Haar-uniform random k-subspace of R^d.

    QR of a d × k standard Gaussian matrix with the signs of R's diagonal moved into Q
    (F. Mezzadri, "How to generate random matrices from the classical compact groups",
    Notices AMS 54, 2007), float64.

    Example:
        >>> V = haar_subspace(5, 2, np.random.default_rng(0))
        >>> V.shape, bool(np.allclose(V.T @ V, np.eye(2)))
        ((5, 2), True)
    """
    d = _int(d, "d", 1)
    k = _int(k, "k", 1, d)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy Generator (np.random.default_rng(seed)), got {type(rng).__name__}")
    Q, R = np.linalg.qr(rng.standard_normal((d, k)))
    signs = np.sign(np.diag(R))
    signs[signs == 0] = 1.0
    return Q * signs


def layer_jacobian(jacobians: Mapping[tuple[int, str], Any], layer: int) -> np.ndarray:
    """Layer map ``J_L = J_mlp(L) @ J_attn(L)`` (h_L → h_{L+1}), float64 (d, d); for a
    parallel-residual layer its stored operator ``(L, 'layer')`` = I + J_A + J_F.

    ``jacobians``: {(layer, kind): (d, d) array or zero-argument loader}, as returned by
    :meth:`resdyn.artifacts.JacobianBlocks.read_means`.

    Example:
        >>> layer_jacobian({(0, "attn"): np.diag([1.0, 2.0]), (0, "mlp"): np.diag([3.0, 1.0])}, 0).tolist()
        [[3.0, 0.0], [0.0, 2.0]]
    """
    if (layer, "layer") in jacobians:  # parallel residual: the layer operator I + J_A + J_F itself
        return _square(jacobians[(layer, "layer")], f"jacobians[({layer}, 'layer')]")
    missing = [kind for kind in ("attn", "mlp") if (layer, kind) not in jacobians]
    if missing:
        raise ValueError(f"jacobians lack layer {layer}'s {missing} sublayer(s); have {sorted(jacobians)[:6]}…")
    A = _square(jacobians[(layer, "attn")], f"jacobians[({layer}, 'attn')]")
    M = _square(jacobians[(layer, "mlp")], f"jacobians[({layer}, 'mlp')]")
    if A.shape != M.shape:
        raise ValueError(f"layer {layer}: attn Jacobian is {A.shape}, mlp Jacobian is {M.shape}; must match")
    return M @ A


def transport_ratio(J: Any, V: Any, V_next: Any) -> float:
    """Share of ``J S`` inside the next subspace: ‖P_next J V‖_F² / ‖J V‖_F².

    ``P_next = V_next V_nextᵀ``; evaluated as ‖V_nextᵀ (J V)‖_F² / ‖J V‖_F² (V_next
    orthonormal). Returns NaN when ``J V = 0`` (nothing is transported).

    Args:
        J: (d, d) layer Jacobian.
        V: (d, k) orthonormal basis of the source subspace.
        V_next: (d, k') orthonormal basis of the target subspace.
    Returns:
        float in [0, 1].
    Example:
        >>> e = np.eye(3)
        >>> transport_ratio(np.eye(3), e[:, :1], e[:, :2]), transport_ratio(np.eye(3), e[:, :1], e[:, 1:])
        (1.0, 0.0)
        >>> transport_ratio(np.array([[1.0, 0, 0], [1.0, 0, 0], [0, 0, 1.0]]), e[:, :1], e[:, :1])  # e0 -> e0 + e1
        0.5
    """
    Jm = _square(J, "J")
    d = Jm.shape[0]
    Vm = _orthonormal(V, d, "V")
    Wm = _orthonormal(V_next, d, "V_next")
    return _ratio(Jm @ Vm, Wm)


def _ratio(JV: np.ndarray, W: np.ndarray) -> float:
    den = float(np.sum(JV * JV))
    if den == 0.0:
        return float("nan")
    proj = W.T @ JV
    return float(min(1.0, np.sum(proj * proj) / den))


def transport_table(
    layer_jacobians: Sequence[Any],
    translators: Sequence[Any],
    k: int,
    n_random: int = 20,
    seed: int = 0,
) -> pd.DataFrame:
    """Transport of readout subspaces by the layer Jacobians, against Haar-random subspaces.

    Args:
        layer_jacobians: J_0 … J_{n−1} (each (d, d) or a loader), J_L = J_mlp J_attn of layer L;
            only J_0 … J_{n−2} are used.
        translators: A_0 … A_{n−1} (d, d), the tuned-lens translators (A_L reads h_L).
        k: readout dimension, 1 ≤ k ≤ d.
        n_random: Haar draws per layer (≥ 1; ≥ 20 recommended for the empirical p).
        seed: draws of layer L use ``np.random.default_rng([seed, L])``.
    Returns:
        DataFrame with :data:`TRANSPORT_COLUMNS`, one row per layer L = 0 … n−2:
        ``transport`` (module formula), ``random_mean``, ``random_sd`` (ddof 1; NaN for one
        draw), ``random_p`` = share of draws ≥ observed, ``n_random``, ``chance = k/d``.
    Example:
        >>> eye = np.eye(4)
        >>> t = transport_table([eye, eye], [np.diag([4.0, 3, 2, 1]), np.diag([4.0, 3, 2, 1])], k=2, n_random=5)
        >>> t[["layer", "transport", "random_p", "chance"]].values.tolist()
        [[0.0, 1.0, 0.0, 0.5]]
    """
    n = len(translators)
    if n < 2:
        raise ValueError(f"need at least 2 translators (A_0 … A_(n-1)) to compare consecutive subspaces, got {n}")
    if len(layer_jacobians) < n - 1:
        raise ValueError(f"need a layer Jacobian for each of layers 0 … {n - 2}, got {len(layer_jacobians)}")
    A0 = _square(translators[0], "translators[0]")
    d = A0.shape[0]
    k = _int(k, "k", 1, d)
    n_random = _int(n_random, "n_random", 1)
    seed = _int(seed, "seed", 0)
    Vs = [readout_subspace(_square(A, f"translators[{i}]"), k) for i, A in enumerate(translators)]
    rows = []
    for L in range(n - 1):
        J = _square(layer_jacobians[L], f"layer_jacobians[{L}]")
        if J.shape != (d, d):
            raise ValueError(f"layer_jacobians[{L}] is {J.shape}, translators are {d} × {d}; widths must match")
        obs = _ratio(J @ Vs[L], Vs[L + 1])
        rng = np.random.default_rng([seed, L])
        draws = np.array([_ratio(J @ haar_subspace(d, k, rng), Vs[L + 1]) for _ in range(n_random)])
        rows.append(
            {
                "layer": L,
                "k": k,
                "d": d,
                "transport": obs,
                "random_mean": float(np.mean(draws)),
                "random_sd": float(np.std(draws, ddof=1)) if n_random > 1 else float("nan"),
                "random_p": float(np.mean(draws >= obs)) if math.isfinite(obs) else float("nan"),
                "n_random": n_random,
                "chance": k / d,
            }
        )
    return pd.DataFrame(rows, columns=TRANSPORT_COLUMNS)


# --------------------------------------------------------------------------------------------
# (b) alignment of cut points with operator-type changes


def largest_change(values: Sequence[float]) -> tuple[int | None, float]:
    """Layer of the largest step of a profile: ``L* = argmax_{L ≥ 1} |x_L − x_{L−1}|``.

    Steps involving a NaN are skipped; the first maximum wins ties. Returns ``(L*, x_{L*} −
    x_{L*−1})``, or ``(None, nan)`` when no finite step exists.

    Example:
        >>> largest_change([0.9, 0.8, 0.2, 0.1])
        (2, -0.6000000000000001)
        >>> largest_change([1.0, float("nan")])
        (None, nan)
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size < 2:
        return None, float("nan")
    delta = np.diff(x)
    ok = np.isfinite(delta)
    if not ok.any():
        return None, float("nan")
    mag = np.where(ok, np.abs(delta), -np.inf)
    i = int(np.argmax(mag))
    return i + 1, float(delta[i])


def _complex_column(spectra: pd.DataFrame, tol: float) -> str:
    col = f"complex_frac_J_tol{tol:.0e}"
    if col not in spectra.columns:
        have = [c for c in spectra.columns if c.startswith("complex_frac_J_tol")]
        raise ValueError(
            f"spectra table has no column {col!r} for complex_tol={tol!r}; available: {have} "
            "(add the tolerance to spectra.complex_tolerances)"
        )
    return col


def operator_profiles(spectra: pd.DataFrame, bottleneck: pd.DataFrame, complex_tol: float = 1e-6) -> pd.DataFrame:
    """Per-layer operator-type profiles from ``spectra.tsv`` and ``bottleneck.tsv``.

    Returns one row per layer L = 0 … n−1 with ``complex_frac_attn``, ``complex_frac_mlp``
    (share of complex eigenvalues at ``complex_tol``), ``henrici_attn``, ``henrici_mlp`` and
    ``cum_erank`` = effective rank of P_{2L+1} = J_{2L+1} ⋯ J_0 (after layer L). Parallel-residual
    models (kind 'layer' only): the attn/mlp columns are NaN and ``complex_frac_layer``,
    ``henrici_layer`` describe the layer operator.

    Example:
        >>> sp = pd.DataFrame({"layer": [0, 0], "kind": ["attn", "mlp"], "henrici": [0.1, 0.2],
        ...                    "complex_frac_J_tol1e-06": [0.5, 0.25]})
        >>> bn = pd.DataFrame({"s": [0, 1], "erank": [9.0, 8.0]})
        >>> operator_profiles(sp, bn).iloc[0].tolist()
        [0.0, 0.5, 0.25, 0.1, 0.2, 8.0]
    """
    for name, df, need in (
        ("spectra", spectra, ["layer", "kind", "henrici"]),
        ("bottleneck", bottleneck, ["s", "erank"]),
    ):
        if not isinstance(df, pd.DataFrame):
            raise ValueError(f"{name} must be a DataFrame, got {type(df).__name__}")
        missing = [c for c in need if c not in df.columns]
        if missing:
            raise ValueError(f"{name} table lacks columns {missing}; has {list(df.columns)}")
    col = _complex_column(spectra, float(complex_tol))
    layers = sorted(int(v) for v in spectra["layer"].unique())
    if layers != list(range(len(layers))):
        raise ValueError(f"spectra covers layers {layers}; expected 0 … {len(layers) - 1} without gaps")
    by = spectra.set_index(["layer", "kind"])
    erank = dict(zip(bottleneck["s"].astype(int), bottleneck["erank"].astype(float)))
    rows = []
    parallel = "layer" in set(spectra["kind"].astype(str))
    for L in layers:
        row: dict[str, Any] = {"layer": L}
        if parallel:
            if (L, "layer") not in by.index:
                raise ValueError(f"spectra table has no row for layer {L}, kind 'layer'")
            nan = float("nan")
            row.update(
                complex_frac_attn=nan,
                complex_frac_mlp=nan,
                henrici_attn=nan,
                henrici_mlp=nan,
                complex_frac_layer=float(by.loc[(L, "layer"), col]),
                henrici_layer=float(by.loc[(L, "layer"), "henrici"]),
            )
            if 2 * L + 1 not in erank:
                raise ValueError(f"bottleneck table has no row s = {2 * L + 1} (after layer {L})")
            row["cum_erank"] = erank[2 * L + 1]
            rows.append(row)
            continue
        for kind in ("attn", "mlp"):
            if (L, kind) not in by.index:
                raise ValueError(f"spectra table has no row for layer {L}, kind {kind!r}")
            row[f"complex_frac_{kind}"] = float(by.loc[(L, kind), col])
        for kind in ("attn", "mlp"):
            row[f"henrici_{kind}"] = float(by.loc[(L, kind), "henrici"])
        if 2 * L + 1 not in erank:
            raise ValueError(f"bottleneck table has no row s = {2 * L + 1} (after layer {L})")
        row["cum_erank"] = erank[2 * L + 1]
        rows.append(row)
    return pd.DataFrame(rows)


def _chance_nearest(n_points: int, b1: int, b2: int) -> float:
    positions = np.arange(1, n_points)
    if positions.size == 0:
        return float("nan")
    return float(np.mean(np.minimum(np.abs(positions - (b1 + 1)), np.abs(positions - (b2 + 1)))))


def alignment_table(
    profiles: Mapping[str, Sequence[float]], b1: int, b2: int, b1_found: bool = True, b2_found: bool = True
) -> pd.DataFrame:
    """Distance (in layers) of each profile's largest change to the phase cut points.

    For each profile (name → values over layers 0 … m−1): ``change_layer`` L* and ``delta``
    from :func:`largest_change`; ``dist_b1 = |L* − (b1 + 1)|``, ``dist_b2 = |L* − (b2 + 1)|``,
    ``dist_nearest`` the smaller; ``chance_dist_nearest`` its mean over L = 1 … m−1 (uniform);
    ``n_positions = m − 1``. ``b1_found``/``b2_found`` are copied from ``phases.json`` so a
    fallback cut (no knee) is visible next to the distance.

    Example:
        >>> t = alignment_table({"x": [0, 0, 0, 1, 1, 1]}, b1=1, b2=4)
        >>> t[["change_layer", "dist_b1", "dist_b2", "dist_nearest"]].values.tolist()
        [[3, 1, 2, 1]]
    """
    b1 = _int(b1, "b1", 0)
    b2 = _int(b2, "b2", b1)
    rows = []
    for name, values in profiles.items():
        x = np.asarray(values, dtype=np.float64).ravel()
        L, delta = largest_change(x)
        row: dict[str, Any] = {
            "profile": name,
            "change_layer": L,
            "delta": delta,
            "b1": b1,
            "b2": b2,
            "b1_found": bool(b1_found),
            "b2_found": bool(b2_found),
        }
        if L is None:
            row.update(dist_b1=None, dist_b2=None, dist_nearest=None)
        else:
            d1, d2 = abs(L - (b1 + 1)), abs(L - (b2 + 1))
            row.update(dist_b1=d1, dist_b2=d2, dist_nearest=min(d1, d2))
        row["chance_dist_nearest"] = _chance_nearest(x.size, b1, b2)
        row["n_positions"] = max(0, x.size - 1)
        rows.append(row)
    out = pd.DataFrame(rows, columns=ALIGNMENT_COLUMNS)
    for c in ("change_layer", "dist_b1", "dist_b2", "dist_nearest"):
        out[c] = out[c].astype("Int64")
    return out


# --------------------------------------------------------------------------------------------
# the pipeline's tables


def bridge_tables(
    jacobians: Mapping[tuple[int, str], Any],
    translators: Sequence[Any],
    spectra: pd.DataFrame,
    bottleneck: pd.DataFrame,
    rss: pd.DataFrame,
    phases: Mapping[str, Any],
    k: int,
    n_random: int = 20,
    seed: int = 0,
    complex_tol: float = 1e-6,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``bridge.tsv`` and ``bridge_alignment.tsv`` of one (model, checkpoint).

    ``bridge.tsv``: one row per layer L = 0 … n−1 — the transport columns of
    :func:`transport_table` at ``k`` (NaN for L = n−1), the :func:`operator_profiles`
    columns, ``rss`` = RSS_L at the phase dimension ``phases["k"]`` (``rss_k``; NaN for
    L = n−1) and ``phase`` (1/2/3 from ``phases.json``'s b1, b2; empty for L = n−1, which has
    no RSS point).

    ``bridge_alignment.tsv``: :func:`alignment_table` of the profiles complex_frac_attn,
    complex_frac_mlp, henrici_attn, henrici_mlp, cum_erank and transport.

    Args:
        jacobians: {(layer, kind): mean Jacobian or loader} (:meth:`resdyn.artifacts.JacobianBlocks.read_means`).
        translators: A_0 … A_{n−1} (:meth:`resdyn.artifacts.LensFolder.read_translator_matrices`).
        spectra, bottleneck, rss: the tables of ``spectra.tsv``, ``bottleneck.tsv``, ``rss.tsv``.
        phases: the content of ``phases.json`` (keys b1, b2, b1_found, b2_found, k, n).
        k, n_random, seed: see :func:`transport_table`; complex_tol: see :func:`operator_profiles`.
    """
    n = len(translators)
    layers = sorted({L for L, _ in jacobians})
    if layers != list(range(n)):
        raise ValueError(f"Jacobians cover layers {layers}, translators {n} layers (0 … {n - 1}); they must match")
    for key in ("b1", "b2", "k"):
        if key not in phases:
            raise ValueError(f"phases lacks {key!r}; expected the content of phases.json (keys b1, b2, k, …)")
    prof = operator_profiles(spectra, bottleneck, complex_tol)
    if len(prof) != n:
        raise ValueError(f"spectra has {len(prof)} layers, translators {n}; they must describe the same model")
    transport = transport_table(
        [(lambda L=L: layer_jacobian(jacobians, L)) for L in range(n - 1)], translators, k, n_random, seed
    )
    k_phase = int(phases["k"])
    at_k = rss[rss["k"] == k_phase].sort_values("layer")
    if at_k.empty:
        raise ValueError(
            f"rss table has no rows at the phase dimension k = {k_phase}; has k = {sorted(rss['k'].unique())}"
        )
    if at_k["layer"].tolist() != list(range(n - 1)):
        raise ValueError(f"rss at k = {k_phase} covers layers {at_k['layer'].tolist()}; expected 0 … {n - 2}")
    b1, b2 = int(phases["b1"]), int(phases["b2"])
    labels = ph.phase_of_layer(n - 1, b1, b2)

    table = prof.merge(transport, on="layer", how="left")
    table["k"] = k
    table["d"] = transport["d"].iloc[0]
    table["chance"] = k / table["d"]
    table["n_random"] = transport["n_random"].iloc[0]
    table["rss"] = list(at_k["rss"].astype(float)) + [float("nan")]
    table["rss_k"] = k_phase
    table["phase"] = pd.array(list(labels) + [None], dtype="Int64")
    # why the last layer's transport, RSS and phase are empty
    table["reason"] = [""] * (n - 1) + ["last layer: no next layer (transport, RSS and phase undefined)"]
    order = TRANSPORT_COLUMNS + [c for c in prof.columns if c != "layer"] + ["rss", "rss_k", "phase", "reason"]
    table = table[order]

    # parallel-residual models have one operator per layer: its profiles replace the (NaN) halves'
    halves = (
        ("complex_frac_layer", "henrici_layer")
        if "complex_frac_layer" in table
        else ("complex_frac_attn", "complex_frac_mlp", "henrici_attn", "henrici_mlp")
    )
    profiles = {c: table[c].to_numpy(dtype=np.float64) for c in (*halves, "cum_erank")}
    profiles["transport"] = transport["transport"].to_numpy(dtype=np.float64)
    alignment = alignment_table(
        profiles, b1, b2, bool(phases.get("b1_found", True)), bool(phases.get("b2_found", True))
    )
    return table, alignment
