"""resdyn.numerics.linalg: the kernels shared by spectral, schur, bootstrap and readout, against oracles."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import pytest
import scipy.linalg
import torch

from resdyn.numerics import linalg

# --------------------------------------------------------------------------------------------
# fraction -> k


@pytest.mark.parametrize("d", [1, 2, 7, 10, 64, 96, 896, 4096, 5120])
@pytest.mark.parametrize("f", [0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.5, 1.0])
def test_k_from_fraction_is_half_up_of_the_float_product(d, f):
    # oracle: decimal rounding half up of the exact value of the float product f·d, clipped to [1, d]
    want = int(Decimal(f * d).quantize(Decimal(1), rounding=ROUND_HALF_UP))
    assert linalg.k_from_fraction(d, f) == min(max(want, 1), d)


def test_k_from_fraction_ties_round_up_unlike_round():
    assert linalg.k_from_fraction(10, 0.25) == 3 and round(0.25 * 10) == 2
    assert linalg.k_from_fraction(10, 0.05) == 1  # 0.5 -> 1 (round gives 0, then the floor of 1)
    assert linalg.k_from_fraction(64, 0.01) == 1  # 0.64 -> 1
    assert linalg.k_from_fraction(np.int64(64), np.float32(0.5)) == 32


@pytest.mark.parametrize(
    "d, f, word",
    [
        (0, 0.1, "d must be a positive integer"),
        (True, 0.1, "d must be"),
        (64.0, 0.1, "d must be"),
        (64, 0.0, "fraction must be in (0, 1]"),
        (64, 1.5, "(0, 1]"),
        (64, float("nan"), "(0, 1]"),
        (64, "0.1", "fraction must be a number"),
        (64, None, "fraction must be a number"),
    ],
)
def test_k_from_fraction_refuses_bad_input(d, f, word):
    with pytest.raises(ValueError, match=word.replace("(", r"\(").replace(")", r"\)")):
        linalg.k_from_fraction(d, f)


def test_round_half_up():
    assert [linalg.round_half_up(x) for x in (0.5, 1.5, 2.5, 2.49, -0.5, -1.5)] == [1, 2, 3, 2, 0, -1]


# --------------------------------------------------------------------------------------------
# decompositions


def _same_multiset(got: np.ndarray, want: np.ndarray, atol: float) -> None:
    """Eigenvalues equal as multisets: every wanted value has its own got value within atol."""
    got = list(np.asarray(got, dtype=complex))
    for w in np.asarray(want, dtype=complex):
        i = int(np.argmin(np.abs(np.asarray(got) - w)))
        assert abs(got[i] - w) <= atol, (w, got[i])
        got.pop(i)


def _rng_matrix(seed: int, d: int = 30) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((d, d)) + np.triu(rng.standard_normal((d, d)), 1)


@pytest.mark.parametrize("output", ["real", "complex"])
def test_schur_factor_reconstructs_and_gives_the_eigenvalues(output):
    a = _rng_matrix(0)
    T, Q = linalg.schur_factor(a, output, vectors=True)
    np.testing.assert_allclose(Q @ T @ Q.conj().T, a, atol=1e-11)
    np.testing.assert_allclose(Q.conj().T @ Q, np.eye(30), atol=1e-12)
    lam = linalg.schur_eigenvalues(T)
    _same_multiset(lam, scipy.linalg.eigvals(a), atol=1e-10)
    T2, Q2 = linalg.schur_factor(a, output, vectors=False)
    assert Q2 is None and np.array_equal(np.diagonal(T2), np.diagonal(T))


def test_real_schur_blocks_are_the_complex_pairs():
    a = _rng_matrix(1)
    T, _ = linalg.schur_factor(a, "real", vectors=False)
    n_complex = int(np.sum(np.abs(scipy.linalg.eigvals(a).imag) > 1e-12))
    assert 2 * linalg.real_schur_blocks(T).size == n_complex > 0


@pytest.mark.parametrize("output", ["real", "complex"])
def test_nonnormal_norm_from_schur_matches_the_subtraction(output):
    a = _rng_matrix(2)
    T, _ = linalg.schur_factor(a, output, vectors=False)
    lam = scipy.linalg.eigvals(a)
    want = math.sqrt(np.linalg.norm(a) ** 2 - np.sum(np.abs(lam) ** 2))
    assert linalg.nonnormal_norm_from_schur(T) == pytest.approx(want, rel=1e-9)
    # a normal matrix: exactly representable rotation blocks give 0 without cancellation
    rot = scipy.linalg.block_diag(*[np.array([[c, -s], [s, c]]) for c, s in [(0.6, 0.8), (0.0, 1.0)]])
    T, _ = linalg.schur_factor(rot, output, vectors=False)
    assert linalg.nonnormal_norm_from_schur(T) < 1e-15


def test_schur_factor_refuses():
    with pytest.raises(ValueError, match="real Schur form needs a real matrix"):
        linalg.schur_factor(np.eye(2, dtype=complex), "real", vectors=False)
    with pytest.raises(ValueError, match="output must be 'real' or 'complex'"):
        linalg.schur_factor(np.eye(2), "upper", vectors=False)


def test_svd_and_sort():
    a = _rng_matrix(3, 12)
    U, s, Vh = linalg.svd(a, vectors=True)
    np.testing.assert_allclose(U * s @ Vh, a, atol=1e-12)
    np.testing.assert_allclose(linalg.svd(a, vectors=False), np.linalg.svd(a, compute_uv=False), rtol=1e-12)
    lam = np.array([1j, -2.0, 2.0, -1j, 0.5])
    assert linalg.sort_eigenvalues(lam).tolist() == [2.0, -2.0, -1j, 1j, 0.5]


def test_as_square_and_as_values_refuse_with_the_shape():
    with pytest.raises(ValueError, match=r"square 2-D matrix \(d×d\), got shape \(2, 3\)"):
        linalg.as_square(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"J \(shape \(2, 2\)\) has 1 non-finite"):
        linalg.as_square(np.array([[1.0, np.nan], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="sv must be ≥ 0"):
        linalg.as_values(np.array([1.0, -1.0]), "sv", nonnegative=True)
    assert linalg.as_square([[1, 2], [3, 4]]).dtype == np.float64


# --------------------------------------------------------------------------------------------
# host or device


def test_on_cuda():
    assert linalg.on_cuda("cuda") and linalg.on_cuda("cuda:1") and linalg.on_cuda(torch.device("cuda", 0))
    assert not (linalg.on_cuda(None) or linalg.on_cuda("cpu") or linalg.on_cuda(torch.device("cpu")))


def test_eigen_henrici_host_and_torch_paths_agree(monkeypatch):
    a = np.eye(24) + _rng_matrix(4, 24) / 5
    lam, nn, fro = linalg.eigen_henrici(a)
    assert fro == np.linalg.norm(a)
    monkeypatch.setattr(linalg, "on_cuda", lambda device: device is not None)
    lam_t, nn_t, fro_t = linalg.eigen_henrici(a, "cpu")  # the CUDA code path on the CPU's torch
    _same_multiset(lam_t, lam, atol=1e-10)
    assert nn_t == pytest.approx(nn, rel=1e-8) and fro_t == fro
    # near-normal: the subtraction is not trusted and ‖N‖ comes from the host Schur factor
    sym = a + a.T
    assert linalg.eigen_henrici(sym, "cpu")[1] == linalg.eigen_henrici(sym)[1] < 1e-12
    U, s, Vh = linalg.svd_on(a, True, "cpu")
    np.testing.assert_allclose(U * s @ Vh, a, atol=1e-12)


# --------------------------------------------------------------------------------------------
# ranks


def test_effective_rank_and_participation_ratio_known_answers():
    assert linalg.effective_rank(np.ones(5)) == pytest.approx(5.0, rel=1e-15)
    p = np.array([3.0, 1.0]) / 4
    assert linalg.effective_rank(np.array([3.0, 1.0, 0.0])) == pytest.approx(math.exp(-np.sum(p * np.log(p))))
    assert linalg.effective_rank(np.zeros(3)) == 0.0
    assert linalg.participation_ratio(np.array([2.0, 1.0])) == pytest.approx(25 / 17)
    assert linalg.participation_ratio(np.array([1e200, 1e200])) == 2.0  # no overflow


# --------------------------------------------------------------------------------------------
# the running product


def test_normalised_product_equals_the_direct_product():
    rng = np.random.default_rng(5)
    mats = [rng.standard_normal((6, 6)) for _ in range(5)]
    p = linalg.NormalisedProduct()
    direct = np.eye(6)
    for J in mats:
        P = p.push(J)
        direct = J @ direct
        np.testing.assert_allclose(P, direct / np.linalg.norm(direct), rtol=1e-12, atol=1e-14)
        assert p.log10_fro == pytest.approx(math.log10(np.linalg.norm(direct)), rel=1e-12)
        assert np.linalg.norm(P) == pytest.approx(1.0, rel=1e-14)


def test_normalised_product_neither_overflows_nor_underflows():
    for scale, want in ((10.0, 400 + 0.5 * math.log10(3)), (0.1, -400 + 0.5 * math.log10(3))):
        p = linalg.NormalisedProduct()
        for _ in range(400):
            P = p.push(scale * np.eye(3))
        np.testing.assert_allclose(P, np.eye(3) / math.sqrt(3), rtol=1e-13)
        assert p.log10_fro == pytest.approx(want, rel=1e-12)


def test_normalised_product_stays_zero_once_vanished():
    p = linalg.NormalisedProduct()
    p.push(np.array([[0.0, 1.0], [0.0, 0.0]]))
    assert not p.vanished
    P = p.push(np.array([[0.0, 1.0], [0.0, 0.0]]))  # nilpotent: N² = 0
    assert p.vanished and p.log10_fro == -math.inf and not P.any()
    assert not p.push(np.eye(2) * 5).any() and p.vanished


def test_normalised_product_on_torch_tensors_matches_numpy():
    rng = np.random.default_rng(6)
    mats = [rng.standard_normal((5, 5)) for _ in range(4)]
    pn, pt = linalg.NormalisedProduct(), linalg.NormalisedProduct()
    for J in mats:
        Pn = pn.push(J)
        Pt = pt.push(torch.as_tensor(J))
    assert isinstance(Pt, torch.Tensor)
    np.testing.assert_allclose(Pt.numpy(), Pn, rtol=1e-12)
    assert pt.log10_fro == pytest.approx(pn.log10_fro, rel=1e-12)


def test_cost_model_sizes_k_by_the_same_rule():
    """d = 10, fraction 0.25: k = 3 (half up), where Python's round would give 2."""
    from resdyn.cluster import cost
    from resdyn.study_b import readout

    assert readout.k_from_fraction is linalg.k_from_fraction
    s = cost.Shape(n_layers=2, d=10, n_heads=1, n_kv_heads=1, d_ff=40, vocab=50)
    n, d, R, k = 2, 10, 3, 3
    got = cost.cost_bridge({"bridge": {"k_fraction": 0.25, "n_random": R}}, s).work["gemm64"]
    assert got == n * (2.0 * d**3 + (R + 1) * (2.0 * d * d * k + 6.0 * d * k * k))
    got = cost.cost_readout({"readout": {"k_fractions": [0.25, 0.5]}}, s).work["gemm64"]
    assert got == n * sum(2.0 * d * kk * kk + 4.0 * kk**3 for kk in (3, 5))


def _fraction_roundings(source: str) -> list[str]:
    """Calls that round (round, floor, int, *round_half_up*) an expression built from a
    ``*fraction*`` name, directly or inside a comprehension over fractions."""
    import ast

    def rounding(node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        name = ast.unparse(node.func)
        return name in ("int", "math.floor", "np.floor", "np.round", "np.rint") or "round" in name

    tree = ast.parse(source)
    found = [ast.unparse(n) for n in ast.walk(tree) if rounding(n) and n.args and "fraction" in ast.unparse(n.args[0])]
    for comp in ast.walk(tree):
        if isinstance(comp, (ast.ListComp, ast.SetComp, ast.GeneratorExp)) and any(
            "fraction" in ast.unparse(g.iter) for g in comp.generators
        ):
            found += [ast.unparse(n) for n in ast.walk(comp.elt) if rounding(n)]
    return found


@pytest.mark.parametrize(
    "source, hit",
    [
        ("k = max(1, round(config['bridge']['k_fraction'] * d))", True),
        ("ks = [max(1, round(f * d)) for f in cfg['readout']['k_fractions']]", True),
        ("k = min(d, max(1, _round_half_up(k_fraction * d)))", True),
        ("k = k_from_fraction(d, k_fraction)", False),
        ("ks = [k_from_fraction(d, f) for f in cfg['readout']['k_fractions']]", False),
        ("k = round(erank)", False),
    ],
)
def test_fraction_rounding_detector(source, hit):
    assert bool(_fraction_roundings(source)) == hit


def test_no_other_fraction_to_k_rounding():
    """Fractions of d become k only through k_from_fraction, nowhere else in the package, the
    workflow scripts or the benchmarks."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    held = "round(heldout_fraction * len(docs))"  # a document count, not a k
    allowed = {("resdyn/lm/corpus.py", held), ("resdyn/lm/corpus.py", f"int({held})")}
    found = []
    for folder in ("resdyn", "workflow/scripts", "benchmarks"):
        for path in sorted((repo / folder).rglob("*.py")):
            rel = str(path.relative_to(repo))
            if rel == "resdyn/numerics/linalg.py":
                continue
            found += [f"{rel}: {call}" for call in _fraction_roundings(path.read_text()) if (rel, call) not in allowed]
    assert not found, found
