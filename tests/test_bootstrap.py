"""resdyn.beyond.bootstrap: percentile intervals (calibration, constants, determinism) and the Jacobian bootstrap."""

from __future__ import annotations

import h5py
import numpy as np
import pandas as pd
import pytest
import torch
import transformers as tf

from resdyn import artifacts
from resdyn.beyond import bootstrap as bs
from resdyn.study_a import jacobian, spectral

# ---------------------------------------------------------------- generic utilities


def test_percentile_ci_matches_numpy_quantiles():
    x = np.random.default_rng(0).standard_normal(1000)
    low, high = bs.percentile_ci(x, 0.9)
    assert (low, high) == (np.quantile(x, 0.05), np.quantile(x, 0.95))
    lo2, hi2 = bs.percentile_ci(np.column_stack([x, 2 * x]), 0.9)
    np.testing.assert_array_equal(lo2, [low, np.quantile(2 * x, 0.05)])
    np.testing.assert_array_equal(hi2, [high, np.quantile(2 * x, 0.95)])


def test_percentile_ci_of_constant_has_zero_width_and_nan_propagates():
    assert bs.percentile_ci(np.full(200, 2.5), 0.95) == (2.5, 2.5)
    low, high = bs.percentile_ci(np.array([1.0, np.nan, 3.0]))
    assert np.isnan(low) and np.isnan(high)


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, "x", float("nan")])
def test_percentile_ci_rejects_bad_levels(bad):
    with pytest.raises(ValueError, match="level"):
        bs.percentile_ci(np.arange(3.0), bad)


def test_bootstrap_ci_of_constant_statistic_has_zero_width():
    x = np.random.default_rng(1).standard_normal(20)
    r = bs.bootstrap_ci(lambda i: 4.0 + 0 * x[i].sum(), 20, n_resamples=100, seed=3)
    assert r["estimate"] == r["ci_low"] == r["ci_high"] == 4.0
    # a statistic of constant data, too
    c = np.full(15, 7.0)
    r = bs.bootstrap_ci(lambda i: c[i].mean(), 15, n_resamples=100)
    assert r["ci_low"] == r["ci_high"] == 7.0


def test_bootstrap_is_deterministic_given_the_seed():
    x = np.random.default_rng(2).standard_normal(30)
    a = bs.bootstrap(lambda i: x[i].mean(), 30, 50, seed=11)
    b = bs.bootstrap(lambda i: x[i].mean(), 30, 50, seed=11)
    c = bs.bootstrap(lambda i: x[i].mean(), 30, 50, seed=12)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    # indices depend on (n, R, seed) only
    assert np.array_equal(bs.bootstrap_indices(30, 50, 11), bs.bootstrap_indices(30, 50, 11))


def test_bootstrap_replicates_are_resamples_with_replacement():
    idx = bs.bootstrap_indices(5, 2000, seed=0)
    assert idx.shape == (2000, 5) and idx.min() == 0 and idx.max() == 4
    # each draw is uniform on 0..4: every index appears ≈ 1/5 of the time
    freq = np.bincount(idx.ravel(), minlength=5) / idx.size
    np.testing.assert_allclose(freq, 0.2, atol=0.01)


def test_percentile_ci_of_the_mean_covers_at_nominal_rate():
    """Calibration: 95 % percentile intervals of the mean of 50 N(0, 1) draws, 200 datasets.

    The percentile interval of the mean is ≈ x̄ ± 1.96·s/√n·√((n−1)/n): coverage ≈ 0.945 for
    n = 50. With 200 datasets the binomial sd of the coverage is ≈ 0.016, so [0.89, 0.99]
    is ±3 sd around nominal."""
    rng = np.random.default_rng(123)
    n, reps = 50, 200
    covered = 0
    for rep in range(reps):
        x = rng.standard_normal(n)
        idx = bs.bootstrap_indices(n, 1000, seed=rep)
        low, high = bs.percentile_ci(x[idx].mean(axis=1), 0.95)
        covered += low <= 0.0 <= high
    assert 0.89 <= covered / reps <= 0.99


def test_early_late_thirds():
    early, late = bs.early_late(9)
    assert early.tolist() == [0, 1, 2] and late.tolist() == [6, 7, 8]
    with pytest.raises(ValueError, match="n_sublayers"):
        bs.early_late(1)


# ---------------------------------------------------------------- the Jacobian bootstrap


def _rotation(theta: float) -> np.ndarray:
    return np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])


def _blockdiag(*blocks: np.ndarray) -> np.ndarray:
    d = sum(b.shape[0] for b in blocks)
    out = np.zeros((d, d))
    i = 0
    for b in blocks:
        out[i : i + b.shape[0], i : i + b.shape[0]] = b
        i += b.shape[0]
    return out


def test_identical_samples_give_zero_width_intervals_and_known_values():
    """Every sample has the same Jacobians → each replicate equals the estimate."""
    rng = np.random.default_rng(0)
    d, n = 4, 5
    mats = {
        (0, "attn"): _blockdiag(0.9 * _rotation(0.5), 0.8 * _rotation(1.0)),  # all complex
        (0, "mlp"): np.array([[1.0, 0.5, 0, 0], [0, 1.0, 0, 0], [0, 0, 0.7, 0], [0, 0, 0, 0.2]]),  # real, non-normal
        (1, "attn"): np.diag([1.0, 0.9, 0.5, 0.1]),
        (1, "mlp"): np.eye(d) + 0.1 * rng.standard_normal((d, d)),
    }
    per = {key: np.repeat(J[None], n, axis=0) for key, J in mats.items()}
    table, reps = bs.jacobian_bootstrap(per, n_resamples=50, seed=1, means=mats)
    assert list(table.columns) == bs.BOOTSTRAP_COLUMNS
    boot = table[table["bootstrapped"]]
    np.testing.assert_allclose(boot["ci_low"], boot["estimate"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(boot["ci_high"], boot["estimate"], rtol=1e-12, atol=1e-12)
    by = table.set_index(["metric", "layer", "kind"])
    for (layer, kind), J in mats.items():
        assert by.loc[("henrici", layer, kind), "estimate"] == pytest.approx(spectral.henrici_departure(J), abs=1e-12)
        cf = spectral.complex_fraction(np.linalg.eigvals(J), 1e-6)
        assert by.loc[("complex_fraction", layer, kind), "estimate"] == cf
    assert by.loc[("complex_fraction", 0, "attn"), "estimate"] == 1.0
    assert by.loc[("complex_fraction", 1, "attn"), "estimate"] == 0.0
    order = [mats[k] for k in sorted(mats, key=lambda k: spectral.sublayer_index(*k))]
    erank = spectral.cumulative_effective_rank(order)[-1]
    assert by.loc[("cum_erank_full_depth", 1, "mlp"), "estimate"] == pytest.approx(erank, rel=1e-10)
    # S = 4: early = s 0, late = s 3
    cf_mlp1 = spectral.complex_fraction(np.linalg.eigvals(mats[(1, "mlp")]), 1e-6)
    row = table[table["metric"] == "complex_fraction_early_minus_late"].iloc[0]
    assert row["estimate"] == pytest.approx(1.0 - cf_mlp1) and row["kind"] == "all"
    without_bounds = set(bs.SCALAR_METRICS) - {"complex_fraction_beyond_noise_early_minus_late"}
    assert set(reps["metric"]) == without_bounds and len(reps) == 4 * 50
    assert (boot["n_bootstrap_samples"] == n).all() and (boot["n_samples_total"] == n).all()
    cum = spectral.cumulative_effective_rank(order)
    for s, key in enumerate(sorted(mats, key=lambda k: spectral.sublayer_index(*k))):
        sym = spectral.symmetry_index(mats[key], shift=1.0)
        assert by.loc[("symmetry_minus_identity", *key), "estimate"] == pytest.approx(sym, rel=1e-12)
        assert by.loc[("cum_erank", *key), "estimate"] == pytest.approx(cum[s], rel=1e-10)
    assert "complex_fraction_beyond_noise" not in set(table["metric"])
    # with a noise bound per sublayer: #{|Im λ| > τ}/d of each sublayer, τ = 0.05 (the 0.5-rotation of (0, attn) stays)
    table, reps = bs.jacobian_bootstrap(per, n_resamples=5, seed=1, means=mats, noise_bounds=[0.05] * 4)
    by = table.set_index(["metric", "layer", "kind"])
    for key, J in mats.items():
        expected = float(np.mean(np.abs(np.linalg.eigvals(J).imag) > 0.05))
        assert by.loc[("complex_fraction_beyond_noise", *key), "estimate"] == expected
    assert set(reps["metric"]) == set(bs.SCALAR_METRICS)


def test_two_samples_replicates_are_the_three_possible_means():
    """With n = 2 a resample is (J1, J1), (J2, J2) or (J1, J2): the replicate mean is J1, J2 or
    their average, for all sublayers at once, with probabilities 1/4, 1/4, 1/2."""
    rng = np.random.default_rng(5)
    d = 5
    keys = [(0, "attn"), (0, "mlp"), (1, "attn"), (1, "mlp")]
    J1 = {k: np.eye(d) + 0.4 * rng.standard_normal((d, d)) for k in keys}
    J2 = {k: np.eye(d) + 0.4 * rng.standard_normal((d, d)) for k in keys}
    per = {k: np.stack([J1[k], J2[k]]) for k in keys}
    R, seed = 400, 9
    table, reps = bs.jacobian_bootstrap(per, n_resamples=R, seed=seed)

    def erank(which):
        return spectral.cumulative_effective_rank([which[k] for k in keys])[-1]

    avg = {k: 0.5 * (J1[k] + J2[k]) for k in keys}
    expected = {"J1": erank(J1), "J2": erank(J2), "avg": erank(avg)}
    vals = reps[reps["metric"] == "cum_erank_full_depth"].sort_values("replicate")["value"].to_numpy()
    idx = bs.bootstrap_indices(2, R, seed)
    kind = np.where(idx[:, 0] != idx[:, 1], "avg", np.where(idx[:, 0] == 0, "J1", "J2"))
    np.testing.assert_allclose(vals, [expected[k] for k in kind], rtol=1e-10)
    est = table[table["metric"] == "cum_erank_full_depth"]["estimate"].iloc[0]
    assert est == pytest.approx(expected["avg"], rel=1e-10)  # the plug-in: mean of the 2 samples
    low, high = bs.percentile_ci(vals, 0.95)
    assert min(expected.values()) - 1e-9 <= low <= high <= max(expected.values()) + 1e-9


def test_chunked_passes_give_the_same_table():
    rng = np.random.default_rng(7)
    per = {(0, "attn"): rng.standard_normal((3, 4, 4)), (0, "mlp"): rng.standard_normal((3, 4, 4))}
    a, ra = bs.jacobian_bootstrap(per, n_resamples=30, seed=2)
    b, rb = bs.jacobian_bootstrap(per, n_resamples=30, seed=2, memory_budget=1)  # one replicate per pass
    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(ra, rb)


def test_validation_messages():
    with pytest.raises(ValueError, match="at least 2 stored samples"):
        bs.jacobian_bootstrap({(0, "attn"): np.ones((1, 3, 3)), (0, "mlp"): np.ones((1, 3, 3))})
    with pytest.raises(ValueError, match="without gaps"):
        bs.jacobian_bootstrap({(0, "attn"): np.ones((2, 3, 3)), (1, "attn"): np.ones((2, 3, 3))})
    with pytest.raises(ValueError, match="n_resamples"):
        bs.jacobian_bootstrap({(0, "attn"): np.ones((2, 3, 3))}, n_resamples=0)


# ---------------------------------------------------------------- from the Jacobian files


def _tiny_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        initializer_range=0.2,
    )
    cfg._attn_implementation = "eager"
    return tf.LlamaForCausalLM(cfg).eval()


def test_bootstrap_from_jacobian_files(tmp_path):
    """Files written by resdyn.study_a.jacobian (4 samples, 2 positions, first 3 kept whole)."""
    model = _tiny_llama()
    samples = np.random.default_rng(0).integers(3, 50, size=(4, 8))
    folder = tmp_path / "layers000-001"
    folder.mkdir()
    jacobian.write_layer_block(
        model,
        samples,
        np.arange(4) * 10,
        [0, 1],
        {L: folder / f"layer{L:03d}.h5" for L in (0, 1)},
        positions=[-1, -2],
        store_first_n=3,
        progress=False,
    )
    table, reps = bs.jacobian_bootstrap_files([folder], n_resamples=40, seed=0, level=0.9)
    boot = table[table["bootstrapped"]]
    assert (boot["n_bootstrap_samples"] == 3).all() and (boot["n_samples_total"] == 4).all()
    assert boot["note"].str.contains("first 3 of 4 samples").all()
    assert (boot["ci_low"] <= boot["ci_high"]).all() and (boot["level"] == 0.9).all()
    # estimate_all_samples = the metric of the stored all-N mean (what spectra.tsv reports)
    means, _ = artifacts.JacobianBlocks.read_means([folder])
    by = table.set_index(["metric", "layer", "kind"])
    for (layer, kind), load in means.items():
        assert by.loc[("henrici", layer, kind), "estimate_all_samples"] == pytest.approx(
            spectral.henrici_departure(load()), rel=1e-12
        )
    # estimate = the metric of the mean of the 3 stored samples (each averaged over its 2 positions)
    with h5py.File(folder / "layer001.h5") as f:
        stored = f["mlp"]["per_sample"][()].astype(np.float64)
    assert stored.shape == (3, 2, 16, 16)
    assert by.loc[("henrici", 1, "mlp"), "estimate"] == pytest.approx(
        spectral.henrici_departure(stored.mean(axis=(0, 1))), rel=1e-12
    )
    # Study B rows are present and say they were not bootstrapped
    rest = table[~table["bootstrapped"]]
    assert set(rest["metric"]) == {"rss_profile", "b1", "b2"}
    assert rest["ci_low"].isna().all() and rest["note"].str.startswith("not bootstrapped").all()


def test_missing_per_sample_names_the_config_key(tmp_path):
    folder = tmp_path / "layers000-000"
    folder.mkdir()
    with h5py.File(folder / "layer000.h5", "w") as f:
        f.attrs["layer"] = 0
        for kind in ("attn", "mlp"):
            g = f.create_group(kind)
            g.create_dataset("mean", data=np.eye(3))
            g.create_dataset("count", data=np.int64(4))
            g.create_dataset("sample_ids", data=np.arange(4))
    with pytest.raises(ValueError, match="store_first_n"):
        artifacts.JacobianBlocks.read_per_sample([folder])


# ---------------------------------------------------------------- method "perturbative" (oracle: method "exact")


def _weights(n: int, R: int, seed: int) -> np.ndarray:
    return np.stack([np.bincount(r, minlength=n) for r in bs.bootstrap_indices(n, R, seed)]) / n


def _sort_eig(z: np.ndarray) -> np.ndarray:
    """Row-wise sort by (real part to 1e-9, imaginary part): stable for conjugate pairs."""
    z = np.atleast_2d(z)
    return np.stack([row[np.lexsort((row.imag, np.round(row.real, 9)))] for row in z])


def _chain(mats: np.ndarray) -> dict:
    """Two sublayers (0, attn), (0, mlp) with the same per-sample matrices."""
    return {(0, "attn"): mats, (0, "mlp"): mats.copy()}


def test_perturbative_identical_samples_give_zero_width_intervals():
    rng = np.random.default_rng(0)
    J = np.eye(6) + 0.3 * rng.standard_normal((6, 6))
    table, _ = bs.jacobian_bootstrap(
        _chain(np.repeat(J[None], 5, axis=0)), n_resamples=40, seed=1, method="perturbative"
    )
    rows = table[table["metric"].isin(["henrici", "complex_fraction"])]
    assert (rows["method"] == "perturbative").all()
    cf = rows[rows["metric"] == "complex_fraction"]
    assert (cf["ci_low"] == cf["estimate"]).all() and (cf["ci_high"] == cf["estimate"]).all()
    he = rows[rows["metric"] == "henrici"]
    # F_r = 0 exactly; Henrici from the Gram form equals the Schur-based estimate to rounding
    np.testing.assert_allclose(he["ci_low"], he["estimate"], rtol=0, atol=1e-13)
    np.testing.assert_allclose(he["ci_high"], he["estimate"], rtol=0, atol=1e-13)


def test_perturbative_commuting_samples_are_exact_at_first_order():
    """J_i = S B_i S⁻¹ with B_i block-diagonal a_k I + b_k [[0, −1], [1, 0]] (a fixed non-normal S):
    the samples commute, so a replicate's eigenvalues are Σ_i w_ri (a_ik ± i b_ik) in closed form."""
    rng = np.random.default_rng(1)
    n, k = 8, 4
    S = np.eye(2 * k) + 0.5 * np.triu(rng.standard_normal((2 * k, 2 * k)), 1)
    a = rng.uniform(-1, 1, size=(n, k)) + np.arange(k)[None]
    b = rng.uniform(0.2, 0.6, size=(n, k))
    X = np.stack(
        [
            S
            @ _blockdiag(*[ai * np.eye(2) + bi * np.array([[0, -1.0], [1, 0]]) for ai, bi in zip(a[i], b[i])])
            @ np.linalg.inv(S)
            for i in range(n)
        ]
    )
    W = _weights(n, 60, seed=2)
    res = bs.perturbative_spectra(X, W)
    assert res["reason"] == "" and res["cluster_sizes"] == []
    truth = np.concatenate([W @ a + 1j * (W @ b), W @ a - 1j * (W @ b)], axis=1)
    np.testing.assert_allclose(_sort_eig(res["eigvals"]), _sort_eig(truth), atol=1e-11)
    exact = [spectral.henrici_departure(np.einsum("n,nij->ij", w, X)) for w in W]
    np.testing.assert_allclose(res["henrici"], exact, atol=1e-11)


def test_perturbative_lets_a_real_pair_become_complex():
    """J_i = [[0, 1], [c_i, 0]]: a replicate's eigenvalues are ±sqrt(c*) with c* = Σ w_i c_i, a real
    pair when c* > 0 and a complex pair when c* < 0. First-order theory keeps the pair real; the
    2×2 cluster gets it right, replicate by replicate."""
    c = np.array([-1.0, -0.5, 0.2, 0.5, 0.8, 1.0, -0.8, 0.6])
    rest = np.diag([2.0, 3.0, -2.0, 4.0, -3.0, 5.0])  # fixed, far from the pair (d = 8)
    X = np.stack([_blockdiag(np.array([[0.0, 1.0], [ci, 0.0]]), rest) for ci in c])
    W = _weights(len(c), 200, seed=3)
    res = bs.perturbative_spectra(X, W)
    assert res["cluster_sizes"] == [2]
    cstar = W @ c
    pair = np.where(
        cstar[:, None] >= 0, np.sqrt(np.abs(cstar))[:, None] * [1, -1], 1j * np.sqrt(np.abs(cstar))[:, None] * [1, -1]
    )
    truth = np.hstack([pair, np.tile(np.diag(rest), (len(W), 1))])
    # at c* = 0 (to rounding) the pair sits on the exceptional point, where any rounding ε moves
    # it by sqrt(ε); those replicates are compared by their (real) classification below
    away = np.abs(cstar) > 1e-12
    assert away.sum() >= 190
    np.testing.assert_allclose(_sort_eig(res["eigvals"][away]), _sort_eig(truth[away]), atol=1e-12)
    np.testing.assert_allclose(res["eigvals"][~away], truth[~away], atol=1e-7)
    per = _chain(X)
    pert, _ = bs.jacobian_bootstrap(per, n_resamples=200, seed=3, method="perturbative")
    exact, _ = bs.jacobian_bootstrap(per, n_resamples=200, seed=3, method="exact")
    cf = pert[pert["metric"] == "complex_fraction"]
    assert (cf["method"] == "perturbative").all()
    assert (cf["ci_low"] == 0.0).all() and (cf["ci_high"] == 0.25).all()  # not falsely zero-width
    np.testing.assert_array_equal(
        cf[["ci_low", "ci_high"]], exact[exact["metric"] == "complex_fraction"][["ci_low", "ci_high"]]
    )
    np.testing.assert_allclose(
        pert[["ci_low", "ci_high"]].to_numpy(float), exact[["ci_low", "ci_high"]].to_numpy(float), atol=1e-12
    )


def test_perturbative_agrees_with_exact_on_random_non_normal_matrices():
    """d = 64, n = 12 non-normal samples spread 5 % around their mean: every interval endpoint
    within 10 % of the exact interval's width (Henrici) and the same complex counts."""
    rng = np.random.default_rng(4)
    d, n = 64, 12
    M = rng.standard_normal((d, d)) / np.sqrt(d) + 0.5 * np.triu(rng.standard_normal((d, d)), 1) / np.sqrt(d)
    X = M[None] + 0.05 * rng.standard_normal((n, d, d)) / np.sqrt(d)
    per = _chain(X)
    pert, _ = bs.jacobian_bootstrap(per, n_resamples=50, seed=5, method="perturbative")
    exact, _ = bs.jacobian_bootstrap(per, n_resamples=50, seed=5, method="exact")
    assert (pert["method"].iloc[:4] == "perturbative").all()
    for metric in ("henrici", "complex_fraction"):
        p, e = pert[pert["metric"] == metric], exact[exact["metric"] == metric]
        width = (e["ci_high"] - e["ci_low"]).to_numpy()
        assert (width > 0).all()
        assert (np.abs(p["ci_low"].to_numpy() - e["ci_low"].to_numpy()) <= 0.1 * width).all()
        assert (np.abs(p["ci_high"].to_numpy() - e["ci_high"].to_numpy()) <= 0.1 * width).all()
    np.testing.assert_array_equal(pert["estimate"], exact["estimate"])  # estimates are exact in both


def test_perturbative_falls_back_where_perturbation_is_not_small():
    """Samples that differ as much as their mean (the regime of transformer Jacobians): one
    cluster spans the spectrum, the sublayer is decomposed exactly and the table says why."""
    rng = np.random.default_rng(6)
    X = rng.standard_normal((8, 24, 24))
    pert, _ = bs.jacobian_bootstrap(_chain(X), n_resamples=30, seed=0, method="perturbative")
    exact, _ = bs.jacobian_bootstrap(_chain(X), n_resamples=30, seed=0, method="exact")
    rows = pert[pert["metric"].isin(["henrici", "complex_fraction"])]
    assert (rows["method"] == "exact-fallback").all() and rows["note"].str.contains("clusters").all()
    pd.testing.assert_frame_equal(pert.drop(columns=["method", "note"]), exact.drop(columns=["method", "note"]))
    assert "2 of 2 sublayers exact-fallback" in pert["method"].iloc[-1]


def test_perturbative_ill_conditioned_eigenvectors_fall_back():
    """A mean close to a Jordan block: eigenvector condition far above COND_MAX."""
    J = np.array([[1.0, 1.0], [1e-20, 1.0]])
    X = np.stack([J + 1e-3 * np.array([[0, 0], [0, s]]) for s in (1.0, -1.0, 0.5, -0.5)])
    h, cf, why = bs.perturbative_rows(X - X.mean(0) + J, _weights(4, 10, 0), 1e-6, 0.95)
    assert h is None and "ill-conditioned" in why


def test_perturbative_coverage_matches_exact():
    """Known-answer simulation: J_i = M + noise_i (d = 8, n = 16), truth = the statistics of M.
    Over 120 datasets the 90 % intervals of both methods cover the Henrici departure of M at
    rates that agree within Monte-Carlo error (they may disagree on at most a few datasets).
    Measured: 92/120 for both, 0 datasets differ; that both sit below 0.9 is the percentile
    interval's (n = 16, a nonlinear statistic), not the perturbative method's."""
    rng = np.random.default_rng(7)
    d, n, reps = 8, 16, 120
    M = np.diag([2.0, 1.4, 0.8, 0.3, -0.2, -0.7, -1.3, -2.0]) + 0.4 * np.triu(rng.standard_normal((d, d)), 1)
    truth = spectral.henrici_departure(M)
    W = _weights(n, 200, seed=8)
    cover = {"exact": 0, "perturbative": 0}
    differ = 0
    for _ in range(reps):
        X = M[None] + 0.02 * rng.standard_normal((n, d, d))
        h_p, _, why = bs.perturbative_rows(X, W, 1e-6, 0.9)
        assert h_p is not None, why
        h_e = np.array([spectral.henrici_departure(np.einsum("n,nij->ij", w, X)) for w in W])
        ok = {}
        for name, h in (("perturbative", h_p), ("exact", h_e)):
            low, high = bs.percentile_ci(h, 0.9)
            ok[name] = low <= truth <= high
            cover[name] += ok[name]
        differ += ok["exact"] != ok["perturbative"]
    # paired on the same data: ≤ 3 of 120 datasets differ (binomial sd of a rate: ≈ 0.04)
    assert differ <= 3, (cover, differ)
    assert abs(cover["exact"] - cover["perturbative"]) / reps <= 0.025


def test_perturbative_device_path_agrees_on_cpu_torch(monkeypatch):
    """The CUDA code path (resampled means and running products as torch tensors, eigen-analyses
    via torch) run on the CPU's torch gives the host path's table."""
    from resdyn.numerics import linalg

    rng = np.random.default_rng(9)
    d, n = 16, 8
    M = np.diag(np.linspace(-2, 2, d)) + 0.3 * np.triu(rng.standard_normal((d, d)), 1)
    per = _chain(M[None] + 0.01 * rng.standard_normal((n, d, d)))
    host, host_reps = bs.jacobian_bootstrap(per, n_resamples=30, seed=2, method="perturbative")
    calls: list = []
    monkeypatch.setattr(linalg, "on_cuda", lambda device: calls.append(device) or device is not None)
    dev, dev_reps = bs.jacobian_bootstrap(per, n_resamples=30, seed=2, method="perturbative", device="cpu")
    assert calls and (host["method"].iloc[:4] == "perturbative").all()
    num = ["estimate", "ci_low", "ci_high", "estimate_all_samples"]
    np.testing.assert_allclose(dev[num].to_numpy(float), host[num].to_numpy(float), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(dev_reps["value"], host_reps["value"], rtol=1e-9, atol=1e-9)


def test_cost_of_the_perturbative_method():
    """cost_bootstrap: (2 + 2 + 2.5 + R/32) eigvals-equivalents per sublayer instead of R."""
    from resdyn.cluster import cost

    s = cost.Shape(n_layers=4, d=4096, n_heads=32, n_kv_heads=8, d_ff=14336, vocab=128256)
    cfg = {  # the methods' own cost: the full-depth rank only, as without per-depth intervals
        "jacobian": {"store_first_n": 16},
        "bootstrap": {"n_resamples": 50, "method": "exact", "per_depth_erank": False},
    }
    exact = cost.cost_bootstrap(cfg, s, gpu=True)
    cfg["bootstrap"]["method"] = "perturbative"
    pert = cost.cost_bootstrap(cfg, s, gpu=True)
    R, S = 52, 8
    one = cost.decomposition_flops("eig", 4096)
    assert exact.work["eig"] == pytest.approx(R * S * one)
    assert pert.work["eig"] == pytest.approx((4 + 2.5 + R / 32) * S * one)
    assert cost.seconds(pert, "h100") < 0.25 * cost.seconds(exact, "h100")


# ---------------------------------------------------------------- interval "studentized" (few resamples)


def test_studentized_ci_matches_scipy_t_interval():
    from scipy import stats

    v = np.random.default_rng(0).standard_normal(6)
    lo, hi = bs.studentized_ci(v, 0.3, 0.9)
    ref = stats.t.interval(0.9, df=5, loc=0.3, scale=np.std(v, ddof=1))
    assert (lo, hi) == pytest.approx(ref, rel=1e-12)
    assert bs.studentized_ci(np.full(6, 2.0), 2.0) == (2.0, 2.0)
    assert np.isnan(bs.studentized_ci([1.0, np.nan, 2.0], 1.0)[0])
    with pytest.raises(ValueError, match="≥ 2 replicates"):
        bs.studentized_ci([1.0], 1.0)
    with pytest.raises(ValueError, match="bootstrap.interval"):
        bs.replicate_ci([1.0, 2.0], 1.5, 0.9, "bca")


def test_studentized_interval_is_clipped_to_the_statistics_range():
    """A complex fraction near 0: the symmetric t-interval would reach below 0; the table's row
    is clipped to [0, 1] (and only the out-of-range side moves)."""
    v = np.array([0.0, 0.0, 0.1, 0.0, 0.0, 0.05])
    raw = bs.studentized_ci(v, 0.02, 0.95)
    assert raw[0] < 0 < raw[1] < 1
    assert bs.replicate_ci(v, 0.02, 0.95, "studentized", (0.0, 1.0)) == (0.0, raw[1])
    assert bs.replicate_ci(1 - v, 0.98, 0.95, "studentized", (0.0, 1.0)) == pytest.approx((1 - raw[1], 1.0))
    assert np.isnan(bs.replicate_ci([np.nan, 1.0], 0.5, 0.95, "studentized", (0.0, 1.0))[0])
    # in the table: 2x2 samples whose complex fraction is 0 except in a few resamples
    X = np.array([[[0.0, 1.0], [c, 0.0]] for c in (1.0, 1.0, 1.0, 1.0, 1.0, -3.5)])
    table, _ = bs.jacobian_bootstrap(_chain(X), n_resamples=6, seed=2, interval="studentized")
    rows = table[table["bootstrapped"]]
    reps = [spectral.complex_fraction(np.linalg.eigvals(np.einsum("n,nij->ij", w, X)), 1e-6) for w in _weights(6, 6, 2)]
    raw = bs.studentized_ci(reps, 0.0, 0.95)
    assert raw[0] < 0 and raw[1] > 1  # unclipped, the interval leaves [0, 1] on both sides
    cf = rows[rows["metric"] == "complex_fraction"]
    assert (cf["estimate"] == 0).all() and (cf["ci_low"] == 0).all() and (cf["ci_high"] == 1).all()
    h = rows[rows["metric"] == "henrici"]
    assert (h["ci_low"] >= 0).all() and (h["ci_high"] <= 1).all()
    assert bs.METRIC_RANGE["cum_erank_full_depth"](7) == (1.0, 7.0)
    beyond_noise = {"complex_fraction_beyond_noise", "complex_fraction_beyond_noise_early_minus_late"}
    assert set(bs.METRIC_RANGE) - beyond_noise == set(rows["metric"])  # those need noise bounds


def test_studentized_with_6_resamples_covers_at_nominal_rate():
    """Calibration of the cheap scheme: 95 % studentized intervals from R = 6 replicates of the
    mean of 50 N(0, 1) draws, 400 datasets. A normal statistic with the bootstrap's standard
    error has coverage exactly 0.95 (t with R − 1 df); measured 0.955, the percentile interval
    from R = 50 gives 0.93 on the same data. Binomial sd at 400 datasets: 0.011, so
    [0.92, 0.98] is ±3 sd."""
    rng = np.random.default_rng(123)
    n, reps = 50, 400
    covered = 0
    for rep in range(reps):
        x = rng.standard_normal(n)
        idx = bs.bootstrap_indices(n, 6, seed=rep)
        low, high = bs.studentized_ci(x[idx].mean(axis=1), x.mean(), 0.95)
        covered += low <= 0.0 <= high
    assert 0.92 <= covered / reps <= 0.98


def test_studentized_jacobian_bootstrap_rows_and_henrici_coverage():
    """The table's rows use the chosen interval; on the known-answer Henrici simulation (d = 8,
    n = 16, 120 datasets) R = 6 studentized intervals cover at least as often as R = 50
    percentile ones (112/120 vs 97/120 with this seed: the percentile interval is narrow there)."""
    rng = np.random.default_rng(7)
    d, n, reps = 8, 16, 120
    M = np.diag([2.0, 1.4, 0.8, 0.3, -0.2, -0.7, -1.3, -2.0]) + 0.4 * np.triu(rng.standard_normal((d, d)), 1)
    truth = spectral.henrici_departure(M)
    X = M[None] + 0.05 * rng.standard_normal((n, d, d))
    table, _ = bs.jacobian_bootstrap(_chain(X), n_resamples=6, seed=0, interval="studentized")
    row = table[(table["metric"] == "henrici")].iloc[0]
    reps6 = [spectral.henrici_departure(np.einsum("n,nij->ij", w, X)) for w in _weights(n, 6, 0)]
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(bs.studentized_ci(reps6, row["estimate"], 0.95), rel=1e-12)
    assert (table.loc[table["bootstrapped"], "interval"] == "studentized").all()
    cover = {"t6": 0, "pct50": 0}
    for rep in range(reps):
        X = M[None] + 0.05 * rng.standard_normal((n, d, d))
        est = spectral.henrici_departure(X.mean(0))
        for name, R, kind in (("t6", 6, "studentized"), ("pct50", 50, "percentile")):
            v = [spectral.henrici_departure(np.einsum("n,nij->ij", w, X)) for w in _weights(n, R, rep)]
            low, high = bs.replicate_ci(v, est, 0.95, kind)
            cover[name] += low <= truth <= high
    assert cover["t6"] >= cover["pct50"] - 4, cover  # 4 datasets ≈ 1 binomial sd of the difference
    assert cover["t6"] / reps >= 0.88, cover


def test_scorecard_paired_difference_uses_the_studentized_interval():
    from resdyn.beyond import scorecard

    row = pd.DataFrame(
        {
            "metric": ["m"],
            "bootstrapped": [True],
            "n_resamples": [4],
            "n_bootstrap_samples": [9],
            "seed": [0],
            "estimate": [1.0],
            "interval": ["studentized"],
        }
    )
    ra = pd.DataFrame({"replicate": [0, 1, 2, 3], "metric": "m", "value": [1.0, 2.0, 3.0, 4.0]})
    rb = ra.assign(value=[2.0, 4.0, 5.0, 9.0])
    ci, source, n = scorecard.paired_difference_ci(row, ra, row.assign(estimate=3.0), rb, "m", 0.9)
    assert ci == pytest.approx(bs.studentized_ci([1.0, 2.0, 2.0, 5.0], 2.0, 0.9), rel=1e-12) and n == 9
    # a table without the interval column is read as percentile intervals
    ci, _, _ = scorecard.paired_difference_ci(
        row.drop(columns="interval"), ra, row.drop(columns="interval"), rb, "m", 0.9
    )
    assert ci == bs.percentile_ci(np.array([1.0, 2.0, 2.0, 5.0]), 0.9)
