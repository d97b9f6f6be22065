"""Readout subspaces, RSS and Grassmann distance: known answers and scipy as oracle."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.linalg import hadamard, subspace_angles

from resdyn.study_b.readout import (
    energy_share,
    grassmann_distance,
    k_from_fraction,
    pareto_front,
    principal_angles,
    readout_subspace,
    resolution_table,
    rss,
    rss_profile,
)


def _random_basis(rng: np.random.Generator, d: int, k: int) -> np.ndarray:
    return rng.standard_normal((d, k))


def _random_orthogonal(rng: np.random.Generator, n: int) -> np.ndarray:
    Q, R = np.linalg.qr(rng.standard_normal((n, n)))
    return Q * np.sign(np.diag(R))


# ---------------------------------------------------------------- known answers


@pytest.mark.parametrize("d,k", [(4, 1), (8, 3), (16, 16)])
def test_identical_subspaces(d, k):
    V = _random_basis(np.random.default_rng(0), d, k)
    assert rss(V, V) == pytest.approx(1.0, abs=1e-14)
    assert grassmann_distance(V, V) == pytest.approx(0.0, abs=1e-12)
    # another basis of the same subspace
    W = V @ np.random.default_rng(1).standard_normal((k, k))
    assert rss(V, W) == pytest.approx(1.0, abs=1e-13)
    assert grassmann_distance(V, W) == pytest.approx(0.0, abs=1e-10)


@pytest.mark.parametrize("d", [2, 4, 8, 16, 64])
def test_orthogonal_hadamard_halves(d):
    H = hadamard(d) / np.sqrt(d)
    k = d // 2
    V1, V2 = H[:, :k], H[:, k:]
    assert rss(V1, V2) == pytest.approx(0.0, abs=1e-14)
    assert grassmann_distance(V1, V2) == pytest.approx(np.sqrt(k) * np.pi / 2, rel=1e-14)
    np.testing.assert_allclose(principal_angles(V1, V2), np.full(k, np.pi / 2), rtol=1e-14)


def test_one_shared_one_orthogonal_direction():
    e = np.eye(5)
    assert rss(e[:, :2], e[:, [0, 2]]) == pytest.approx(0.5, abs=1e-15)
    assert grassmann_distance(e[:, :2], e[:, [0, 2]]) == pytest.approx(np.pi / 2, rel=1e-15)


def test_known_angle_in_a_plane():
    # span(e0) vs span(cos t e0 + sin t e1): single angle t, also tiny t (sine route)
    for t in [1e-9, 1e-4, 0.3, np.pi / 4, 1.2, np.pi / 2 - 1e-7]:
        V1 = np.array([[1.0], [0.0], [0.0]])
        V2 = np.array([[np.cos(t)], [np.sin(t)], [0.0]])
        assert grassmann_distance(V1, V2) == pytest.approx(t, rel=1e-9)
        assert rss(V1, V2) == pytest.approx(V2[0, 0], rel=1e-12)  # cos t as stored


# ---------------------------------------------------------------- scipy oracle
#
# scipy.linalg.subspace_angles mixes its arcsin/arccos routes with a mask taken in the order of
# the cosines while the angles are in the reverse order, so an angle near 0 or π/2 can come
# from the ill-conditioned route there (error of order sqrt(eps), e.g. 1.49e-8 or 2.1e-8 instead
# of an exact 0 for intersecting subspaces). The aggregates are compared at rtol 1e-12, single
# angles at rtol 1e-12 with an absolute allowance of 1e-7 for that; the strict per-angle check
# is against a 40-digit mpmath oracle below.


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("d,k", [(10, 1), (10, 4), (32, 8), (64, 5), (12, 6), (20, 15), (12, 12)])
def test_agrees_with_scipy_subspace_angles(seed, d, k):
    rng = np.random.default_rng(seed)
    A, B = _random_basis(rng, d, k), _random_basis(rng, d, k)
    for X, Y in ((A, B), (B, A)):
        ref = np.sort(subspace_angles(X, Y))
        np.testing.assert_allclose(principal_angles(X, Y), ref, rtol=1e-12, atol=1e-7)
        assert grassmann_distance(X, Y) == pytest.approx(np.sqrt(np.sum(ref**2)), rel=1e-12)
        assert rss(X, Y) == pytest.approx(np.mean(np.cos(ref)), rel=1e-12)
    assert rss(A, B) == pytest.approx(rss(B, A), rel=1e-13)
    assert grassmann_distance(A, B) == pytest.approx(grassmann_distance(B, A), rel=1e-12)


def _mp_angles(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Principal angles in 40-digit arithmetic (mpmath QR + SVD), ascending."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(40):
        k = A.shape[1]
        QA = mpmath.qr(mpmath.matrix(A.tolist()))[0][:, :k]
        QB = mpmath.qr(mpmath.matrix(B.tolist()))[0][:, :k]
        c = mpmath.svd_r(QA.T * QB, compute_uv=False)
        cos = sorted((min(c[i], mpmath.mpf(1)) for i in range(k)), reverse=True)
        return np.array([float(mpmath.acos(ci)) for ci in cos])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("d,k", [(12, 6), (10, 4), (32, 8)])
def test_angles_match_high_precision_oracle(seed, d, k):
    rng = np.random.default_rng(seed)
    A, B = _random_basis(rng, d, k), _random_basis(rng, d, k)
    np.testing.assert_allclose(principal_angles(A, B), _mp_angles(A, B), rtol=1e-12)


def test_intersecting_subspaces_have_exact_zero_angles():
    # d=20, k=15: the subspaces share (at least) 10 dimensions
    rng = np.random.default_rng(0)
    A, B = _random_basis(rng, 20, 15), _random_basis(rng, 20, 15)
    theta = principal_angles(A, B)
    assert np.all(theta[:10] < 1e-13)  # the sine route; arccos alone floors at ~1.5e-8
    assert np.all(theta[10:] > 1e-3)


def test_close_subspaces_small_angles_match_scipy():
    rng = np.random.default_rng(7)
    A = _random_basis(rng, 30, 5)
    B = A + 1e-7 * rng.standard_normal(A.shape)
    ref = np.sort(subspace_angles(A, B))
    np.testing.assert_allclose(principal_angles(A, B), ref, rtol=1e-6)
    assert 0 < grassmann_distance(A, B) < 1e-5  # arccos alone would floor at ~1e-8 per angle


# ---------------------------------------------------------------- invariances


@pytest.mark.parametrize("seed", range(4))
def test_invariant_to_basis_choice(seed):
    rng = np.random.default_rng(seed)
    d, k = 16, 5
    V1 = np.linalg.qr(_random_basis(rng, d, k))[0]
    V2 = np.linalg.qr(_random_basis(rng, d, k))[0]
    Q1, Q2 = _random_orthogonal(rng, k), _random_orthogonal(rng, k)
    r, g = rss(V1, V2), grassmann_distance(V1, V2)
    assert rss(V1 @ Q1, V2 @ Q2) == pytest.approx(r, rel=1e-12)
    assert grassmann_distance(V1 @ Q1, V2 @ Q2) == pytest.approx(g, rel=1e-12)
    # a non-orthogonal change of basis spans the same subspace too
    M = rng.standard_normal((k, k)) + 3 * np.eye(k)
    assert rss(V1 @ M, V2) == pytest.approx(r, rel=1e-10)


@pytest.mark.parametrize("seed", range(4))
def test_invariant_to_common_rotation(seed):
    rng = np.random.default_rng(seed)
    d, k = 12, 4
    V1, V2 = _random_basis(rng, d, k), _random_basis(rng, d, k)
    R = _random_orthogonal(rng, d)
    assert rss(R @ V1, R @ V2) == pytest.approx(rss(V1, V2), rel=1e-12)
    assert grassmann_distance(R @ V1, R @ V2) == pytest.approx(grassmann_distance(V1, V2), rel=1e-12)


def test_range_on_random_pairs():
    rng = np.random.default_rng(3)
    for _ in range(20):
        d = int(rng.integers(2, 20))
        k = int(rng.integers(1, d + 1))
        A, B = _random_basis(rng, d, k), _random_basis(rng, d, k)
        assert 0.0 <= rss(A, B) <= 1.0
        assert 0.0 <= grassmann_distance(A, B) <= np.sqrt(k) * np.pi / 2 + 1e-12


# ---------------------------------------------------------------- readout_subspace


def test_readout_subspace_of_diagonal_picks_top_axes():
    A = np.diag([1.0, 5.0, 3.0, 0.5, 4.0])
    V = readout_subspace(A, 3)
    assert V.shape == (5, 3) and V.dtype == np.float64
    np.testing.assert_allclose(np.abs(V), np.eye(5)[:, [1, 4, 2]], atol=1e-15)


def test_readout_subspace_is_right_singular_subspace():
    rng = np.random.default_rng(0)
    A = np.eye(8) + 0.5 * rng.standard_normal((8, 8))
    V = readout_subspace(A, 3)
    np.testing.assert_allclose(V.T @ V, np.eye(3), atol=1e-14)
    _, s, Vt = np.linalg.svd(A)
    # A V = U_k Σ_k : norms of A v_i are the top singular values
    np.testing.assert_allclose(np.linalg.norm(A @ V, axis=0), s[:3], rtol=1e-12)
    assert rss(V, Vt[:3].T) == pytest.approx(1.0, abs=1e-13)
    # rows of A do not matter, only the input side: a left rotation leaves S unchanged
    R = _random_orthogonal(rng, 8)
    assert rss(readout_subspace(R @ A, 3), V) == pytest.approx(1.0, abs=1e-12)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "args,match",
    [
        ((np.ones(4), 1), r"2-D.*\(4,\)"),
        ((np.ones((3, 3, 3)), 1), r"2-D.*\(3, 3, 3\)"),
        ((np.eye(3), 0), r"1 <= k <= 3.*k=0"),
        ((np.eye(3), 4), r"1 <= k <= 3.*\(3, 3\).*k=4"),
        ((np.eye(3), 1.5), r"integer"),
        ((np.array([[1.0, np.nan], [0.0, 1.0]]), 1), r"\(2, 2\).*non-finite"),
    ],
)
def test_readout_subspace_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        readout_subspace(*args)


def test_rss_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"V1 \(5, 2\).*V2 \(5, 3\)"):
        rss(np.ones((5, 2)), np.ones((5, 3)))
    with pytest.raises(ValueError, match=r"V1 \(5, 2\).*V2 \(4, 2\)"):
        grassmann_distance(np.eye(5)[:, :2], np.eye(4)[:, :2])
    with pytest.raises(ValueError, match=r"2-D.*\(5,\)"):
        rss(np.ones(5), np.ones((5, 1)))
    with pytest.raises(ValueError, match=r"\(2, 3\).*k <= d"):
        rss(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"linearly dependent.*rank 1 < k=2"):
        rss(np.ones((4, 2)), np.eye(4)[:, :2])
    with pytest.raises(ValueError, match=r"non-finite"):
        rss(np.full((3, 1), np.inf), np.ones((3, 1)))


# ---------------------------------------------------------------- k, energy, profile, resolution


@pytest.mark.parametrize(
    "d,f,k",
    [(64, 0.01, 1), (64, 0.1, 6), (64, 0.5, 32), (10, 0.25, 3), (10, 0.05, 1), (7, 1.0, 7), (3, 0.001, 1)],
)
def test_k_from_fraction(d, f, k):
    assert k_from_fraction(d, f) == k


@pytest.mark.parametrize("d,f", [(0, 0.1), (10, 0.0), (10, 1.5), (10, float("nan")), (10, -0.1), (10.0, 0.1)])
def test_k_from_fraction_rejects(d, f):
    with pytest.raises(ValueError):
        k_from_fraction(d, f)


def test_energy_share_closed_form():
    assert energy_share(np.diag([3.0, 4.0, 0.0]), 1) == pytest.approx(16 / 25)
    assert energy_share(np.diag([3.0, 4.0, 0.0]), 2) == pytest.approx(1.0)


def test_rss_profile_layout_and_values():
    rng = np.random.default_rng(0)
    d, n = 8, 5
    As = [np.eye(d) + 0.3 * rng.standard_normal((d, d)) for _ in range(n)]
    prof = rss_profile(As, [1, 3, 8])
    assert list(prof.columns) == ["layer", "k", "k_fraction", "d", "rss", "grassmann_distance", "energy"]
    assert (prof["d"] == 8).all()
    assert len(prof) == (n - 1) * 3
    assert prof["layer"].tolist() == list(range(n - 1)) * 3
    row = prof[(prof.layer == 2) & (prof.k == 3)].iloc[0]
    V2, V3 = readout_subspace(As[2], 3), readout_subspace(As[3], 3)
    assert row.rss == pytest.approx(rss(V2, V3), rel=1e-12)
    assert row.grassmann_distance == pytest.approx(grassmann_distance(V2, V3), rel=1e-10)
    assert row.energy == pytest.approx(energy_share(As[2], 3), rel=1e-12)
    assert row.k_fraction == pytest.approx(3 / 8)
    full = prof[prof.k == d]
    np.testing.assert_allclose(full.rss, 1.0, atol=1e-12)
    np.testing.assert_allclose(full.energy, 1.0, atol=1e-12)


def test_rss_profile_permuted_diagonals():
    # A_0 reads axes {0,1}, A_1 axes {1,2}, A_2 axes {2,3} (k=2): one shared axis per pair
    As = [np.diag(v) for v in ([4.0, 3, 1, 1], [1.0, 4, 3, 1], [1.0, 1, 4, 3])]
    prof = rss_profile(As, [2])
    np.testing.assert_allclose(prof.rss, [0.5, 0.5], atol=1e-14)
    np.testing.assert_allclose(prof.grassmann_distance, [np.pi / 2, np.pi / 2], rtol=1e-14)
    np.testing.assert_allclose(prof.energy, [25 / 27, 25 / 27], rtol=1e-14)


def test_rss_profile_validation():
    with pytest.raises(ValueError, match="at least 2 translators"):
        rss_profile([np.eye(3)], [1])
    with pytest.raises(ValueError, match=r"translators\[1\] is \(4, 4\)"):
        rss_profile([np.eye(3), np.eye(4)], [1])
    with pytest.raises(ValueError, match="square"):
        rss_profile([np.ones((3, 4)), np.ones((3, 4))], [1])
    with pytest.raises(ValueError, match=r"1 <= k <= 3.*k=4"):
        rss_profile([np.eye(3), np.eye(3)], [1, 4])


def test_resolution_energy_closed_form_diagonal():
    a = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 1.0, 0.5, 0.5])
    # same singular values, different axes: energies are equal for every translator
    perm = [1, 0, 3, 2, 5, 4, 7, 6]
    As = [np.diag(a), np.diag(a[perm]), np.diag(a)]
    fracs = [0.125, 0.25, 0.5, 1.0]
    t = resolution_table(As, fracs)
    assert list(t.columns) == ["k_fraction", "k", "energy", "mean_rss", "visibility", "pareto"]
    assert t.k.tolist() == [1, 2, 4, 8]
    expected = [np.sum(a[:k] ** 2) / np.sum(a**2) for k in (1, 2, 4, 8)]
    np.testing.assert_allclose(t.energy, expected, rtol=1e-14)
    # k=1: axes 0 vs 1 (orthogonal) -> RSS 0; k=2, 4, 8: same axis sets -> RSS 1
    np.testing.assert_allclose(t.mean_rss, [0.0, 1.0, 1.0, 1.0], atol=1e-14)
    np.testing.assert_allclose(t.visibility, 1 - t.mean_rss, atol=0)
    # (energy, visibility): k=1 has the only positive visibility, k=8 the most energy
    assert t.pareto.tolist() == [True, False, False, True]


def test_pareto_on_hand_made_table():
    energy = [0.1, 0.3, 0.3, 0.6, 0.5, 0.9, 0.9, float("nan")]
    visib = [0.9, 0.8, 0.7, 0.5, 0.4, 0.2, 0.2, 1.0]
    # 2 dominated by 1 (same energy, lower vis.); 4 by 3; 5 and 6 tie (both kept); NaN never
    assert pareto_front(energy, visib).tolist() == [True, True, False, True, False, True, True, False]
    assert pareto_front([1.0], [1.0]).tolist() == [True]
    with pytest.raises(ValueError, match="same length"):
        pareto_front([1.0, 2.0], [1.0])


def test_resolution_table_accepts_numpy_stack():
    As = np.stack([np.eye(4), np.diag([2.0, 1, 1, 1])])
    t = resolution_table(As, [0.25, 0.5])
    assert isinstance(t, pd.DataFrame) and len(t) == 2
