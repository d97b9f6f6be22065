"""Unit tests of resdyn.study_a.spectral: known answers and independent numpy/scipy oracles."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import scipy.linalg
import scipy.stats
from scipy.optimize import linear_sum_assignment

from resdyn.study_a import spectral as sp


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def random_orthogonal(d: int, seed: int = 0) -> np.ndarray:
    q, r = np.linalg.qr(rng(seed).standard_normal((d, d)))
    return q * np.sign(np.diag(r))


def random_rotation_no_real_eigs(d: int, seed: int = 0) -> np.ndarray:
    """Orthogonal d×d (d even) with eigenvalues e^{±iθ}, θ ∈ [0.2, π − 0.2]: no ±1."""
    assert d % 2 == 0
    g = rng(seed)
    R = np.zeros((d, d))
    for j, th in enumerate(g.uniform(0.2, math.pi - 0.2, d // 2)):
        c, s = math.cos(th), math.sin(th)
        R[2 * j : 2 * j + 2, 2 * j : 2 * j + 2] = [[c, -s], [s, c]]
    Q = random_orthogonal(d, seed + 1)
    return Q @ R @ Q.T


def naive_henrici(J: np.ndarray) -> float:
    fro2 = np.linalg.norm(J) ** 2
    lam = np.linalg.eigvals(J)
    return math.sqrt(max(0.0, fro2 - np.sum(np.abs(lam) ** 2))) / math.sqrt(fro2)


def match_eigenvalues(a: np.ndarray, b: np.ndarray) -> float:
    """Largest distance between optimally matched eigenvalue sets."""
    cost = np.abs(a[:, None] - b[None, :])
    r, c = linear_sum_assignment(cost)
    return float(cost[r, c].max())


# ------------------------------------------------------------------------------ Henrici


@pytest.mark.parametrize(
    "make",
    [
        lambda: random_orthogonal(50, 3),
        lambda: (lambda A: A + A.T)(rng(4).standard_normal((50, 50))),
        lambda: np.diag(rng(5).standard_normal(50)),
        lambda: random_rotation_no_real_eigs(40, 6),
        lambda: (lambda A: A + A.conj().T)(rng(7).standard_normal((30, 30)) + 1j * rng(8).standard_normal((30, 30))),
        lambda: np.linalg.qr(rng(9).standard_normal((30, 30)) + 1j * rng(10).standard_normal((30, 30)))[0],
    ],
    ids=["orthogonal", "symmetric", "diagonal", "rotation", "hermitian", "unitary"],
)
def test_henrici_zero_for_normal(make):
    J = make()
    assert sp.henrici_departure(J) == pytest.approx(0.0, abs=1e-12)
    assert sp.nonnormal_norm(J) <= 1e-12 * np.linalg.norm(J)


def test_henrici_one_for_nilpotent():
    jordan = np.eye(8, k=1)
    assert sp.henrici_departure(jordan) == pytest.approx(1.0, abs=1e-12)
    strict = np.triu(rng(1).standard_normal((30, 30)), 1)
    assert sp.henrici_departure(strict) == pytest.approx(1.0, abs=1e-12)
    # A rotated small Jordan block: eigenvalues move by ~eps^(1/3) only.
    Q = random_orthogonal(3, 2)
    assert sp.henrici_departure(Q @ np.eye(3, k=1) @ Q.T) == pytest.approx(1.0, abs=1e-6)


def test_henrici_known_2x2_and_zero_matrix():
    assert sp.henrici_departure(np.array([[1.0, 3.0], [0.0, 1.0]])) == pytest.approx(3 / math.sqrt(11), abs=1e-14)
    assert sp.nonnormal_norm(np.array([[1.0, 3.0], [0.0, 2.0]])) == pytest.approx(3.0, abs=1e-14)
    # complex pair with a non-normal 2×2 block: ‖N‖² = (p − s)² + (q + r)²
    B = np.array([[1.0, 4.0], [-1.0, 0.5]])
    assert sp.nonnormal_norm(B) == pytest.approx(math.hypot(0.5, 3.0), rel=1e-12)
    assert sp.henrici_departure(np.zeros((3, 3))) == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_henrici_matches_eigenvalue_formula(seed):
    g = rng(seed)
    J = g.standard_normal((30, 30)) + np.triu(g.standard_normal((30, 30)), 1)
    assert sp.henrici_departure(J) == pytest.approx(naive_henrici(J), rel=1e-9)
    Jc = g.standard_normal((20, 20)) + 1j * g.standard_normal((20, 20))
    assert sp.henrici_departure(Jc) == pytest.approx(naive_henrici(Jc), rel=1e-9)


# ------------------------------------------------------------------------------ fractions


def test_complex_fraction_known_answers():
    assert sp.complex_fraction(np.linalg.eigvals(random_rotation_no_real_eigs(20, 1))) == 1.0
    S = (lambda A: A + A.T)(rng(2).standard_normal((20, 20)))
    assert sp.complex_fraction(np.linalg.eigvals(S)) == 0.0
    assert sp.complex_fraction(np.array([1j, -1j, 2.0, 3.0])) == 0.5
    assert sp.complex_fraction(np.array([1.0, 2.0])) == 0.0  # real dtype
    # tolerance is absolute below |λ| = 1 and relative above
    assert sp.complex_fraction(np.array([0.5 + 1e-5j]), tol=1e-6) == 1.0
    assert sp.complex_fraction(np.array([0.5 + 1e-5j]), tol=1e-4) == 0.0
    assert sp.complex_fraction(np.array([1000 + 1e-4j]), tol=1e-6) == 0.0
    assert sp.complex_fraction(np.array([1000 + 1e-2j]), tol=1e-6) == 1.0


def test_expansive_fraction_radius_condition():
    assert sp.expansive_fraction(np.array([0.5, 1.0, 2.0, -3.0])) == 0.5
    assert sp.expansive_fraction(np.array([1j * 1.5, 0.9])) == 0.5
    J = rng(3).standard_normal((25, 25))
    lam = np.linalg.eigvals(J)
    assert sp.spectral_radius(J) == pytest.approx(np.max(np.abs(lam)), rel=1e-12)
    assert sp.spectral_radius(lam) == pytest.approx(np.max(np.abs(lam)), rel=1e-15)
    assert sp.condition_number(J) == pytest.approx(np.linalg.cond(J), rel=1e-9)
    assert sp.condition_number(np.diag([4.0, 2.0, 0.5])) == 8.0
    assert sp.condition_number(np.array([2.0, 0.0])) == math.inf
    assert math.isnan(sp.condition_number(np.zeros(3)))


# ------------------------------------------------------------------------------ ranks


def test_effective_rank_and_pr_identity_and_projector():
    d = 12
    sv = np.linalg.svd(np.eye(d), compute_uv=False)
    assert sp.effective_rank(sv) == pytest.approx(d, abs=1e-12)
    assert sp.participation_ratio(sv) == pytest.approx(d, abs=1e-12)
    for r in (1, 3, 7):
        Q = random_orthogonal(d, r)[:, :r]
        P = Q @ Q.T
        s = np.linalg.svd(P, compute_uv=False)
        assert sp.effective_rank(s) == pytest.approx(r, abs=1e-9)
        assert sp.participation_ratio(s) == pytest.approx(r, abs=1e-9)
    assert sp.effective_rank(np.zeros(4)) == 0.0
    assert sp.participation_ratio(np.zeros(4)) == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_effective_rank_matches_scipy_entropy(seed):
    s = rng(seed).exponential(size=40)
    s[rng(seed + 10).integers(0, 40, 5)] = 0.0  # exact zeros: 0·log 0 = 0
    assert sp.effective_rank(s) == pytest.approx(math.exp(scipy.stats.entropy(s)), rel=1e-12)
    assert sp.effective_rank(1e200 * s) == pytest.approx(sp.effective_rank(s), rel=1e-12)
    pr = np.sum(s**2) ** 2 / np.sum(s**4)
    assert sp.participation_ratio(s) == pytest.approx(pr, rel=1e-12)
    assert sp.participation_ratio(1e-200 * s) == pytest.approx(pr, rel=1e-12)
    assert 1.0 <= sp.effective_rank(s) <= 40


# ------------------------------------------------------------------------------ self-alignment


def weighted_shift(sigma: np.ndarray) -> np.ndarray:
    """J e_i = σ_i e_{i+1 mod d}: u_i = e_{i+1}, v_i = e_i."""
    d = sigma.size
    J = np.zeros((d, d))
    J[(np.arange(d) + 1) % d, np.arange(d)] = sigma
    return J


def test_self_alignment_known_answers():
    A = rng(1).standard_normal((15, 15))
    psd = A @ A.T
    sym = A + A.T
    for k in (1, 4, 15):
        assert sp.self_alignment(psd, k) == pytest.approx(1.0, abs=1e-10)
        assert sp.self_alignment(sym, k) == pytest.approx(1.0, abs=1e-10)
    # decreasing weights along the cycle: top-k inputs e_0..e_{k-1}, outputs e_1..e_k
    d = 8
    J = weighted_shift(np.arange(d, 0, -1.0))
    for k in range(1, d):
        assert sp.self_alignment(J, k) == pytest.approx((k - 1) / k, abs=1e-12)
    assert sp.self_alignment(J, d) == pytest.approx(1.0, abs=1e-12)
    # top inputs on even indices map to odd outputs: orthogonal subspaces
    sigma = np.empty(d)
    sigma[[0, 2, 4, 6, 1, 3, 5, 7]] = np.arange(d, 0, -1.0)
    J = weighted_shift(sigma)
    for k in range(1, d // 2 + 1):
        assert sp.self_alignment(J, k) == pytest.approx(0.0, abs=1e-12)


def test_self_alignment_oracle():
    J = rng(4).standard_normal((20, 20))
    U, _, Vt = np.linalg.svd(J)
    for k in (1, 5, 20):
        expect = np.linalg.norm(U[:, :k].T @ Vt[:k].T) ** 2 / k
        assert sp.self_alignment(J, k) == pytest.approx(expect, rel=1e-10)


# ------------------------------------------------------------------------------ cumulative


def test_cumulative_matches_direct_product():
    g = rng(11)
    Js = [g.standard_normal((10, 10)) for _ in range(6)]
    P = np.eye(10)
    erank, pr, lg = [], [], []
    for J in Js:
        P = J @ P
        s = np.linalg.svd(P, compute_uv=False)
        erank.append(math.exp(scipy.stats.entropy(s)))
        pr.append(np.sum(s**2) ** 2 / np.sum(s**4))
        lg.append(math.log10(np.linalg.norm(P)))
    np.testing.assert_allclose(sp.cumulative_effective_rank(Js), erank, rtol=1e-9)
    np.testing.assert_allclose(sp.cumulative_participation_ratio(Js), pr, rtol=1e-9)
    sv, log10_fro = sp.cumulative_spectrum(iter(Js))  # any iterable, e.g. a generator
    np.testing.assert_allclose(log10_fro, lg, rtol=1e-12)
    np.testing.assert_allclose(np.sum(sv**2, axis=1), 1.0, rtol=1e-12)
    # lazy loaders work too
    np.testing.assert_allclose(sp.cumulative_effective_rank([lambda J=J: J for J in Js]), erank, rtol=1e-9)


@pytest.mark.parametrize("scale,depth", [(10.0, 200), (10.0, 400), (0.1, 400)])
def test_cumulative_no_overflow(scale, depth):
    d = 8
    Js = [scale * random_orthogonal(d, s) for s in range(depth)]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        naive = np.eye(d)
        for J in Js:
            naive = J @ naive
    er = sp.cumulative_effective_rank(Js)
    assert np.all(np.isfinite(er))
    np.testing.assert_allclose(er, d, rtol=1e-9)  # orthogonal products: all σ equal
    _, lg = sp.cumulative_spectrum(Js)
    expect = np.arange(1, depth + 1) * math.log10(scale) + 0.5 * math.log10(d)
    np.testing.assert_allclose(lg, expect, rtol=1e-9, atol=1e-9)
    if depth == 400:  # the unrescaled product is useless here
        assert not np.isfinite(naive).all() or np.linalg.norm(naive) == 0.0


def test_cumulative_random_norm10_200_layers():
    g = rng(12)
    Js = []
    for _ in range(200):
        A = g.standard_normal((16, 16))
        Js.append(10 * A / np.linalg.norm(A))
    er = sp.cumulative_effective_rank(Js)
    pr = sp.cumulative_participation_ratio(Js)
    assert np.all(np.isfinite(er)) and np.all(np.isfinite(pr))
    assert np.all((er >= 1 - 1e-12) & (er <= 16)) and np.all((pr >= 1 - 1e-12) & (pr <= 16))
    assert er[-1] < er[0]  # products of random matrices collapse towards rank 1


def test_cumulative_zero_product_stays_zero():
    Js = [np.eye(3), np.eye(3, k=1), np.eye(3, k=1), np.eye(3, k=1), np.eye(3)]
    er = sp.cumulative_effective_rank(Js)
    np.testing.assert_allclose(er, [3, 2, 1, 0, 0])
    _, lg = sp.cumulative_spectrum(Js)
    assert lg[-1] == -math.inf


# ------------------------------------------------------------------------------ spectrum / metrics


def test_spectrum_matches_numpy():
    J = rng(21).standard_normal((30, 30))
    out = sp.spectrum(J)
    assert match_eigenvalues(out["eigenvalues"], np.linalg.eigvals(J)) < 1e-10
    assert np.all(np.diff(np.abs(out["eigenvalues"])) <= 1e-12)
    np.testing.assert_allclose(out["singular_values"], np.linalg.svd(J, compute_uv=False), rtol=1e-12)
    np.testing.assert_allclose(out["singular_values_JmI"], np.linalg.svd(J - np.eye(30), compute_uv=False), rtol=1e-12)


def test_sublayer_metrics_against_oracles():
    d = 40
    g = rng(22)
    J = np.eye(d) + 0.3 * g.standard_normal((d, d)) + 0.5 * np.triu(g.standard_normal((d, d)), 1)
    m = sp.sublayer_metrics(J, k_fraction=0.1, tolerances=(1e-9, 1e-6, 1e-3))
    lam = np.linalg.eigvals(J)
    U, s, Vt = np.linalg.svd(J)
    sm = np.linalg.svd(J - np.eye(d), compute_uv=False)
    assert m["d"] == d
    assert m["spectral_radius"] == pytest.approx(np.max(np.abs(lam)), rel=1e-10)
    assert m["condition_number"] == pytest.approx(s[0] / s[-1], rel=1e-9)
    assert m["henrici"] == pytest.approx(naive_henrici(J), rel=1e-9)
    assert m["henrici_JmI"] == pytest.approx(naive_henrici(J - np.eye(d)), rel=1e-9)
    assert m["fro_minus_identity"] == pytest.approx(np.linalg.norm(J - np.eye(d)), rel=1e-12)
    for t in ("1e-09", "1e-06", "1e-03"):
        tol = float(t)
        cf = np.mean(np.abs(lam.imag) > tol * np.maximum(1, np.abs(lam)))
        cfm = np.mean(np.abs(lam.imag) > tol * np.abs(lam - 1))  # no roundoff-level Im here
        assert m[f"complex_frac_J_tol{t}"] == pytest.approx(cf)
        assert m[f"complex_frac_JmI_tol{t}"] == pytest.approx(cfm)
    assert m["expansive_frac_eig"] == pytest.approx(np.mean(np.abs(lam) > 1))
    assert m["expansive_frac_sv"] == pytest.approx(np.mean(s > 1))
    assert m["k_frac"] == 4
    erank = math.exp(scipy.stats.entropy(s))
    assert m["erank_J"] == pytest.approx(erank, rel=1e-10)
    assert m["pr_J"] == pytest.approx(np.sum(s**2) ** 2 / np.sum(s**4), rel=1e-10)
    assert m["erank_JmI"] == pytest.approx(math.exp(scipy.stats.entropy(sm)), rel=1e-10)
    assert m["pr_JmI"] == pytest.approx(np.sum(sm**2) ** 2 / np.sum(sm**4), rel=1e-10)
    assert m["k_erank"] == int(math.floor(erank + 0.5))
    for key, k in (("self_alignment_kfrac", 4), ("self_alignment_k1", 1), ("self_alignment_kerank", m["k_erank"])):
        assert m[key] == pytest.approx(np.linalg.norm(U[:, :k].T @ Vt[:k].T) ** 2 / k, rel=1e-9)


def test_complex_fraction_of_j_minus_i_is_relative_to_lambda_minus_one():
    """Known answer: J = I + eps·(block diag of 2×2 rotations by theta_b) ⊕ real entries.

    The eigenvalues of the 2×2 block eps·[[cos t, -sin t], [sin t, cos t]] are eps·e^{±it}, so
    λ − 1 = eps·e^{±it}: its phase counts at tol iff |sin t| > tol, whatever eps is; J's own
    complex fraction (absolute threshold tol for |λ| ≈ 1) misses all of them once eps·|sin t| ≤ tol.
    """
    eps = 1e-8
    thetas = [np.pi / 4, np.pi / 2, 1e-4, 3e-7]  # |sin| > 1e-6 for the first three only
    blocks = [eps * np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]]) for t in thetas]
    R = scipy.linalg.block_diag(*blocks, np.diag([0.3, -0.2, 0.0, eps]))
    g = rng(5)
    Q, _ = np.linalg.qr(g.standard_normal((R.shape[0],) * 2))  # hide the blocks in a rotated basis
    J = np.eye(R.shape[0]) + Q @ R @ Q.T
    d = J.shape[0]
    m = sp.sublayer_metrics(J, tolerances=(1e-6,))
    assert m["complex_frac_JmI_tol1e-06"] == pytest.approx(6 / d)
    assert m["complex_frac_J_tol1e-06"] == 0.0
    # the closed-form eigenvalues give the same count
    lam = 1 + np.concatenate(
        [eps * np.exp(1j * np.array(thetas)), eps * np.exp(-1j * np.array(thetas)), [0.3, -0.2, 0.0, eps]]
    )
    assert sp.shifted_complex_fraction(lam, 1.0, 1e-6) == pytest.approx(6 / d)
    # eigenvalues at 1 with roundoff-level imaginary parts do not count
    assert sp.shifted_complex_fraction(np.array([1 + 1e-17j, 1 - 1e-17j, 2.0]), 1.0, 1e-6) == 0.0
    assert sp.shifted_complex_fraction(np.array([1.0, 2.0]), 1.0, 1e-6) == 0.0


def naive_asymmetry(J: np.ndarray, shift: float = 0.0) -> float:
    """‖J − Jᵀ‖_F / ‖J − shift·I‖_F by explicit sums over entries (the oracle)."""
    d = J.shape[0]
    num = math.sqrt(sum((J[i, j] - J[j, i]) ** 2 for i in range(d) for j in range(d)))
    A = J - shift * np.eye(d)
    return num / math.sqrt(sum(A[i, j] ** 2 for i in range(d) for j in range(d)))


def test_symmetry_index_known_answers():
    g = rng(31)
    B = g.standard_normal((12, 12))
    S, A = B + B.T, B - B.T
    assert sp.symmetry_index(S) == 0.0  # symmetric
    assert sp.symmetry_index(A) == pytest.approx(2.0, rel=1e-14)  # antisymmetric: the maximum
    assert sp.symmetry_index(np.zeros((3, 3))) == 0.0
    # S + A with ‖S‖_F = ‖A‖_F: 2‖A‖/sqrt(‖S‖² + ‖A‖²) = 2/√2 = √2
    S1, A1 = S / np.linalg.norm(S), A / np.linalg.norm(A)
    assert sp.symmetry_index(S1 + A1) == pytest.approx(math.sqrt(2), rel=1e-13)
    # a 2×2 rotation by θ: ‖J − Jᵀ‖ = 2√2 |sin θ|, ‖J‖ = √2 -> 2|sin θ|; minus I: ‖J − I‖ = 2√2 |sin(θ/2)|
    th = 0.7
    R = np.array([[math.cos(th), -math.sin(th)], [math.sin(th), math.cos(th)]])
    assert sp.symmetry_index(R) == pytest.approx(2 * math.sin(th), rel=1e-13)
    assert sp.symmetry_index(R, shift=1.0) == pytest.approx(math.sin(th) / math.sin(th / 2), rel=1e-13)
    # i.i.d. Gaussian: → √2 as d grows
    assert sp.symmetry_index(rng(32).standard_normal((300, 300))) == pytest.approx(math.sqrt(2), abs=0.01)


def test_symmetry_columns_of_sublayer_metrics_match_the_direct_formula():
    d = 15
    J = np.eye(d) + 0.4 * rng(33).standard_normal((d, d))
    m = sp.sublayer_metrics(J)
    assert m["symmetry"] == pytest.approx(naive_asymmetry(J), rel=1e-12)
    assert m["symmetry_minus_identity"] == pytest.approx(naive_asymmetry(J, 1.0), rel=1e-12)
    assert 0 <= m["symmetry"] <= 2 and 0 <= m["symmetry_minus_identity"] <= 2
    sym = sp.sublayer_metrics(J + J.T)
    assert sym["symmetry"] == 0.0 and sym["symmetry_minus_identity"] == 0.0 and sym["henrici"] < 1e-12
    eye = sp.sublayer_metrics(np.eye(4))
    assert eye["symmetry"] == 0.0 and eye["symmetry_minus_identity"] == 0.0  # J − I = 0: by convention 0
    table, _ = sp.spectra_table({(0, "attn"): J, (0, "mlp"): np.eye(d)})
    cols = list(table.columns)
    assert cols.index("symmetry") == cols.index("henrici_JmI") + 1  # tabulated next to the Henrici departure
    assert table["symmetry"].tolist() == pytest.approx([m["symmetry"], 0.0])


def test_sublayer_metrics_identity_and_small_d():
    m = sp.sublayer_metrics(np.eye(4))
    assert (m["henrici"], m["erank_J"], m["pr_J"], m["erank_JmI"], m["pr_JmI"]) == (0.0, 4.0, 4.0, 0.0, 0.0)
    assert m["henrici_JmI"] == 0.0 and m["fro_minus_identity"] == 0.0
    assert m["k_frac"] == 1  # round(0.4) would be 0: clipped to ≥ 1
    assert sp.sublayer_metrics(np.eye(25), k_fraction=0.1)["k_frac"] == 3  # 2.5 rounds half up
    m1 = sp.sublayer_metrics(np.array([[2.0]]))
    assert m1["spectral_radius"] == 2.0 and m1["self_alignment_k1"] == 1.0


# ------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "bad,fragment",
    [
        (np.zeros((3, 4)), "(3, 4)"),
        (np.zeros(5), "(5,)"),
        (np.zeros((2, 2, 2)), "(2, 2, 2)"),
        (np.zeros((0, 0)), "(0, 0)"),
        (np.array([[1.0, np.nan], [0.0, 1.0]]), "NaN"),
        (np.array([[1.0, np.inf], [0.0, 1.0]]), "(2, 2)"),
        (np.array([["a", "b"], ["c", "d"]]), "dtype"),
    ],
)
@pytest.mark.parametrize(
    "fn",
    [sp.henrici_departure, sp.nonnormal_norm, sp.spectrum, sp.sublayer_metrics, lambda J: sp.self_alignment(J, 1)],
)
def test_bad_matrices_raise(bad, fragment, fn):
    with pytest.raises(ValueError) as exc:
        fn(bad)
    assert fragment in str(exc.value)


def test_bad_values_raise():
    with pytest.raises(ValueError, match=r"k must be in \[1, 3\].*k = 0"):
        sp.self_alignment(np.eye(3), 0)
    with pytest.raises(ValueError, match=r"k = 4"):
        sp.self_alignment(np.eye(3), 4)
    with pytest.raises(ValueError, match="integer"):
        sp.self_alignment(np.eye(3), 1.5)
    with pytest.raises(ValueError, match="≥ 0"):
        sp.effective_rank(np.array([1.0, -0.5]))
    with pytest.raises(ValueError, match=r"\(0,\)"):
        sp.participation_ratio(np.array([]))
    with pytest.raises(ValueError, match="NaN"):
        sp.effective_rank(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="real"):
        sp.effective_rank(np.array([1.0 + 1j]))
    with pytest.raises(ValueError, match="tol"):
        sp.complex_fraction(np.array([1j]), tol=-1)
    with pytest.raises(ValueError, match=r"\(2, 2\)"):
        sp.complex_fraction(np.eye(2))
    with pytest.raises(ValueError, match=r"k_fraction must be in \(0, 1\], got 1.5"):
        sp.sublayer_metrics(np.eye(3), k_fraction=1.5)
    with pytest.raises(ValueError, match="duplicate"):
        sp.sublayer_metrics(np.eye(3), tolerances=(1e-6, 1.0000001e-6))
    with pytest.raises(ValueError, match="empty"):
        sp.cumulative_effective_rank([])
    with pytest.raises(ValueError, match=r"jacobians\[1\] has shape \(3, 3\)"):
        sp.cumulative_effective_rank([np.eye(2), np.eye(3)])


# ------------------------------------------------------------------------------ tables


def test_spectra_table_order_columns_and_arrays():
    g = rng(31)
    jac = {(1, "mlp"): g.standard_normal((6, 6)), (0, "mlp"): np.eye(6), (1, "attn"): lambda: 2 * np.eye(6)}
    jac[(0, "attn")] = g.standard_normal((6, 6)).astype(np.float32)
    df, arrays = sp.spectra_table(jac, k_fraction=0.5, tolerances=(1e-6,))
    assert df[["layer", "kind", "s"]].values.tolist() == [[0, "attn", 0], [0, "mlp", 1], [1, "attn", 2], [1, "mlp", 3]]
    assert list(df.columns[:3]) == ["layer", "kind", "s"]
    assert "complex_frac_J_tol1e-06" in df and "complex_frac_JmI_tol1e-06" in df
    assert list(arrays) == ["L000_attn", "L000_mlp", "L001_attn", "L001_mlp"]
    J = jac[(1, "mlp")]
    assert match_eigenvalues(arrays["L001_mlp"]["eigenvalues"], np.linalg.eigvals(J)) < 1e-10
    assert arrays["L001_mlp"]["eigenvalues"].dtype == np.complex128
    row = df.iloc[3].to_dict()
    m = sp.sublayer_metrics(J, k_fraction=0.5, tolerances=(1e-6,))
    assert all(row[k] == pytest.approx(v) for k, v in m.items())
    with pytest.raises(ValueError, match="kind must be one of"):
        sp.spectra_table({(0, "ffn"): np.eye(2)})
    with pytest.raises(ValueError, match=r"jacobians\[\(0, 'attn'\)\].*\(2, 3\)"):
        sp.spectra_table({(0, "attn"): np.zeros((2, 3))})
    with pytest.raises(ValueError, match="layer"):
        sp.spectra_table({(-1, "attn"): np.eye(2)})


def test_bottleneck_table():
    g = rng(41)
    mats = [g.standard_normal((7, 7)) for _ in range(4)]
    jac = {(s // 2, sp.KINDS[s % 2]): m for s, m in enumerate(mats)}
    df = sp.bottleneck_table(jac)
    assert list(df.columns) == [
        "s",
        "layer",
        "kind",
        "d",
        "erank",
        "erank_energy",
        "participation_ratio",
        "log10_fro",
        "erank_single",
        "pr_single",
    ]
    np.testing.assert_allclose(df["erank"], sp.cumulative_effective_rank(mats), rtol=1e-12)
    # the energy reading: exp(H(p)), p = σ²/Σσ², from the explicit product's SVD
    P, want = np.eye(7), []
    for m in mats:
        P = m @ P
        e = np.linalg.svd(P, compute_uv=False) ** 2
        want.append(np.exp(-np.sum(e / e.sum() * np.log(e / e.sum()))))
    np.testing.assert_allclose(df["erank_energy"], want, rtol=1e-9)
    assert (df["erank_energy"] < df["erank"]).all()  # squaring sharpens a spread spectrum
    np.testing.assert_allclose(df["participation_ratio"], sp.cumulative_participation_ratio(mats), rtol=1e-12)
    np.testing.assert_allclose(
        df["erank_single"], [sp.effective_rank(np.linalg.svd(m, compute_uv=False)) for m in mats], rtol=1e-10
    )
    del jac[(0, "mlp")]
    with pytest.raises(ValueError, match=r"missing \(layer, kind\): \(0, 'mlp'\)"):
        sp.bottleneck_table(jac)
    with pytest.raises(ValueError, match=r"\(3, 3\).*2×2"):
        sp.bottleneck_table({(0, "attn"): np.eye(2), (0, "mlp"): np.eye(3)})


def test_checkpoint_table():
    g = rng(51)
    tabs, bots = {}, {}
    for ck in ("step0", "final"):
        jac = {(s // 2, sp.KINDS[s % 2]): g.standard_normal((5, 5)) for s in range(4)}
        tabs[ck] = sp.spectra_table(jac)[0]
        bots[ck] = sp.bottleneck_table(jac)
    out = sp.checkpoint_table(tabs, bots)
    assert len(out) == 8 and out["ckpt"].tolist() == ["step0"] * 4 + ["final"] * 4
    assert list(out.columns[:4]) == ["ckpt", "layer", "kind", "s"]
    for c in ("complex_frac_J_tol1e-06", "henrici", "self_alignment_kfrac", "cum_erank", "cum_pr"):
        assert c in out
    np.testing.assert_allclose(out.loc[out.ckpt == "final", "cum_erank"], bots["final"]["erank"])
    np.testing.assert_allclose(out.loc[out.ckpt == "final", "cum_erank_energy"], bots["final"]["erank_energy"])
    assert "cum_erank" not in sp.checkpoint_table(tabs)
    with pytest.raises(ValueError, match="must match"):
        sp.checkpoint_table(tabs, {"step0": bots["step0"]})
    with pytest.raises(ValueError, match=r"lacks columns \['nope'\]"):
        sp.checkpoint_table(tabs, metrics=["nope"])
    with pytest.raises(ValueError, match="non-empty"):
        sp.checkpoint_table({})
    assert isinstance(out, pd.DataFrame)
