"""Oracles for resdyn.study_a.topology: correlation, top-k sparsification, signed Leiden, boundary units,
participation, gains, coupling test calibration, BH-FDR and the table builders."""

from __future__ import annotations

import itertools
import math
import warnings

import igraph as ig
import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests

from resdyn.study_a import topology as T

# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def nmi(a, b) -> float:
    return float(ig.compare_communities(list(map(int, a)), list(map(int, b)), method="nmi"))


def planted(n_tokens=1500, size=30, noise=1.0, seed=0):
    """4 groups × ``size`` units. Groups 0/1 load ± on latent f0, groups 2/3 ± on f1 (so 0↔1 and
    2↔3 are anti-correlated), every group has its own factor (within-group r > 0), plus noise."""
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal((n_tokens, 2))
    own = rng.standard_normal((n_tokens, 4))
    truth = np.repeat(np.arange(4), size)
    which = np.array([0, 0, 1, 1])[truth]
    sign = np.array([1.0, -1.0, 1.0, -1.0])[truth]
    X = shared[:, which] * sign + 0.7 * own[:, truth] + noise * rng.standard_normal((n_tokens, truth.size))
    return X, truth


def signed_graph(n, edges):
    g = ig.Graph(n=n, edges=[(a, b) for a, b, _ in edges], directed=False)
    g.es["weight"] = [float(w) for _, _, w in edges]
    return g


def brute_top_k(R, k, tau=0.0):
    d = R.shape[0]
    keep = set()
    for i in range(d):
        others = [j for j in range(d) if j != i]
        others.sort(key=lambda j: -abs(R[i, j]))
        for j in others[:k]:
            if R[i, j] != 0:
                keep.add((min(i, j), max(i, j)))
    return {e for e in keep if abs(R[e]) >= tau}


# ----------------------------------------------------------------------------------------------
# correlation
# ----------------------------------------------------------------------------------------------


def test_correlation_matches_corrcoef():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((50, 7)) @ rng.standard_normal((7, 7))
    R, info = T.correlation_matrix(X)
    np.testing.assert_allclose(R, np.corrcoef(X, rowvar=False), atol=1e-10, rtol=0)
    assert info["n_tokens"] == 50 and info["n_units"] == 7 and info["constant_units"].size == 0
    np.testing.assert_array_equal(R, R.T)


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_correlation_chunked_matches_corrcoef(chunk):
    rng = np.random.default_rng(2)
    X = 1e4 + rng.standard_normal((64, 9)) @ rng.standard_normal((9, 9))  # large offset
    ref = np.corrcoef(X, rowvar=False)
    R, _ = T.correlation_matrix(X, chunk_size=chunk)
    np.testing.assert_allclose(R, ref, atol=1e-10, rtol=0)


def test_correlation_from_uneven_chunk_iterable_and_float32():
    rng = np.random.default_rng(3)
    X = (rng.standard_normal((101, 6)) @ rng.standard_normal((6, 6))).astype(np.float32)
    cuts = [0, 1, 13, 14, 60, 101]
    gen = (X[a:b] for a, b in zip(cuts[:-1], cuts[1:]))
    R, info = T.correlation_matrix(gen)
    assert info["n_tokens"] == 101
    np.testing.assert_allclose(R, np.corrcoef(X.astype(np.float64), rowvar=False), atol=1e-10, rtol=0)


def test_correlation_does_not_modify_input():
    X = np.random.default_rng(4).standard_normal((20, 5))
    X0 = X.copy()
    T.correlation_matrix(X, chunk_size=6)
    np.testing.assert_array_equal(X, X0)


def test_constant_unit_gives_zero_with_warning():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((40, 5))
    X[:, 2] = 3.14159
    with pytest.warns(RuntimeWarning, match=r"constant unit.*\[2\]"):
        R, info = T.correlation_matrix(X, chunk_size=7)
    assert np.isfinite(R).all()
    assert (R[2] == 0).all() and (R[:, 2] == 0).all()
    assert info["constant_units"].tolist() == [2]
    keep = [0, 1, 3, 4]
    np.testing.assert_allclose(R[np.ix_(keep, keep)], np.corrcoef(X[:, keep], rowvar=False), atol=1e-10)
    with pytest.warns(RuntimeWarning):
        g = T.correlation_graph(X, top_k=4)
    assert g.degree(2) == 0 and g["n_constant_units"] == 1


@pytest.mark.parametrize(
    "X, match",
    [
        (np.zeros(5), "2-D"),
        (np.ones((1, 3)), "at least 2 tokens"),
        (np.ones((5, 1)), "at least 2 units"),
        (np.array([[0.0, 1.0], [np.nan, 2.0], [1.0, 0.0]]), r"non-finite.*rows \[1\]"),
    ],
)
def test_correlation_validation(X, match):
    with pytest.raises(ValueError, match=match):
        T.correlation_matrix(X)


def test_correlation_validation_chunks_and_args():
    with pytest.raises(ValueError, match="chunk 1 has 3 units"):
        T.correlation_matrix(iter([np.ones((2, 2)), np.ones((2, 3))]))
    with pytest.raises(ValueError, match="chunk_size"):
        T.correlation_matrix(np.ones((4, 2)), chunk_size=0)
    with pytest.raises(TypeError, match="iterable"):
        T.correlation_matrix(3.0)
    X = np.random.default_rng(0).standard_normal((10, 4))
    with pytest.raises(ValueError, match="top_k must be a positive integer.*0"):
        T.correlation_graph(X, top_k=0)
    with pytest.raises(ValueError, match=r"min_abs_r must be in \[0, 1\].*1.5"):
        T.correlation_graph(X, top_k=2, min_abs_r=1.5)


# ----------------------------------------------------------------------------------------------
# top-k sparsification
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k, tau", [(1, 0.0), (3, 0.0), (3, 0.2), (11, 0.0), (50, 0.1)])
def test_top_k_matches_brute_force(k, tau):
    rng = np.random.default_rng(6)
    X = rng.standard_normal((30, 12)) @ rng.standard_normal((12, 12))
    R = np.corrcoef(X, rowvar=False)
    edges, w = T.top_k_edges(R, k, tau)
    got = {tuple(e) for e in edges.tolist()}
    assert got == brute_top_k(R, k, tau)
    assert (edges[:, 0] < edges[:, 1]).all()
    np.testing.assert_array_equal(w, R[edges[:, 0], edges[:, 1]])
    if k >= 11:
        assert len(got) == (66 if tau == 0 else len(brute_top_k(R, 11, tau)))


def test_correlation_graph_structure():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((80, 10)) @ rng.standard_normal((10, 10))
    g = T.correlation_graph(X, top_k=3, min_abs_r=0.05, chunk_size=9)
    R = np.corrcoef(X, rowvar=False)
    assert g.vcount() == 10 and not g.is_directed()
    assert {tuple(sorted(e)) for e in g.get_edgelist()} == brute_top_k(R, 3, 0.05)
    for e in g.es:
        assert e["weight"] == pytest.approx(R[e.source, e.target], abs=1e-10)
    assert not any(a == b for a, b in g.get_edgelist())
    assert g["n_tokens"] == 80 and g["top_k"] == 3 and g["min_abs_r"] == 0.05


# ----------------------------------------------------------------------------------------------
# signed Leiden
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("top_k, gamma", [(10, 0.05), (40, 0.1)])
def test_planted_signed_partition_recovered(top_k, gamma):
    X, truth = planted(noise=1.2)
    g = T.correlation_graph(X, top_k=top_k)
    if top_k == 40:
        assert min(g.es["weight"]) < -0.2  # anti-correlated groups give negative edges
    labels = T.signed_leiden(g, gamma, seed=1)
    assert nmi(labels, truth) >= 0.9


def test_resolution_grid_selects_max_signed_modularity():
    X, truth = planted(noise=1.2, seed=11)
    g = T.correlation_graph(X, top_k=20)
    grid = [0.9, 0.5, 0.1, 0.3, 0.02]
    part = T.signed_leiden_partition(g, grid, seed=3)
    assert [p.resolution for p in part.grid] == sorted(grid)
    mods = [p.modularity for p in part.grid]
    best = max(mods)
    assert part.modularity == best
    # ties → the smallest γ
    assert part.resolution == min(p.resolution for p in part.grid if p.modularity == best)
    assert nmi(part.labels, truth) >= 0.9
    single = T.signed_leiden_partition(g, part.resolution, seed=3)
    np.testing.assert_array_equal(single.labels, part.labels)
    assert single.quality == pytest.approx(part.quality)
    # the largest γ fragments the graph and has lower modularity
    assert part.grid[-1].n_communities > part.n_communities and part.grid[-1].modularity < best


def test_signed_modularity_matches_dense_formula():
    rng = np.random.default_rng(8)
    n = 15
    edges = [(i, j, rng.normal()) for i, j in itertools.combinations(range(n), 2) if rng.random() < 0.4]
    g = signed_graph(n, edges)
    labels = rng.integers(0, 3, n)
    W = np.zeros((n, n))
    for i, j, w in edges:
        W[i, j] = W[j, i] = w
    Wp, Wn = np.maximum(W, 0), np.maximum(-W, 0)
    delta = labels[:, None] == labels[None, :]
    kp, kn = Wp.sum(1), Wn.sum(1)
    Bp = Wp - np.outer(kp, kp) / kp.sum()
    Bn = Wn - np.outer(kn, kn) / kn.sum()
    ref = ((Bp - Bn) * delta).sum() / (Wp.sum() + Wn.sum())
    assert T.signed_modularity(g, labels) == pytest.approx(ref, abs=1e-12)
    # no negative edges → Newman modularity (igraph)
    gp = signed_graph(n, [e for e in edges if e[2] > 0])
    assert T.signed_modularity(gp, labels) == pytest.approx(gp.modularity(labels.tolist(), weights="weight"), abs=1e-12)


def test_quality_is_signed_cpm_objective():
    # two triangles joined by one positive edge; one negative edge inside the first triangle
    edges = [
        (0, 1, 1.0),
        (1, 2, 1.0),
        (0, 2, -0.5),
        (3, 4, 2.0),
        (4, 5, 2.0),
        (3, 5, 2.0),
        (2, 3, 0.1),
    ]
    g = signed_graph(6, edges)
    gamma = 0.2  # unit 0 joins its triangle: +1 − 0.5 − 2γ > 0
    part = T.signed_leiden_partition(g, gamma, seed=0)
    lab = part.labels
    expected = 0.0
    for c in np.unique(lab):
        inside = [w for a, b, w in edges if lab[a] == c and lab[b] == c]
        n_c = int((lab == c).sum())
        expected += 2 * (
            sum(w for w in inside if w > 0) - sum(-w for w in inside if w < 0) - gamma * n_c * (n_c - 1) / 2
        )
    assert part.quality == pytest.approx(expected)
    assert lab.tolist() == [0, 0, 0, 1, 1, 1]  # canonical: equal sizes → smallest member first


def test_negative_layer_separates_anti_correlated_groups_hand_built():
    # two positive cliques of 10; every cross pair −1 except one weak positive cross edge
    n = 20
    edges = []
    for i, j in itertools.combinations(range(n), 2):
        same = (i < 10) == (j < 10)
        edges.append((i, j, 1.0 if same else -1.0))
    edges = [(i, j, 0.5) if (i, j) == (0, 10) else (i, j, w) for i, j, w in edges]
    g = signed_graph(n, edges)
    truth = np.repeat([0, 1], 10)
    gp = signed_graph(n, [e for e in edges if e[2] > 0])
    gamma = 0.001  # merging the cliques gains 0.5 − 0.001·100 > 0 on the positive layer alone
    assert len(set(T.signed_leiden(gp, gamma, seed=0))) == 1
    assert nmi(T.signed_leiden(g, gamma, seed=0), truth) == pytest.approx(1.0)


def test_negative_layer_separates_anti_correlated_groups_from_data():
    rng = np.random.default_rng(3)
    f = rng.standard_normal((60, 1))
    truth = np.repeat([0, 1], 20)
    X = 0.5 * f * np.where(truth == 0, 1.0, -1.0) + rng.standard_normal((60, 40))
    g = T.correlation_graph(X, top_k=39)  # complete signed graph; a few cross r > 0 by noise
    w = np.asarray(g.es["weight"])
    gp = g.copy()
    gp.delete_edges(np.nonzero(w < 0)[0].tolist())
    unsigned = T.signed_leiden(gp, 0.0, seed=2)
    signed = T.signed_leiden(g, 0.0, seed=2)
    assert unsigned[truth == 0][0] == unsigned[truth == 1][0]  # merged without the negative layer
    assert nmi(signed, truth) == pytest.approx(1.0)


def test_signed_leiden_deterministic_and_canonical():
    X, _ = planted(noise=2.0, seed=5)
    g = T.correlation_graph(X, top_k=8)
    a = T.signed_leiden_partition(g, 0.2, seed=42)
    b = T.signed_leiden_partition(g, 0.2, seed=42)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert a.quality == b.quality and a.modularity == b.modularity
    sizes = np.bincount(a.labels)
    assert (np.diff(sizes) <= 0).all()  # 0 = largest community
    assert a.labels.dtype == np.int64 and a.labels.shape == (120,)


def test_signed_leiden_graph_without_negative_or_any_edges():
    g = signed_graph(4, [(0, 1, 0.9), (2, 3, 0.8)])
    assert T.signed_leiden(g, 0.1, seed=0).tolist() == [0, 0, 1, 1]
    empty = ig.Graph(n=3)
    part = T.signed_leiden_partition(empty, [0.1, 0.2], seed=0)
    assert sorted(part.labels.tolist()) == [0, 1, 2] and math.isnan(part.modularity)


@pytest.mark.parametrize(
    "resolution, seed, match",
    [
        (-0.1, 0, r"resolution must be.*-0.1"),
        (float("nan"), 0, "resolution must be"),
        ([], 0, "grid is empty"),
        ("0.1", 0, "resolution must be a number"),
        ([0.1, -1], 0, "grid value.*-1"),
        (0.1, -3, "seed must be a non-negative integer.*-3"),
    ],
)
def test_signed_leiden_validation(resolution, seed, match):
    g = signed_graph(3, [(0, 1, 0.5)])
    with pytest.raises(ValueError, match=match):
        T.signed_leiden(g, resolution, seed)


def test_graph_validation():
    with pytest.raises(ValueError, match="undirected"):
        T.signed_leiden(ig.Graph(n=2, edges=[(0, 1)], directed=True), 0.1, 0)
    with pytest.raises(ValueError, match="'weight'"):
        T.signed_leiden(ig.Graph(n=2, edges=[(0, 1)]), 0.1, 0)
    with pytest.raises(TypeError, match="igraph.Graph"):
        T.boundary_units(np.eye(3), [0, 0, 0])
    with pytest.raises(ValueError, match=r"labels must have shape \(3,\)"):
        T.boundary_units(signed_graph(3, [(0, 1, 1.0)]), [0, 0])


# ----------------------------------------------------------------------------------------------
# boundary units and participation
# ----------------------------------------------------------------------------------------------


def hand_graph():
    # communities: c0 = {0, 1, 2}, c1 = {3, 4}, c2 = {5, 6}, c3 = {7}
    edges = [
        (0, 1, 0.9),
        (0, 3, 0.5),
        (0, 5, 0.4),  # 0: positive into c1 and c2 → boundary
        (1, 3, 0.6),
        (1, 5, -0.7),  # 1: c1 positive, c2 only negative → not boundary
        (2, 3, 0.3),
        (2, 4, 0.3),  # 2: two neighbours, one other community → not boundary
        (3, 4, 0.8),
        (6, 0, 0.2),
        (6, 3, 0.2),
        (6, 7, 0.2),  # 6: c0, c1, c3 → boundary
    ]
    labels = np.array([0, 0, 0, 1, 1, 2, 2, 3])
    return signed_graph(8, edges), labels


def test_boundary_units_hand_built():
    g, labels = hand_graph()
    # unit 3: positive neighbours 0, 1, 2 (c0), 4 (own), 6 (c2) → two other communities
    expected = [True, False, False, True, False, False, True, False]
    assert T.boundary_units(g, labels).tolist() == expected
    assert T.boundary_units(g, labels, min_other=3).tolist() == [False] * 6 + [True, False]
    assert T.boundary_units(g, labels, min_other=1).tolist() == [True] * 8
    assert T.other_communities(g, labels).tolist() == [2, 1, 1, 2, 1, 1, 3, 1]
    with pytest.raises(ValueError, match="min_other"):
        T.boundary_units(g, labels, min_other=0)


def test_participation_coefficient_hand_built():
    # unit 0: positive to 1 (w 1, own c0), 2 (w 1, c1), 3 (w 2, c2); negative to 4 ignored
    g = signed_graph(6, [(0, 1, 1.0), (0, 2, 1.0), (0, 3, 2.0), (0, 4, -3.0), (1, 4, 0.5)])
    labels = np.array([0, 0, 1, 2, 0, 3])
    pc = T.participation_coefficient(g, labels)
    assert pc[0] == pytest.approx(1 - (0.25**2 + 0.25**2 + 0.5**2))  # 0.625
    # unit 1: neighbours 0 (c0, w 1) and 4 (c0, w .5) → one community → 0
    assert pc[1] == 0.0
    assert pc[2] == 0.0 and pc[3] == 0.0  # a single neighbour
    assert pc[5] == 0.0  # isolated
    assert pc.shape == (6,)


def test_boundary_by_participation():
    pc = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    assert T.boundary_units_by_participation(pc, 0.8).tolist() == [False] * 8 + [True, True]
    zeros = np.zeros(5)
    assert not T.boundary_units_by_participation(zeros, 0.5).any()  # pc = 0 is never boundary
    with pytest.raises(ValueError, match=r"quantile must be in \[0, 1\).*1.0"):
        T.boundary_units_by_participation(pc, 1.0)


# ----------------------------------------------------------------------------------------------
# gains and coupling
# ----------------------------------------------------------------------------------------------


def test_unit_gains_diagonal_and_batched():
    diag = np.array([2.0, -0.5, 0.0, 3.0])
    np.testing.assert_allclose(T.unit_gains(np.diag(diag)), np.abs(diag))
    np.testing.assert_allclose(T.unit_gains(np.diag(diag) - np.eye(4)), np.abs(diag - 1))
    J = np.stack([np.diag(diag), 2 * np.diag(diag)]).astype(np.float32)
    np.testing.assert_allclose(T.unit_gains(J), np.stack([np.abs(diag), 2 * np.abs(diag)]))
    A = np.random.default_rng(0).standard_normal((3, 5))
    np.testing.assert_allclose(T.unit_gains(A), np.sqrt((A**2).sum(0)))
    with pytest.raises(ValueError, match="2-D"):
        T.unit_gains(np.ones(3))
    with pytest.raises(ValueError, match="non-finite"):
        T.unit_gains(np.array([[np.nan]]))


def test_coupling_test_is_calibrated_under_shuffled_labels():
    rng = np.random.default_rng(123)
    gains = rng.lognormal(0.0, 0.7, size=300)
    base = np.zeros(300, dtype=bool)
    base[:45] = True
    ps = np.array([T.coupling_test(gains, rng.permutation(base))[1] for _ in range(400)])
    share = float((ps < 0.05).mean())
    assert 0.02 <= share <= 0.08, share


def test_coupling_stats_detects_effect():
    rng = np.random.default_rng(9)
    gains = rng.lognormal(0.0, 0.3, size=200)
    b = np.zeros(200, dtype=bool)
    b[:40] = True
    gains[b] *= 2.0
    s = T.coupling_stats(gains, b)
    assert s["p_value"] < 1e-6
    assert s["effect_log_median_ratio"] == pytest.approx(math.log(2.0), abs=0.2)
    assert 0.5 < s["rank_biserial"] <= 1.0
    assert s["n_boundary"] == 40 and s["n_interior"] == 160 and s["reason"] is None
    assert T.coupling_test(gains, b) == (s["effect_log_median_ratio"], s["p_value"])


def test_coupling_rank_biserial_extremes():
    g = np.array([5.0, 6.0, 7.0, 1.0, 2.0, 3.0])
    b = np.array([True, True, True, False, False, False])
    assert T.coupling_stats(g, b)["rank_biserial"] == pytest.approx(1.0)
    assert T.coupling_stats(g, ~b)["rank_biserial"] == pytest.approx(-1.0)
    assert T.coupling_stats(g, b)["effect_log_median_ratio"] == pytest.approx(math.log(6 / 2))


def test_coupling_too_few_units_is_nan_not_crash():
    g = np.arange(1.0, 6.0)
    s = T.coupling_stats(g, np.zeros(5, dtype=bool))
    assert math.isnan(s["p_value"]) and math.isnan(s["effect_log_median_ratio"])
    assert "boundary" in s["reason"] and s["n_boundary"] == 0
    e, p = T.coupling_test(g, np.ones(5, dtype=bool))
    assert math.isnan(e) and math.isnan(p)
    s = T.coupling_stats(np.array([0.0, 0.0, 1.0, 2.0]), np.array([1, 1, 0, 0]))
    assert math.isnan(s["effect_log_median_ratio"]) and "non-positive median" in s["reason"]
    assert not math.isnan(s["p_value"])
    with pytest.raises(ValueError, match="shape"):
        T.coupling_stats(g, np.zeros(3, dtype=bool))


def test_bh_matches_statsmodels():
    rng = np.random.default_rng(10)
    p = np.concatenate([rng.uniform(size=40), rng.uniform(0, 0.01, size=10), [0.02, 0.02, 1.0, 0.0]])
    np.testing.assert_allclose(T.bh_fdr(p), multipletests(p, method="fdr_bh")[1], atol=1e-15)
    q = T.bh_fdr(p)
    order = np.argsort(p)
    assert (np.diff(q[order]) >= -1e-15).all() and (q <= 1).all() and (q >= p).all()


def test_bh_nan_passthrough_and_validation():
    p = np.array([0.01, np.nan, 0.04, 0.03, np.nan])
    q = T.bh_fdr(p)
    assert np.isnan(q[[1, 4]]).all()
    np.testing.assert_allclose(q[[0, 2, 3]], multipletests(p[[0, 2, 3]], method="fdr_bh")[1])
    assert T.bh_fdr([]).shape == (0,)
    with pytest.raises(ValueError, match=r"\[0, 1\].*1.5"):
        T.bh_fdr([0.1, 1.5])


# ----------------------------------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------------------------------


def test_community_table_and_summary():
    g, labels = hand_graph()
    b = T.boundary_units(g, labels)
    pc = T.participation_coefficient(g, labels)
    df = T.community_table(g, labels, b, pc)
    assert list(df.columns) == ["unit", "community", "participation", "is_boundary"]
    assert df["unit"].tolist() == list(range(8)) and df["is_boundary"].dtype == bool
    np.testing.assert_allclose(df["participation"], pc)
    s = T.community_summary(labels, 1.5)
    assert s == {
        "n_units": 8,
        "n_communities": 4,
        "sizes": [3, 2, 2, 1],
        "largest": 3,
        "n_singletons": 1,
        "quality": 1.5,
    }
    with pytest.raises(ValueError, match=r"pc must have shape \(8,\)"):
        T.community_table(g, labels, b, pc[:3])


def test_coupling_table_q_and_significance():
    rows = [
        {"checkpoint": "a", "boundary": i, "p_value": p} for i, p in enumerate([0.001, 0.02, 0.04, 0.5, float("nan")])
    ] + [{"checkpoint": "b", "boundary": 0, "p_value": 0.03}]
    df = T.coupling_table(rows, q_level=0.05)
    np.testing.assert_allclose(
        df["q_value"].iloc[[0, 1, 2, 3, 5]],
        multipletests([0.001, 0.02, 0.04, 0.5, 0.03], method="fdr_bh")[1],
    )
    assert df["significant"].tolist() == [True, True, True, False, False, True]  # q(0.04) = 0.05
    by = T.coupling_table(rows, q_level=0.05, by=["checkpoint"])
    np.testing.assert_allclose(by["q_value"].iloc[:4], multipletests([0.001, 0.02, 0.04, 0.5], method="fdr_bh")[1])
    assert by["q_value"].iloc[5] == pytest.approx(0.03) and math.isnan(by["q_value"].iloc[4])
    assert not T.coupling_table(rows, q_level=0.001)["significant"].iloc[1]
    with pytest.raises(ValueError, match="p_value"):
        T.coupling_table([{"p": 0.1}])
    with pytest.raises(ValueError, match="q_level"):
        T.coupling_table(rows, q_level=0)
    assert list(T.coupling_table([]).columns) == ["p_value", "q_value", "significant"]


def test_sign_dependence():
    h = np.array([0.1, 0.2, 0.3, 0.4, 0.5, np.nan])
    rho, p = T.sign_dependence([1.0, 2.0, 4.0, 8.0, 9.0, 3.0], h)
    assert rho == pytest.approx(1.0) and p < 0.05
    rho, _ = T.sign_dependence([5.0, 4.0, 3.0, 2.0, 1.0, 0.0], h)
    assert rho == pytest.approx(-1.0)
    assert all(math.isnan(v) for v in T.sign_dependence([1.0, 2.0], [0.1, 0.2]))
    assert all(math.isnan(v) for v in T.sign_dependence([1.0, 1.0, 1.0], [0.1, 0.2, 0.3]))
    with pytest.raises(ValueError, match="equal length"):
        T.sign_dependence([1.0], [1.0, 2.0])


def test_no_warnings_on_clean_input():
    X, _ = planted(n_tokens=300, size=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = T.correlation_graph(X, top_k=5)
        labels = T.signed_leiden(g, 0.1, 0)
        T.coupling_stats(T.participation_coefficient(g, labels) + 1.0, T.boundary_units(g, labels))


# ----------------------------------------------------------------------------------------------
# pipeline helpers
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ["neighbours", "participation"])
def test_analyse_boundary(rule):
    X, truth = planted(n_tokens=800, noise=1.2)
    units, summary = T.analyse_boundary(
        X.astype(np.float32),
        top_k=10,
        resolution=[0.05, 0.5],
        seed=0,
        boundary_rule=rule,
        participation_quantile=0.9,
    )
    assert list(units.columns) == ["unit", "community", "participation", "is_boundary", "n_other_communities"]
    if rule == "neighbours":  # the rule reads back from the count
        assert (units["is_boundary"] == (units["n_other_communities"] >= 2)).all()
    assert nmi(units["community"], truth) >= 0.9
    assert summary["n_communities"] == 4 and summary["sizes"] == "30,30,30,30"
    assert summary["resolution"] == 0.05 and summary["n_tokens"] == 800
    assert summary["n_boundary"] == int(units["is_boundary"].sum())
    with pytest.raises(ValueError, match="boundary_rule must be one of.*'degree'"):
        T.analyse_boundary(X, top_k=5, boundary_rule="degree")


def test_coupling_from_tables(tmp_path):
    from resdyn.artifacts import CommunityPartitions

    d = 40
    rng = np.random.default_rng(0)
    is_b = np.zeros(d, dtype=bool)
    is_b[:10] = True
    for layer in (0, 1):
        rows = [
            pd.DataFrame(
                {
                    "unit": np.arange(d),
                    "community": 0,
                    "participation": 0.0,
                    "is_boundary": is_b,
                    "n_other_communities": 2 * is_b,
                    "layer": layer,
                    "boundary": b,
                }
            )
            for b in ("pre_attn", "pre_mlp")
        ]
        CommunityPartitions.write(pd.concat(rows, ignore_index=True), CommunityPartitions.layer_file(tmp_path, layer))
    parts = CommunityPartitions.read_folder(tmp_path)
    diag_big = np.where(is_b, 3.0, 1.0) * rng.uniform(0.9, 1.1, d)
    jac = {
        (0, "attn"): np.diag(diag_big),  # boundary units amplify
        (0, "mlp"): lambda: np.diag(rng.uniform(0.9, 1.1, d)),  # no coupling
        (1, "attn"): np.eye(d) * 2,
        (1, "mlp"): np.diag(diag_big),
    }
    spectra = pd.DataFrame({"layer": [0, 0, 1], "kind": ["attn", "mlp", "attn"], "henrici": [0.1, 0.2, 0.3]})
    df = T.coupling_from_tables(parts, jac, spectra, gain="J", q_level=0.05)
    assert df[["layer", "boundary", "s"]].values.tolist() == [
        [0, "pre_attn", 0],
        [0, "pre_mlp", 1],
        [1, "pre_attn", 2],
        [1, "pre_mlp", 3],
    ]
    assert df["significant"].tolist() == [True, False, False, True]
    assert df["effect_log_median_ratio"].iloc[0] == pytest.approx(math.log(3), abs=0.15)
    assert df["henrici"].iloc[:3].tolist() == [0.1, 0.2, 0.3] and math.isnan(df["henrici"].iloc[3])
    jmi = T.coupling_from_tables(parts, jac, spectra, gain="J_minus_I")
    assert jmi["effect_log_median_ratio"].iloc[2] == pytest.approx(0.0)  # 2I − I: all gains 1
    with pytest.raises(ValueError, match="gain must be one of"):
        T.coupling_from_tables(parts, jac, spectra, gain="JmI")
    with pytest.raises(ValueError, match=r"no mean Jacobian for sublayer \(1, 'mlp'\)"):
        T.coupling_from_tables(parts, {k: v for k, v in jac.items() if k != (1, "mlp")}, spectra)
    with pytest.raises(ValueError, match="community table lacks columns"):
        T.coupling_from_tables(parts.drop(columns="is_boundary"), jac, spectra)


# ----------------------------------------------------------------------------------------------
# layers: study A's unit (Simes over a layer's boundaries, BH over layers)
# ----------------------------------------------------------------------------------------------


def test_simes_is_the_smallest_bh_q_of_the_family():
    rng = np.random.default_rng(7)
    for k in (1, 2, 3, 7):
        for _ in range(20):
            p = rng.uniform(0, 1, k) ** 3
            assert T.simes_p(p) == pytest.approx(multipletests(p, method="fdr_bh")[1].min(), rel=1e-12)
    assert T.simes_p([0.01, 0.04]) == pytest.approx(0.02)  # min(2·0.01/1, 2·0.04/2)
    assert T.simes_p([0.03, 0.04]) == pytest.approx(0.04)
    assert T.simes_p([0.2, np.nan]) == 0.2  # one tested boundary: its own p
    assert math.isnan(T.simes_p([np.nan, np.nan]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        T.simes_p([0.5, 1.5])


def test_layer_significance_hand_built():
    # layer 0: p (0.001, 0.5) -> Simes 0.002; layer 1: (0.04, 0.03) -> 0.04; layer 2: (0.9, 0.6) -> 0.9;
    # layer 3: one boundary 0.01 (a parallel layer); layer 4: no test.
    # BH over the 4 tested layers, sorted 0.002, 0.01, 0.04, 0.9: q = 0.008, 0.02, 0.0533, 0.9
    coupling = pd.DataFrame(
        {
            "layer": [0, 0, 1, 1, 2, 2, 3, 4, 4],
            "boundary": ["pre_attn", "pre_mlp"] * 3 + ["pre_attn", "pre_attn", "pre_mlp"],
            "p_value": [0.001, 0.5, 0.04, 0.03, 0.9, 0.6, 0.01, np.nan, np.nan],
            "reason": [None] * 7 + ["need ≥ 1 boundary", "need ≥ 1 boundary"],
        }
    )
    out = T.layer_significance(coupling, q_level=0.05)
    assert list(out.columns) == list(T.LAYER_COLUMNS)
    assert out["layer"].tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(out["p_value"].to_numpy()[:4], [0.002, 0.04, 0.9, 0.01], rtol=1e-12)
    np.testing.assert_allclose(out["q_value"].to_numpy()[:4], [0.008, 0.16 / 3, 0.9, 0.02], rtol=1e-12)
    assert out["significant"].tolist() == [True, False, False, True, False]
    assert out["n_boundaries_tested"].tolist() == [2, 2, 2, 1, 0]
    assert math.isnan(out["p_value"].iloc[4]) and math.isnan(out["q_value"].iloc[4])
    assert out["reason"].iloc[4] == "no boundary of the layer was tested (need ≥ 1 boundary)"
    assert out["reason"].iloc[:4].isna().all()
    # the family is the layers: q-values are statsmodels' BH of the layer p-values
    q = multipletests(out["p_value"].to_numpy()[:4], method="fdr_bh")[1]
    np.testing.assert_allclose(out["q_value"].to_numpy()[:4], q, rtol=1e-12)
    # the boundary-level detail: BH over the 7 tested boundaries (q 0.007, 0.035, then ≥ 0.07)
    boundaries = T.coupling_table(coupling.to_dict("records"), q_level=0.05)
    assert int(boundaries["significant"].sum()) == 2 and int(out["significant"].sum()) == 2
    assert set(boundaries.loc[boundaries["significant"], "layer"]) == {0, 3}
    with pytest.raises(ValueError, match="lacks columns"):
        T.layer_significance(coupling.drop(columns="p_value"))
    assert list(T.layer_significance(coupling.iloc[:0]).columns) == list(T.LAYER_COLUMNS)


def test_layer_significance_from_coupling_of_planted_layers(tmp_path):
    """Hand-built gains: boundary units amplify in layers 0 and 2 (one boundary each), not in 1."""
    from resdyn.artifacts import CommunityPartitions

    d = 60
    rng = np.random.default_rng(3)
    is_b = np.zeros(d, dtype=bool)
    is_b[:15] = True
    parts = pd.concat(
        [
            pd.DataFrame(
                {
                    "unit": np.arange(d),
                    "community": 0,
                    "participation": 0.0,
                    "is_boundary": is_b,
                    "n_other_communities": 2 * is_b,
                    "layer": L,
                    "boundary": b,
                }
            )
            for L in range(3)
            for b in ("pre_attn", "pre_mlp")
        ]
    )
    CommunityPartitions.write(parts, CommunityPartitions.layer_file(tmp_path, 0))
    big = np.diag(np.where(is_b, 3.0, 1.0) * rng.uniform(0.9, 1.1, d))
    flat = lambda: np.diag(rng.uniform(0.9, 1.1, d))  # noqa: E731
    jac = {
        (0, "attn"): big,
        (0, "mlp"): flat(),
        (1, "attn"): flat(),
        (1, "mlp"): flat(),
        (2, "attn"): flat(),
        (2, "mlp"): big,
    }
    coupling = T.coupling_from_tables(CommunityPartitions.read_folder(tmp_path), jac, pd.DataFrame())
    layers = T.layer_significance(coupling)
    assert layers["significant"].tolist() == [True, False, True]
    assert layers["n_boundaries_tested"].tolist() == [2, 2, 2]
    counts = T.significant_counts({"final": coupling}, {"final": layers})
    row = counts.iloc[0]
    assert (row["n_significant_layers"], row["n_layers"], row["n_layers_tested"]) == (2, 3, 3)
    assert (row["n_significant_boundaries"], row["n_boundaries"]) == (2, 6)
    with pytest.raises(ValueError, match="must match"):
        T.significant_counts({"final": coupling}, {"step0": layers})
