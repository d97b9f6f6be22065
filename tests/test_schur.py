"""Unit tests of resdyn.study_a.schur: Schur surgery of the non-normal part."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from resdyn.study_a import schur as sc
from resdyn.study_a import spectral as sp


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def match_eigenvalues(a: np.ndarray, b: np.ndarray) -> float:
    cost = np.abs(a[:, None] - b[None, :])
    r, c = linear_sum_assignment(cost)
    return float(cost[r, c].max())


def random_real(d: int = 24, seed: int = 0) -> np.ndarray:
    g = rng(seed)
    return g.standard_normal((d, d)) + np.triu(g.standard_normal((d, d)), 1)


def random_complex(d: int = 16, seed: int = 0) -> np.ndarray:
    g = rng(seed)
    return g.standard_normal((d, d)) + 1j * g.standard_normal((d, d))


CASES = [
    ("real/real", lambda: random_real(24, 1), "real"),
    ("real/complex", lambda: random_real(24, 2), "complex"),
    ("complex/complex", lambda: random_complex(16, 3), "complex"),
    ("real/auto", lambda: random_real(17, 4), "auto"),
]


@pytest.mark.parametrize("name,make,form", CASES, ids=[c[0] for c in CASES])
def test_alpha_one_reproduces_J(name, make, form):
    J = make()
    np.testing.assert_allclose(sc.scale_nonnormal(J, 1.0, form), J, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name,make,form", CASES, ids=[c[0] for c in CASES])
def test_alpha_zero_is_normal_with_same_eigenvalues(name, make, form):
    J = make()
    J0 = sc.scale_nonnormal(J, 0.0, form)
    assert sp.henrici_departure(J0) < 1e-10
    assert np.linalg.norm(J0 @ J0.conj().T - J0.conj().T @ J0) < 1e-10 * np.linalg.norm(J) ** 2
    assert match_eigenvalues(np.linalg.eigvals(J0), np.linalg.eigvals(J)) < 1e-8


@pytest.mark.parametrize("name,make,form", CASES, ids=[c[0] for c in CASES])
def test_frobenius_identity_and_henrici_curve(name, make, form):
    J = make()
    lam = np.linalg.eigvals(J)
    normal2 = float(np.sum(np.abs(lam) ** 2))
    N2 = np.linalg.norm(J) ** 2 - normal2
    split = sc.schur_split(J, form)
    assert split.nonnormal_fro**2 == pytest.approx(N2, rel=1e-9)
    alphas = np.linspace(0, 2, 9)
    h = []
    for a in alphas:
        Ja = split.at(a)
        assert np.linalg.norm(Ja) ** 2 == pytest.approx(normal2 + a * a * N2, rel=1e-10)
        assert match_eigenvalues(np.linalg.eigvals(Ja), lam) < 1e-7  # eigenvalues fixed for every α
        h.append(sp.henrici_departure(Ja))
        assert h[-1] == pytest.approx(a * math.sqrt(N2) / math.sqrt(normal2 + a * a * N2), abs=1e-9)
        assert split.henrici(a) == pytest.approx(h[-1], abs=1e-9)
    assert np.all(np.diff(h) > 0)  # the departure grows with α (it shrinks as α → 0)


def test_real_form_stays_real_complex_form_does_not():
    J = random_real(20, 5)
    assert sp.complex_fraction(np.linalg.eigvals(J)) > 0  # has complex pairs
    for a in (0.0, 0.4, 1.0, 1.5):
        Ja = sc.scale_nonnormal(J, a)
        assert Ja.dtype == np.float64
    # the docs/design.md complex form is genuinely complex for real J with complex pairs, α ≠ 1
    Jc0 = sc.scale_nonnormal(J, 0.0, "complex")
    assert Jc0.dtype == np.complex128 and np.abs(Jc0.imag).max() > 1e-3
    assert np.abs(sc.scale_nonnormal(J, 1.0, "complex").imag).max() < 1e-10
    # the real normal part is at least as close to J as Q Λ Q^H (distance ‖N‖_F)
    nn = sc.schur_split(J).nonnormal_fro
    assert np.linalg.norm(J - sc.scale_nonnormal(J, 0.0)) <= nn * (1 + 1e-12)
    assert np.linalg.norm(J - Jc0) == pytest.approx(nn, rel=1e-10)


def test_real_eigenvalues_make_both_forms_real():
    g = rng(6)
    Q = np.linalg.qr(g.standard_normal((12, 12)))[0]
    J = Q @ (np.diag(np.arange(1.0, 13.0)) + np.triu(g.standard_normal((12, 12)), 1)) @ Q.T
    for a in (0.0, 0.5):
        Jc = sc.scale_nonnormal(J, a, "complex")
        assert np.abs(Jc.imag).max() < 1e-10
        Jr = sc.scale_nonnormal(J, a, "real")
        assert np.linalg.norm(Jr) == pytest.approx(np.linalg.norm(Jc), rel=1e-12)


@pytest.mark.parametrize("form", ["real", "complex"])
def test_triangular_known_answer(form):
    T = np.triu(rng(7).standard_normal((10, 10)))
    for a in (0.0, 0.3, 2.0):
        expect = np.diag(np.diag(T)) + a * np.triu(T, 1)
        np.testing.assert_allclose(sc.scale_nonnormal(T, a, form), expect, rtol=0, atol=1e-12)


def two_by_two_oracle(J: np.ndarray, a: float) -> np.ndarray:
    """Coordinate-free real-form answer for a 2×2 real J with complex eigenvalues."""
    mean = np.trace(J) / 2
    S = 0.5 * (J + J.T) - mean * np.eye(2)
    w = 0.5 * (J[0, 1] - J[1, 0])
    omega2 = w * w - np.sum(S * S) / 2
    K = np.array([[0.0, 1.0], [-1.0, 0.0]])
    return mean * np.eye(2) + a * S + np.sign(w) * math.sqrt(omega2 + a * a * np.sum(S * S) / 2) * K


def test_two_by_two_known_answers():
    J = np.array([[0.0, 4.0], [-1.0, 0.0]])  # eigenvalues ±2i
    np.testing.assert_allclose(sc.scale_nonnormal(J, 0.0), [[0.0, 2.0], [-2.0, 0.0]], atol=1e-12)
    g = rng(8)
    n = 0
    while n < 10:
        B = g.standard_normal((2, 2))
        if (B[0, 0] - B[1, 1]) ** 2 / 4 + B[0, 1] * B[1, 0] >= -0.05:
            continue  # need a well-separated complex pair
        n += 1
        for a in (0.0, 0.5, 1.0, 3.0):
            np.testing.assert_allclose(sc.scale_nonnormal(B, a), two_by_two_oracle(B, a), atol=1e-12)


def test_non_standardised_block_is_handled():
    """The block formula is rotation-invariant: no reliance on LAPACK's standard form."""
    T = np.array([[1.0, 2.0, 0.3], [-3.0, 0.5, 0.7], [0.0, 0.0, -2.0]])
    lam = np.linalg.eigvals(T)
    split = sc.SchurSplit(
        Q=np.eye(3), T=T, form="real", eigenvalues=lam, nonnormal_fro=float("nan"), normal_fro=float("nan")
    )
    np.testing.assert_allclose(split.at(1.0), T, atol=1e-14)
    for a in (0.0, 0.5, 2.0):
        Ta = split.at(a)
        assert match_eigenvalues(np.linalg.eigvals(Ta), lam) < 1e-12
        np.testing.assert_allclose(Ta[:2, :2], two_by_two_oracle(T[:2, :2], a), atol=1e-12)
        np.testing.assert_allclose(Ta[:2, 2], a * T[:2, 2], atol=1e-14)
    assert sp.henrici_departure(split.at(0.0)) < 1e-14


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.linalg.qr(rng(9).standard_normal((15, 15)))[0],
        lambda: (lambda A: A + A.T)(rng(10).standard_normal((15, 15))),
        lambda: np.linalg.qr(random_complex(10, 11))[0],
        lambda: np.diag(rng(12).standard_normal(6)),
    ],
    ids=["orthogonal", "symmetric", "unitary", "diagonal"],
)
def test_normal_matrix_is_fixed(make):
    J = make()
    for a in (0.0, 0.5, 2.0):
        np.testing.assert_allclose(sc.scale_nonnormal(J, a), J, rtol=0, atol=1e-10)


def test_schur_bottleneck_alpha_one_is_plain_bottleneck():
    g = rng(13)
    mats = [np.eye(8) + 0.5 * g.standard_normal((8, 8)) for _ in range(4)]
    jac = {(s // 2, sp.KINDS[s % 2]): m for s, m in enumerate(mats)}
    df = sc.schur_bottleneck(jac, alphas=[0.0, 0.5, 1.0])
    assert list(df.columns) == ["alpha", "s", "layer", "kind", "erank", "pr", "log10_fro", "henrici_single"]
    assert df[["alpha", "s"]].values.tolist() == [[a, s] for a in (0.0, 0.5, 1.0) for s in range(4)]
    plain = sp.bottleneck_table(jac)
    one = df[df.alpha == 1.0].reset_index(drop=True)
    np.testing.assert_allclose(one["erank"], plain["erank"], rtol=1e-9)
    np.testing.assert_allclose(one["pr"], plain["participation_ratio"], rtol=1e-9)
    np.testing.assert_allclose(one["log10_fro"], plain["log10_fro"], rtol=1e-9)
    np.testing.assert_allclose(one["henrici_single"], [sp.henrici_departure(m) for m in mats], rtol=1e-9)
    assert np.all(df.loc[df.alpha == 0.0, "henrici_single"] == 0.0)
    # α = 0 equals the product of the explicitly scaled matrices
    P = np.eye(8)
    for s, m in enumerate(mats):
        P = sc.scale_nonnormal(m, 0.0) @ P
        er = sp.effective_rank(np.linalg.svd(P, compute_uv=False))
        assert df[(df.alpha == 0.0) & (df.s == s)]["erank"].item() == pytest.approx(er, rel=1e-9)
    seq = sc.schur_bottleneck(iter(mats), alphas=[1.0], form="complex")
    assert "layer" not in seq
    np.testing.assert_allclose(seq["erank"], plain["erank"], rtol=1e-9)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match=r"\(3, 4\)"):
        sc.scale_nonnormal(np.zeros((3, 4)), 0.5)
    with pytest.raises(ValueError, match="NaN"):
        sc.scale_nonnormal(np.array([[np.nan, 0.0], [0.0, 1.0]]), 0.5)
    for bad in (math.nan, math.inf, "x", True):
        with pytest.raises(ValueError, match="alpha"):
            sc.scale_nonnormal(np.eye(2), bad)
    with pytest.raises(ValueError, match="form must be one of"):
        sc.scale_nonnormal(np.eye(2), 0.5, form="schur")
    with pytest.raises(ValueError, match="form='real' needs a real matrix"):
        sc.scale_nonnormal(np.eye(2) * 1j, 0.5, form="real")
    with pytest.raises(ValueError, match="distinct"):
        sc.schur_bottleneck([np.eye(2)], alphas=[0.0, 0.0])
    with pytest.raises(ValueError, match="NaN"):
        sc.schur_bottleneck([np.eye(2)], alphas=[0.0, math.nan])
    with pytest.raises(ValueError, match="empty"):
        sc.schur_bottleneck([], alphas=[1.0])
    with pytest.raises(ValueError, match=r"missing \(layer, kind\): \(0, 'attn'\)"):
        sc.schur_bottleneck({(0, "mlp"): np.eye(2)}, alphas=[1.0])
