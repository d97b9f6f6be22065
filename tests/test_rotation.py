"""The noise-aware complex share and the rotation share against closed forms and planted operators.

Planted operators: an exactly symmetric A plus sampling noise (the null: no rotation, whatever d and
N), and A with planted rotation pairs of known share. Bendixson's theorem (|Im λ(M)| ≤ ‖(M − Mᵀ)/2‖_2)
is the oracle of the bound.
"""

import numpy as np
import pandas as pd
import pytest

from resdyn.numerics.resampling import group_jackknife, mean_error_draws
from resdyn.study_a import rotation, spectral


def symmetric(d: int, rng: np.random.Generator) -> np.ndarray:
    """A symmetric operator with eigenvalues spread over [0.5, 1.5] (near-identity, like a sublayer J)."""
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return (q * rng.uniform(0.5, 1.5, d)) @ q.T


def group_means(a: np.ndarray, n_total: int, n_groups: int, symmetry: float, rng) -> np.ndarray:
    """B group means of N samples J_i = A + Z_i, Z_i i.i.d. N(0, σ²) entries, σ set so that the mean over
    16 samples has symmetry index ≈ ``symmetry`` (‖Z̄ − Z̄ᵀ‖_F ≈ √2 σ_m d)."""
    d = a.shape[0]
    sigma = symmetry * np.linalg.norm(a) / (np.sqrt(2) * d) * np.sqrt(16)
    return a + sigma / np.sqrt(n_total / n_groups) * rng.standard_normal((n_groups, d, d))


def test_rotation_share_closed_forms():
    theta = 0.3
    lam = np.exp(1j * np.array([theta, -theta, theta, -theta]))
    assert rotation.rotation_share(lam) == pytest.approx(np.sin(theta), abs=1e-15)
    assert rotation.rotation_share(np.array([2.0, 0.5, -1.0])) == 0.0
    assert rotation.rotation_share(np.zeros(3)) == 0.0
    # J − I: μ = λ − 1 = ±0.1i for λ = 1 ± 0.1i, a pure rotation of the update
    assert rotation.rotation_share(np.array([1 + 0.1j, 1 - 0.1j]), 1.0) == pytest.approx(1.0)
    assert rotation.rotation_share(np.array([1 + 0.1j, 1 - 0.1j])) == pytest.approx(0.1 / np.sqrt(1.01))


@pytest.mark.parametrize("seed", range(5))
def test_no_eigenvalue_of_symmetric_plus_noise_exceeds_bendixson(seed):
    rng = np.random.default_rng(seed)
    a = symmetric(40, rng)
    e = 0.05 * rng.standard_normal((40, 40))
    lam = np.linalg.eigvals(a + e)
    assert np.max(np.abs(lam.imag)) <= rotation.skew_norm(e) * (1 + 1e-12)
    # and the bound is not vacuous: a pure skew perturbation reaches it
    k = e - e.T
    assert np.max(np.abs(np.linalg.eigvals(k).imag)) == pytest.approx(rotation.skew_norm(k), rel=1e-10)


def test_skew_norm_lanczos_equals_dense():
    rng = np.random.default_rng(3)
    m = rng.standard_normal((300, 300))
    dense = float(np.linalg.norm((m - m.T) / 2, 2))
    assert rotation.DENSE_NORM_MAX_D < 300
    assert rotation.skew_norm(m) == pytest.approx(dense, rel=1e-8)


@pytest.mark.parametrize("ratio", [1.0, 16 / 1000])
def test_error_draws_have_the_means_covariance(ratio):
    """Var(E*_jk) = r σ_X² / m entrywise, checked over draws against the samples' own variance."""
    rng = np.random.default_rng(4)
    m, d, sigma = 16, 6, 0.3
    x = 2.0 + sigma * rng.standard_normal((m, d, d))
    draws = np.stack(list(mean_error_draws(x, ratio, 4000, seed=1)))
    expected = ratio * x.var(axis=0, ddof=1) / m
    assert np.mean(draws.var(axis=0)) == pytest.approx(np.mean(expected), rel=0.05)
    assert np.abs(draws.mean(axis=0)).max() < 4 * np.sqrt(expected.max() / 4000)


NULL_GRID = [
    pytest.param(d, n, marks=[pytest.mark.slow] if d == 1024 else []) for d in (64, 256, 1024) for n in (16, 128, 1000)
]


@pytest.mark.parametrize("d,n_total", NULL_GRID)
def test_symmetric_plus_noise_has_no_rotation_beyond_noise(d, n_total):
    """The null: the old tolerance rule counts noise-split pairs (growing with d), the bound counts none."""
    rng = np.random.default_rng(d + n_total)
    a = symmetric(d, rng)
    groups = group_means(a, n_total, 16 if n_total < 1000 else 20, 0.1, rng)
    lam = np.linalg.eigvals(groups.mean(axis=0))
    tau = rotation.imag_noise_bound(groups)
    assert rotation.complex_fraction_beyond_noise(lam, tau) == 0.0
    assert spectral.complex_fraction(lam, 1e-6) > 0.05
    assert rotation.rotation_share(lam) < 0.01


@pytest.mark.parametrize("n_total", [128, 1000])
def test_first_n_per_sample_bound_matches_the_group_bound(n_total):
    """The bound from the first 16 of N samples (scaled by 16/N) estimates the same noise as the groups'."""
    rng = np.random.default_rng(n_total)
    d = 64
    a = symmetric(d, rng)
    sigma = 0.05
    per_sample = a + sigma * rng.standard_normal((16, d, d))
    groups = a + sigma / np.sqrt(n_total / 16) * rng.standard_normal((16, d, d))
    from_samples = rotation.imag_noise_bound(per_sample, n_total=n_total)
    from_groups = rotation.imag_noise_bound(groups)
    assert from_samples == pytest.approx(from_groups, rel=0.25)
    # the noise of a mean of N is the per-sample noise over √N: the bound scales with it
    assert from_samples == pytest.approx(rotation.imag_noise_bound(per_sample) * np.sqrt(16 / n_total), rel=1e-12)


def planted_rotation(d: int, pairs: int, rng) -> np.ndarray:
    """Symmetric in the first d − 2·pairs coordinates, rotation blocks 1 ± 0.4i in the last ones, in a random basis."""
    a = np.diag(rng.uniform(0.5, 1.5, d))
    for p in range(pairs):
        i = d - 2 * (p + 1)
        a[i : i + 2, i : i + 2] = [[1.0, 0.4], [-0.4, 1.0]]
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return q @ a @ q.T


@pytest.mark.parametrize("pairs", [4, 16])
def test_planted_rotation_share_is_recovered_within_its_interval(pairs):
    rng = np.random.default_rng(pairs)
    d, n_total, n_groups = 64, 1000, 20
    a = planted_rotation(d, pairs, rng)
    groups = group_means(a, n_total, n_groups, 0.1, rng)
    tau = rotation.imag_noise_bound(groups)

    def share(m):
        return rotation.complex_fraction_beyond_noise(np.linalg.eigvals(m), tau)

    result = group_jackknife(share, groups)
    truth = 2 * pairs / d
    assert result.estimate == pytest.approx(truth)
    assert result.low <= truth <= result.high


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="at least 2 groups"):
        rotation.imag_noise_bound(np.zeros((1, 3, 3)))
    with pytest.raises(ValueError, match="n_total = 4 is smaller than the 16"):
        rotation.imag_noise_bound(np.zeros((16, 3, 3)), n_total=4)
    with pytest.raises(ValueError, match="NaN or Inf"):
        rotation.imag_noise_bound(np.full((3, 2, 2), np.nan))
    with pytest.raises(ValueError, match="bound must be a finite number"):
        rotation.complex_fraction_beyond_noise(np.array([1j]), -1.0)


def test_spectra_and_checkpoint_tables_carry_the_noise_columns():
    rng = np.random.default_rng(7)
    d = 8
    per = {(0, "attn"): np.eye(d) + 0.01 * rng.standard_normal((4, d, d)), (0, "mlp"): planted_rotation(d, 2, rng)}
    per[(0, "mlp")] = per[(0, "mlp")] + 0.001 * rng.standard_normal((4, d, d))
    means = {k: v.mean(axis=0) for k, v in per.items()}
    noise = spectral.NoiseSamples(per, n_total=4)
    table, _ = spectral.spectra_table(means, noise=noise)
    assert table.loc[1, "complex_frac_beyond_noise"] == pytest.approx(4 / d)
    assert table.loc[0, "complex_frac_beyond_noise"] == 0.0
    lam = np.linalg.eigvals(means[(0, "mlp")])
    assert table.loc[1, "rotation_share_J"] == pytest.approx(rotation.rotation_share(lam))
    plain, _ = spectral.spectra_table(means)
    assert "complex_frac_beyond_noise" not in plain
    ckpt = spectral.checkpoint_table({"a": table, "b": table})
    assert list(ckpt["complex_frac_beyond_noise"]) == list(table["complex_frac_beyond_noise"]) * 2
    assert isinstance(ckpt, pd.DataFrame) and "rotation_share_JmI" in ckpt
