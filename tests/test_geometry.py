"""Residual-stream geometry: closed forms, a synthetic stack with known updates, depth scaling."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from resdyn.study_b.geometry import (
    LAYER_COLUMNS,
    depth_scaling,
    fallback_widths,
    hidden_effective_rank,
    hidden_singular_values,
    hit_ratio,
    layer_geometry,
    phase_metrics,
    phase_table,
    token_abs_cosines,
    update_norm_ratio,
    update_orthogonality,
    with_lens_hits,
)


def _orthonormal(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    return np.linalg.qr(rng.standard_normal((n, k)))[0]


# ---------------------------------------------------------------- effective rank


@pytest.mark.parametrize("method", ["svd", "gram"])
@pytest.mark.parametrize("r", [1, 2, 5, 8])
def test_effective_rank_of_equal_singular_values_is_r(method, r):
    rng = np.random.default_rng(r)
    T, d = 40, 12
    # left factor orthonormal and orthogonal to the all-ones vector, so H0 is already centered
    U = _orthonormal(rng, T, r + 1)
    U = U - U.mean(axis=0)
    U = np.linalg.qr(U)[0][:, :r]
    assert np.allclose(U.sum(axis=0), 0, atol=1e-12)
    H0 = 3.0 * U @ _orthonormal(rng, d, r).T
    H = H0 + rng.standard_normal(d)  # a common offset is removed by centering
    np.testing.assert_allclose(hidden_singular_values(H, method)[:r], 3.0, rtol=1e-10)
    assert hidden_effective_rank(H, method) == pytest.approx(r, rel=1e-9)


def test_effective_rank_svd_and_gram_agree_and_bounds():
    rng = np.random.default_rng(0)
    H = rng.standard_normal((200, 16)) @ np.diag(np.linspace(0.1, 3, 16))
    a, b = hidden_effective_rank(H, "svd"), hidden_effective_rank(H, "gram")
    assert a == pytest.approx(b, rel=1e-10)
    assert 1.0 <= a <= 16.0
    # leading axes are pooled into tokens
    assert hidden_effective_rank(H.reshape(10, 20, 16)) == pytest.approx(a, rel=1e-12)


def test_effective_rank_degenerate_and_validation():
    assert hidden_effective_rank(np.ones((5, 3))) == 0.0  # centered matrix is 0
    with pytest.raises(ValueError, match=r"at least 2 tokens.*\(1, 3\)"):
        hidden_effective_rank(np.ones((1, 3)))
    with pytest.raises(ValueError, match=r"\(tokens, d\).*\(3,\)"):
        hidden_effective_rank(np.ones(3))
    with pytest.raises(ValueError, match="non-finite"):
        hidden_effective_rank(np.array([[1.0, np.nan], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="method"):
        hidden_effective_rank(np.eye(3), "qr")


# ---------------------------------------------------------------- update orthogonality, norm ratio


def test_orthogonality_orthogonal_and_parallel():
    rng = np.random.default_rng(0)
    h = rng.standard_normal((30, 8))
    # orthogonal updates: project random vectors off each token's h
    z = rng.standard_normal((30, 8))
    orth = z - (np.sum(z * h, axis=1) / np.sum(h * h, axis=1))[:, None] * h
    assert update_orthogonality(orth, h) == pytest.approx(0.0, abs=1e-14)
    scale = rng.uniform(-3, 3, size=(30, 1))
    assert update_orthogonality(scale * h, h) == pytest.approx(1.0, rel=1e-14)  # (anti)parallel
    # 45 degrees in a plane
    assert update_orthogonality([[1.0, 1.0]], [[1.0, 0.0]]) == pytest.approx(np.sqrt(0.5), rel=1e-15)


def test_orthogonality_excludes_zero_norm_tokens():
    h = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    delta = np.array([[2.0, 0.0], [0.0, 0.0], [1.0, -1.0], [1.0, 0.0]])
    c = token_abs_cosines(delta, h)
    np.testing.assert_allclose(c[[0, 2]], [1.0, 0.0], atol=1e-15)
    assert np.isnan(c[1]) and np.isnan(c[3])
    assert update_orthogonality(delta, h) == pytest.approx(0.5)
    assert np.isnan(update_orthogonality(np.zeros((2, 2)), np.ones((2, 2))))
    with pytest.raises(ValueError, match=r"\(3, 2\) and \(4, 2\)"):
        update_orthogonality(np.ones((3, 2)), h)


def test_norm_ratio_closed_form():
    attn = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])  # norms 1, 2, 5
    mlp = np.array([[0.0, 3.0], [4.0, 0.0], [0.0, 5.0]])  # norms 3, 4, 5
    assert update_norm_ratio(mlp, attn) == pytest.approx((3 + 2 + 1) / 3)
    assert update_norm_ratio(mlp, attn, "ratio_of_means") == pytest.approx(12 / 8)
    # tokens with a zero attention update are left out of the mean of ratios only
    attn0 = np.vstack([attn, np.zeros(2)])
    mlp0 = np.vstack([mlp, [6.0, 8.0]])
    assert update_norm_ratio(mlp0, attn0) == pytest.approx(2.0)
    assert update_norm_ratio(mlp0, attn0, "ratio_of_means") == pytest.approx(22 / 8)
    # constant per-token ratio: both agree
    assert update_norm_ratio(2.5 * attn, attn) == pytest.approx(2.5)
    assert update_norm_ratio(2.5 * attn, attn, "ratio_of_means") == pytest.approx(2.5)
    assert np.isnan(update_norm_ratio(mlp, np.zeros_like(mlp)))
    with pytest.raises(ValueError, match="how"):
        update_norm_ratio(mlp, attn, "median")


# ---------------------------------------------------------------- layer_geometry


def _synthetic_stack(N=3, T=5, d=6, seed=0):
    """Two layers with planted updates (see test below); position 0 is an odd 'sink' token."""
    rng = np.random.default_rng(seed)
    c = rng.uniform(1.0, 2.0, size=(N, T))
    e = np.eye(d)
    h0 = c[..., None] * e[0]  # along e0
    m0 = h0 + 2.0 * e[1]  # attention adds 2 e1 (orthogonal to h0)
    h1 = m0 + 3.0 * e[2]  # MLP adds 3 e2 (orthogonal to m0)
    m1 = 1.5 * h1  # attention of layer 1 scales the stream (parallel update, norm 0.5|h1|)
    h2 = m1 + 0.25 * m1  # MLP update parallel to m1 with norm 0.25 |m1|
    S = np.stack([h0, m0, h1, m1, h2], axis=1)  # (N, 5, T, d)
    S[:, :, 0, :] = rng.standard_normal((N, 5, d)) * 100  # sink position, to be skipped
    return S, c


def test_layer_geometry_planted_updates():
    S, c = _synthetic_stack()
    N, _, T, d = S.shape
    df = layer_geometry(S, skip_positions=1)
    assert list(df.columns) == LAYER_COLUMNS
    assert df["layer"].tolist() == [0, 1, 2] and df["state"].tolist() == ["h_L", "h_L", "output"]
    assert (df["n_tokens"] == N * (T - 1)).all()
    r0, r1, out = df.iloc[0], df.iloc[1], df.iloc[2]
    # layer 0: Δ = 2 e1 + 3 e2 ⟂ h0 = c e0; attention ⟂ h0; MLP ⟂ m0? m0 = c e0 + 2 e1, Δ_mlp = 3 e2 ⟂
    assert r0.update_orthogonality == pytest.approx(0.0, abs=1e-15)
    assert r0.attn_orthogonality == pytest.approx(0.0, abs=1e-15)
    assert r0.mlp_orthogonality == pytest.approx(0.0, abs=1e-15)
    assert r0.norm_ratio == pytest.approx(1.5) and r0.norm_ratio_of_means == pytest.approx(1.5)
    cc = c[:, 1:]
    assert r0.relative_update_norm == pytest.approx(np.mean(np.sqrt(13.0) / cc), rel=1e-12)
    assert r0.n_excluded == 0
    # layer 1: updates parallel to the stream; |Δ_mlp| / |Δ_attn| = 0.25·1.5 / 0.5 = 0.75
    assert r1.update_orthogonality == pytest.approx(1.0, rel=1e-14)
    assert r1.attn_orthogonality == pytest.approx(1.0, rel=1e-14)
    assert r1.mlp_orthogonality == pytest.approx(1.0, rel=1e-14)
    assert r1.norm_ratio == pytest.approx(0.75, rel=1e-12)
    assert r1.relative_update_norm == pytest.approx(1.5 * 1.25 - 1.0, rel=1e-12)
    # hidden effective rank, pooled over samples, equals the function on the pooled tokens
    assert r0.hidden_erank == pytest.approx(hidden_effective_rank(S[:, 0, 1:].reshape(-1, d)), rel=1e-12)
    assert r0.hidden_erank == pytest.approx(1.0, rel=1e-12)  # h0 varies only along e0
    assert out.hidden_erank == pytest.approx(hidden_effective_rank(S[:, 4, 1:].reshape(-1, d)), rel=1e-12)
    assert np.isnan(out.update_orthogonality) and np.isnan(out.norm_ratio)


def test_layer_geometry_skip_changes_result_and_float32_input():
    S, _ = _synthetic_stack()
    full = layer_geometry(S.astype(np.float32))
    assert (full["n_tokens"] == 3 * 5).all()
    assert full.iloc[0].update_orthogonality > 0.0  # the sink position is not orthogonal
    skipped = layer_geometry(S.astype(np.float32), skip_positions=1)
    assert skipped.iloc[0].update_orthogonality == pytest.approx(0.0, abs=1e-6)


def test_layer_geometry_counts_excluded_tokens():
    S, _ = _synthetic_stack()
    S[0, 0, 2] = 0.0  # h0 of one token is zero
    df = layer_geometry(S, skip_positions=1)
    assert df.iloc[0].n_excluded == 1


def test_layer_geometry_chunking_and_gram_route_agree():
    rng = np.random.default_rng(1)
    N, n, T, d = 5, 3, 7, 6
    S = rng.standard_normal((N, 2 * n + 1, T, d)).cumsum(axis=1) + 50.0  # large common mean
    ref = layer_geometry(S, skip_positions=1, erank_method="svd")
    num = [c for c in LAYER_COLUMNS if c not in ("layer", "state", "n_tokens", "n_excluded")]
    for kwargs in (
        dict(chunk_samples=1),
        dict(chunk_samples=2, erank_method="gram"),
        dict(erank_method="gram"),
    ):
        other = layer_geometry(S, skip_positions=1, **kwargs)
        pd.testing.assert_frame_equal(
            other[["layer", "state", "n_tokens", "n_excluded"]],
            ref[["layer", "state", "n_tokens", "n_excluded"]],
        )
        np.testing.assert_allclose(other[num].to_numpy(float), ref[num].to_numpy(float), rtol=1e-9, equal_nan=True)


def test_gram_route_is_stable_under_a_large_mean():
    rng = np.random.default_rng(2)
    H = rng.standard_normal((300, 10)) @ np.diag(np.linspace(0.5, 2, 10)) + 1e6
    a = hidden_singular_values(H, "svd")
    b = hidden_singular_values(H, "gram")
    np.testing.assert_allclose(b, a, rtol=1e-6)


def test_layer_geometry_reads_an_h5py_dataset(tmp_path):
    h5py = pytest.importorskip("h5py")
    S, _ = _synthetic_stack()
    with h5py.File(tmp_path / "states.h5", "w") as f:
        f["states"] = S.astype(np.float32)
    with h5py.File(tmp_path / "states.h5", "r") as f:
        df = layer_geometry(f["states"], skip_positions=1, chunk_samples=2)
    ref = layer_geometry(S.astype(np.float32), skip_positions=1)
    pd.testing.assert_frame_equal(df, ref)


@pytest.mark.parametrize(
    "shape,skip,match",
    [
        ((2, 5, 3), 0, r"\(N_samples, 2n\+1, T, d\).*\(2, 5, 3\)"),
        ((2, 4, 3, 2), 0, r"odd number >= 3, got 4"),
        ((2, 1, 3, 2), 0, r"odd number >= 3, got 1"),
        ((2, 3, 3, 2), 3, r"skip_positions must be in \[0, T-1\] = \[0, 2\], got 3"),
        ((2, 3, 3, 2), -1, r"got -1"),
    ],
)
def test_layer_geometry_validation(shape, skip, match):
    with pytest.raises(ValueError, match=match):
        layer_geometry(np.ones(shape), skip_positions=skip)


def test_layer_geometry_rejects_bad_options():
    S = np.ones((1, 3, 4, 2))
    with pytest.raises(ValueError, match="erank_method"):
        layer_geometry(S, erank_method="qr")
    with pytest.raises(ValueError, match="chunk_samples"):
        layer_geometry(S, chunk_samples=0)
    with pytest.raises(ValueError, match="eps"):
        layer_geometry(S, eps=-1.0)


def test_layer_geometry_rejects_nan():
    S = np.ones((1, 3, 4, 2))
    S[0, 1, 2, 0] = np.nan
    with pytest.raises(ValueError, match=r"boundary_states\[:, 1\].*non-finite"):
        layer_geometry(S)


# ---------------------------------------------------------------- phase_metrics


def test_phase_metrics_hand_made():
    per_layer = pd.DataFrame(
        {
            "layer": [0, 1, 2, 3, 4, 5, 6],
            "a": [1.0, 3.0, 5.0, 5.0, 5.0, 9.0, np.nan],
            "b": [0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 6.0],
        }
    )
    pm = phase_metrics(per_layer, 1, 4, ["a", "b"])
    assert list(pm.columns) == ["phase", "phase_name", "metric", "mean", "sd", "n_layers"]
    assert pm[["phase", "metric"]].values.tolist() == [
        [1, "a"],
        [1, "b"],
        [2, "a"],
        [2, "b"],
        [3, "a"],
        [3, "b"],
    ]
    assert pm.phase_name.tolist() == ["rise", "rise", "plateau", "plateau", "descent", "descent"]
    a = pm[pm.metric == "a"]
    np.testing.assert_allclose(a["mean"], [2.0, 5.0, 9.0])
    np.testing.assert_allclose(a["sd"].iloc[:2], [np.sqrt(2.0), 0.0])
    assert np.isnan(a["sd"].iloc[2])  # one finite value (layer 6 is NaN)
    assert a.n_layers.tolist() == [2, 3, 1]
    b = pm[pm.metric == "b"]
    np.testing.assert_allclose(b["mean"], [0.0, 2.0, 5.0])
    assert b.n_layers.tolist() == [2, 3, 2]


def test_phase_metrics_empty_phase_and_validation():
    per_layer = pd.DataFrame({"layer": [0, 1, 2], "a": [1.0, 2.0, 3.0]})
    pm = phase_metrics(per_layer, 2, 2, ["a"])
    assert pm.n_layers.tolist() == [3, 0, 0]
    assert pm["mean"].isna().tolist() == [False, True, True]
    with pytest.raises(ValueError, match=r"lacks columns \['zz'\]"):
        phase_metrics(per_layer, 0, 1, ["zz"])
    with pytest.raises(ValueError, match="b1=2, b2=1"):
        phase_metrics(per_layer, 2, 1, ["a"])
    with pytest.raises(ValueError, match="non-negative integers"):
        phase_metrics(pd.DataFrame({"layer": [0.5], "a": [1.0]}), 0, 0, ["a"])


def test_phase_metrics_on_layer_geometry_output():
    S, _ = _synthetic_stack()
    pm = phase_metrics(layer_geometry(S, skip_positions=1), 0, 0, ["update_orthogonality", "hidden_erank"])
    row = pm[(pm.phase == 3) & (pm.metric == "update_orthogonality")].iloc[0]
    assert row.n_layers == 1 and row["mean"] == pytest.approx(1.0)  # output row is NaN: skipped
    assert pm[(pm.phase == 3) & (pm.metric == "hidden_erank")].iloc[0].n_layers == 2


# ---------------------------------------------------------------- depth_scaling


def _planted_widths(depths, slope=0.3, intercept=1.0, noise=0.4, reps=3, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for n in depths:
        for r in range(reps):
            model = f"m{n}_{r}"
            for phase, (s, b) in {1: (slope, intercept), 2: (0.5, -2.0)}.items():
                rows.append({"model": model, "n_layers": n, "phase": phase, "width": b + s * n + rng.normal(0, noise)})
    return pd.DataFrame(rows)


def test_depth_scaling_recovers_planted_slope():
    w = _planted_widths([8, 12, 16, 24, 32])
    res = depth_scaling(w)
    assert res.phase.tolist() == [1, 2] and (res.status == "ok").all()
    for phase, slope in [(1, 0.3), (2, 0.5)]:
        r = res[res.phase == phase].iloc[0]
        assert r.slope_ci_low < slope < r.slope_ci_high
        assert r.slope == pytest.approx(slope, abs=0.05)
        sub = w[w.phase == phase]
        ref_slope, ref_int = np.polyfit(sub.n_layers, sub.width, 1)
        assert r.slope == pytest.approx(ref_slope, rel=1e-10)
        assert r.intercept == pytest.approx(ref_int, rel=1e-8)
        assert r.n_models == 15 and r.n_depths == 5 and r.n_obs == 15
        assert 0.9 < r.r_squared <= 1 and r.p_value < 1e-6


def test_depth_scaling_exact_fit_and_three_depths():
    w = pd.DataFrame({"model": list("abc"), "n_layers": [8, 12, 16], "phase": 2, "width": [3.0, 5.0, 7.0]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = depth_scaling(w).iloc[0]
    assert r.status == "ok" and r.slope == pytest.approx(0.5) and r.intercept == pytest.approx(-1.0)
    assert r.slope_ci_low == pytest.approx(0.5) and r.slope_ci_high == pytest.approx(0.5)


def test_depth_scaling_too_few_depths():
    w = _planted_widths([8, 16], reps=3)
    res = depth_scaling(w)
    assert (res.status == "too_few_depths").all()
    assert res.slope.isna().all() and res.slope_ci_low.isna().all()
    assert res.n_depths.tolist() == [2, 2] and res.n_models.tolist() == [6, 6]


def test_depth_scaling_mixed_and_validation():
    w = pd.concat(
        [
            _planted_widths([8, 12, 16]),
            pd.DataFrame([{"model": "x", "n_layers": 8, "phase": 3, "width": 2.0}]),
        ]
    )
    res = depth_scaling(w)
    assert res.status.tolist() == ["ok", "ok", "too_few_depths"]
    with pytest.raises(ValueError, match=r"lacks columns \['width'\]"):
        depth_scaling(w.drop(columns="width"))
    bad = w.copy()
    bad.loc[bad.index[0], "width"] = np.nan
    with pytest.raises(ValueError, match="finite"):
        depth_scaling(bad)
    with pytest.raises(ValueError, match="alpha"):
        depth_scaling(w, alpha=1.5)


# ---------------------------------------------------------------- lens hits and phase_table


def _lens_metrics(n: int) -> pd.DataFrame:
    rows = []
    for lens in ("tuned", "logit"):
        for layer in range(n + 1):
            base = 0.5 if lens == "tuned" else 0.2
            rows.append(
                {
                    "lens": lens,
                    "layer": layer,
                    "kl": 1.0,
                    "hit1": base + 0.1 * layer,
                    "hit5": base + 0.2 * layer,
                }
            )
    return pd.DataFrame(rows)


def test_with_lens_hits_joins_on_layer():
    S, _ = _synthetic_stack()
    per_layer = layer_geometry(S, skip_positions=1)  # layers 0, 1 and output row 2
    out = with_lens_hits(per_layer, _lens_metrics(2))
    assert out["layer"].tolist() == [0, 1, 2]
    for col in ("tuned_hit1", "tuned_hit5", "logit_hit1", "logit_hit5"):
        assert col in out.columns
    np.testing.assert_allclose(out.tuned_hit1, [0.5, 0.6, 0.7])
    np.testing.assert_allclose(out.logit_hit5, [0.2, 0.4, 0.6])
    partial = with_lens_hits(per_layer, _lens_metrics(2).query("layer < 2"))
    assert np.isnan(partial.tuned_hit1.iloc[2])
    with pytest.raises(ValueError, match="duplicate"):
        with_lens_hits(per_layer, pd.concat([_lens_metrics(2), _lens_metrics(2)]))
    with pytest.raises(ValueError, match=r"lacks columns \['hit5'\]"):
        with_lens_hits(per_layer, _lens_metrics(2).drop(columns="hit5"))


def test_phase_table_from_cutpoints_result():
    S, _ = _synthetic_stack()
    per_layer = with_lens_hits(layer_geometry(S, skip_positions=1), _lens_metrics(2))
    cuts = {"b1": 0, "b2": 0, "peak": 0, "reason": ""}
    pt = phase_table(per_layer, cuts)
    assert set(pt.metric) == {
        "hidden_erank", "update_orthogonality", "attn_orthogonality", "mlp_orthogonality", "norm_ratio",
        "norm_ratio_of_means", "relative_update_norm", "update_norm", "attn_update_norm", "mlp_update_norm",
        "update_erank", "attn_update_erank", "mlp_update_erank", "tuned_hit1", "tuned_hit5", "tuned_hit5_over_hit1",
        "logit_hit1", "logit_hit5", "logit_hit5_over_hit1",
    }  # fmt: skip
    # the output row (layer 2) is left out: phase 3 holds layer 1 only
    row = pt[(pt.phase == 3) & (pt.metric == "tuned_hit1")].iloc[0]
    assert row.n_layers == 1 and row["mean"] == pytest.approx(0.6)
    with pytest.raises(ValueError, match="b1"):
        phase_table(per_layer, {"peak": 0})


# ---------------------------------------------------------------- update effective rank and norms


def _centered_rank_r(rng: np.random.Generator, n_tok: int, d: int, sigma: np.ndarray) -> np.ndarray:
    """A (tokens × d) matrix whose token-centered singular values are exactly ``sigma`` (then 0):
    U (columns orthogonal to the all-ones vector) · diag(sigma) · Vᵀ, plus a constant row."""
    C = rng.standard_normal((n_tok, sigma.size))
    U = np.linalg.qr(C - C.mean(axis=0))[0]  # orthonormal columns, each summing to 0
    V = _orthonormal(rng, d, sigma.size)
    return U @ np.diag(sigma) @ V.T + rng.standard_normal(d)  # the constant row is removed by centering


def _roy_vetterli(sigma: np.ndarray) -> float:
    p = sigma[sigma > 0] / sigma.sum()
    return float(np.exp(-(p * np.log(p)).sum()))


def test_update_erank_closed_form_and_absolute_norms():
    """Δ_attn and Δ_mlp of rank 3 and 2 with known singular values: their effective ranks are the
    closed form exp(−Σ p log p), p = σ/Σσ; Δ_L = Δ_attn + Δ_mlp is checked against numpy's SVD of
    the centered matrix; absolute norms against the per-token norms."""
    rng = np.random.default_rng(3)
    N, T, d = 4, 10, 12
    s_attn, s_mlp = np.array([5.0, 2.0, 1.0]), np.array([3.0, 3.0])
    A = _centered_rank_r(rng, N * T, d, s_attn)
    M = _centered_rank_r(rng, N * T, d, s_mlp)
    h0 = rng.standard_normal((N * T, d))
    m0, h1 = h0 + A, h0 + A + M
    S = np.stack([x.reshape(N, T, d) for x in (h0, m0, h1)], axis=1)
    for method in ("svd", "gram"):
        row = layer_geometry(S, erank_method=method).iloc[0]
        assert row.attn_update_erank == pytest.approx(_roy_vetterli(s_attn), rel=1e-9)
        assert row.mlp_update_erank == pytest.approx(2.0, rel=1e-9)  # two equal singular values
        total = np.linalg.svd((A + M) - (A + M).mean(axis=0), compute_uv=False)
        assert row.update_erank == pytest.approx(_roy_vetterli(total), rel=1e-9)
        assert row.update_norm == pytest.approx(np.linalg.norm(A + M, axis=1).mean(), rel=1e-12)
        assert row.attn_update_norm == pytest.approx(np.linalg.norm(A, axis=1).mean(), rel=1e-12)
        assert row.mlp_update_norm == pytest.approx(np.linalg.norm(M, axis=1).mean(), rel=1e-12)
        # the relative norm is the absolute one over the stream's norm, token by token
        assert row.relative_update_norm == pytest.approx(
            np.mean(np.linalg.norm(A + M, axis=1) / np.linalg.norm(h0, axis=1)), rel=1e-12
        )
    out = layer_geometry(S).iloc[1]
    assert out.state == "output" and np.isnan(out.update_erank) and np.isnan(out.update_norm)


def test_update_erank_planted_stack():
    # _synthetic_stack: layer 1's attention update is 0.5·h1, whose tokens vary along e0 only
    S, _ = _synthetic_stack()
    df = layer_geometry(S, skip_positions=1)
    assert df.iloc[1].attn_update_erank == pytest.approx(1.0, rel=1e-9)
    assert df.iloc[0].attn_update_erank == 0.0  # Δ_attn = 2 e1 for every token: centered, it is 0


def test_hit_ratio_per_layer_and_phase():
    np.testing.assert_array_equal(hit_ratio([0.5, 0.9, 0.1], [0.25, 0.9, 0.0]), [2.0, 1.0, np.nan])
    S, _ = _synthetic_stack()
    per_layer = with_lens_hits(layer_geometry(S, skip_positions=1), _lens_metrics(2))
    lm = _lens_metrics(2)
    for lens in ("tuned", "logit"):
        want = lm[lm.lens == lens].set_index("layer").hit5 / lm[lm.lens == lens].set_index("layer").hit1
        np.testing.assert_allclose(per_layer[f"{lens}_hit5_over_hit1"], want.loc[[0, 1, 2]].to_numpy())
    pt = phase_table(per_layer, {"b1": 0, "b2": 0})
    row = pt[(pt.phase == 1) & (pt.metric == "logit_hit5_over_hit1")].iloc[0]
    assert row["mean"] == pytest.approx(float(want.loc[0]))


def test_fallback_widths_flag_the_phases_a_fallback_cut_bounds():
    assert fallback_widths(True, True) == (False, False, False)
    assert fallback_widths(False, True) == (True, True, False)
    assert fallback_widths(True, False) == (False, True, True)
    assert fallback_widths(False, False) == (True, True, True)


def test_depth_scaling_leaves_fallback_widths_out():
    """Planted: exact widths 0.5·n − 1 plus fallback rows far off the line; the fit without them
    recovers the line exactly and counts them, the fit with them does not."""
    exact = pd.DataFrame(
        {"model": list("abcd"), "n_layers": [8, 12, 16, 20], "phase": 2, "width": [3.0, 5.0, 7.0, 9.0]}
    )
    off = pd.DataFrame({"model": ["e", "f"], "n_layers": [12, 20], "phase": 2, "width": [0.0, 0.0]})
    w = pd.concat([exact.assign(fallback=False), off.assign(fallback=True)], ignore_index=True)
    r = depth_scaling(w).iloc[0]
    assert r.status == "ok" and r.slope == pytest.approx(0.5) and r.n_obs == 4 and r.n_fallback == 2
    biased = depth_scaling(w.drop(columns="fallback")).iloc[0]
    assert biased.slope != pytest.approx(0.5, abs=0.05) and biased.n_fallback == 0
    # a phase left with fewer than 3 depths once the fallbacks are out is not fitted, and says why
    few = w.assign(fallback=w["n_layers"] >= 16)
    r = depth_scaling(few).iloc[0]
    assert r.status == "too_few_depths" and r.n_fallback == 3 and "3 fallback width(s) left out" in r.reason
