"""Oracles for resdyn.study_a.partitions: NMI and adjusted Rand on hand-worked contingency tables,
closed forms (identity, relabelling, the permutation expectation of ARI) and igraph's
compare_communities as an independent implementation; the partition_similarity table."""

from __future__ import annotations

import itertools
import math

import igraph as ig
import numpy as np
import pandas as pd
import pytest

from resdyn.study_a import partitions as P


def igraph_index(a, b, method: str) -> float:
    return float(ig.compare_communities(list(map(int, a)), list(map(int, b)), method=method))


def test_worked_contingency_table():
    """U = {0,1,2 | 3,4,5}, V = {0,1 | 2,3 | 4,5}: n_ij = [[2, 1, 0], [0, 1, 2]], N = 6.

    ARI: Σ C(n_ij, 2) = 2, Σ C(a_i, 2) = 6, Σ C(b_j, 2) = 3, C(6, 2) = 15, E = 6·3/15 = 1.2,
    max = 4.5: ARI = 0.8 / 3.3 = 8/33.
    NMI: I = 2·(2/6) log(6·2/(3·2)) + 2·(1/6) log(6/(3·2)) = (2/3) log 2, H(U) = log 2,
    H(V) = log 3: NMI = (4/3) log 2 / log 6.
    """
    u, v = [0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 2, 2]
    np.testing.assert_array_equal(P.contingency(u, v), [[2, 1, 0], [0, 1, 2]])
    assert P.adjusted_rand_index(u, v) == pytest.approx(8 / 33, rel=1e-14)
    assert P.normalized_mutual_information(u, v) == pytest.approx(4 / 3 * math.log(2) / math.log(6), rel=1e-14)
    # symmetric in its arguments
    assert P.adjusted_rand_index(v, u) == pytest.approx(8 / 33, rel=1e-14)


def test_identical_and_relabelled_partitions_give_one():
    u = np.array([0, 0, 1, 1, 1, 2, 3, 3])
    relabel = np.array([7, 3, 11, 5])[u]  # a bijection of the labels
    for v in (u, relabel):
        assert P.normalized_mutual_information(u, v) == pytest.approx(1.0, rel=1e-14)
        assert P.adjusted_rand_index(u, v) == pytest.approx(1.0, rel=1e-14)
    # degenerate: both one community, both all singletons
    for w in (np.zeros(5, int), np.arange(5)):
        assert P.normalized_mutual_information(w, w) == 1.0 and P.adjusted_rand_index(w, w) == 1.0
    # one community vs two: no information shared, ARI 0
    assert P.normalized_mutual_information([0, 0, 0, 0], [0, 0, 1, 1]) == 0.0
    assert P.adjusted_rand_index([0, 0, 0, 0], [0, 0, 1, 1]) == pytest.approx(0.0, abs=1e-15)


def test_ari_expectation_is_zero_over_all_relabellings():
    """Hubert–Arabie: E[index] is taken over random labellings with the cluster sizes fixed, so the
    mean ARI over every permutation of one partition's assignment is exactly 0."""
    u = np.array([0, 0, 0, 1, 1, 2, 2])
    v = np.array([0, 0, 1, 1, 1, 1, 2])
    aris = [P.adjusted_rand_index(u, v[list(perm)]) for perm in itertools.permutations(range(7))]
    assert np.mean(aris) == pytest.approx(0.0, abs=1e-12)
    # independent random partitions of many units: both indices near 0
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 4, 4000), rng.integers(0, 4, 4000)
    assert abs(P.adjusted_rand_index(a, b)) < 0.01 and P.normalized_mutual_information(a, b) < 0.01


@pytest.mark.parametrize("seed", range(5))
def test_matches_igraph(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 200))
    a = rng.integers(0, int(rng.integers(1, 8)), n)
    b = np.where(rng.uniform(size=n) < 0.6, a, rng.integers(0, 6, n))  # correlated with a
    assert P.normalized_mutual_information(a, b) == pytest.approx(igraph_index(a, b, "nmi"), abs=1e-12)
    expected = igraph_index(a, b, "adjusted_rand")
    if math.isnan(expected):  # igraph leaves the degenerate identical trivial case undefined; we say 1
        assert P.adjusted_rand_index(a, b) == 1.0
    else:
        assert P.adjusted_rand_index(a, b) == pytest.approx(expected, abs=1e-12)


def test_validation():
    with pytest.raises(ValueError, match="equal length"):
        P.adjusted_rand_index([0, 1], [0, 1, 2])
    with pytest.raises(ValueError, match="empty"):
        P.normalized_mutual_information([], [])


def communities(labels: dict[tuple[int, str], list[int]]) -> pd.DataFrame:
    return pd.concat(
        [
            pd.DataFrame({"unit": np.arange(len(lab)), "community": lab, "layer": layer, "boundary": boundary})
            for (layer, boundary), lab in labels.items()
        ],
        ignore_index=True,
    )


def summary(mods: dict[tuple[int, str], float]) -> pd.DataFrame:
    return pd.DataFrame([{"layer": k[0], "boundary": k[1], "modularity": m} for k, m in mods.items()])


def test_partition_similarity_table():
    keys = [(0, "pre_attn"), (0, "pre_mlp")]
    first = {keys[0]: [0, 0, 0, 1, 1, 1], keys[1]: [0, 0, 1, 1, 2, 2]}
    mid = {keys[0]: [1, 1, 1, 0, 0, 0], keys[1]: [0, 0, 0, 1, 1, 1]}
    final = {keys[0]: [0, 0, 1, 1, 2, 2], keys[1]: [0, 0, 0, 1, 1, 1]}
    parts = {"step0": communities(first), "mid": communities(mid), "final": communities(final)}
    sums = {
        "step0": summary({keys[0]: 0.1, keys[1]: 0.2}),
        "mid": summary({keys[0]: 0.3, keys[1]: 0.4}),
        "final": summary({keys[0]: 0.5, keys[1]: 0.6}),
    }
    out = P.partition_similarity(parts, sums)
    assert list(out.columns) == list(P.SIMILARITY_COLUMNS) and len(out) == 3 * 2 * 2
    by = out.set_index(["ckpt", "layer", "boundary", "reference"])
    row = by.loc[("step0", 0, "pre_attn", "final")]
    assert row["reference_ckpt"] == "final"
    assert row["ari"] == pytest.approx(8 / 33) and row["nmi"] == pytest.approx(4 / 3 * math.log(2) / math.log(6))
    assert row["modularity"] == 0.1
    assert by.loc[("mid", 0, "pre_attn", "first"), "ari"] == pytest.approx(1.0)  # relabelled
    assert by.loc[("final", 0, "pre_mlp", "first"), "ari"] == pytest.approx(8 / 33)  # symmetric
    assert by.loc[("final", 0, "pre_mlp", "final"), ["nmi", "ari"]].tolist() == [1.0, 1.0]  # itself
    assert by.loc[("step0", 0, "pre_attn", "first"), "reference_ckpt"] == "step0"
    assert out["reason"].isna().all()


def test_partition_similarity_missing_reference_and_unit_mismatch_give_reasons():
    k = (0, "pre_attn")
    parts = {
        "step0": communities({k: [0, 1, 1]}),
        "final": communities({k: [0, 0, 1, 1], (1, "pre_attn"): [0, 0, 1, 1]}),
    }
    sums = {"step0": summary({k: 0.1}), "final": summary({k: 0.2, (1, "pre_attn"): 0.3})}
    out = P.partition_similarity(parts, sums).set_index(["ckpt", "layer", "reference"])
    assert "units differ: 3 in 'step0', 4 in 'final'" in out.loc[("step0", 0, "final"), "reason"]
    assert math.isnan(out.loc[("step0", 0, "final"), "nmi"])
    assert out.loc[("final", 1, "first"), "reason"] == "checkpoint 'step0' has no partition of layer 1 pre_attn"
    assert out.loc[("final", 1, "final"), "nmi"] == 1.0
    with pytest.raises(ValueError, match="must match"):
        P.partition_similarity(parts, {"step0": sums["step0"]})
    with pytest.raises(ValueError, match="lack columns"):
        P.partition_similarity({"a": parts["step0"].drop(columns="community")}, {"a": sums["step0"]})


def test_nmi_null_matches_full_enumeration():
    """On 7 units every permutation can be enumerated: the exact p-value is the share of all 5040
    relabellings whose NMI reaches the observed one; 4000 random draws land within 4 binomial sd."""
    u, v = np.array([0, 0, 0, 1, 1, 2, 2]), np.array([0, 0, 1, 1, 1, 2, 2])
    obs = P.normalized_mutual_information(u, v)
    every = np.array([P.normalized_mutual_information(u[list(p)], v) for p in itertools.permutations(range(7))])
    exact = float(np.mean(every >= obs - 1e-12))
    q, p = P.nmi_permutation_null(u, v, 4000, np.random.default_rng(3))
    sd = math.sqrt(exact * (1 - exact) / 4000)
    assert abs(p - exact) < 4 * sd + 1 / 4001
    assert q == pytest.approx(np.quantile(every, 0.95), abs=0.15)


def test_nmi_above_null_where_planted_and_not_where_independent():
    """Planted: the final partition is step 0's with 10 % of 200 units moved: NMI far above the null,
    p at its floor 1/(1 + n). Not planted: a crossed design (every community of v holds the same
    number of each u community) has I(U; V) = 0 exactly, so every permutation reaches it: p = 1."""
    rng = np.random.default_rng(0)
    u = np.repeat(np.arange(5), 40)
    v = u.copy()
    moved = rng.choice(200, 20, replace=False)
    v[moved] = rng.integers(0, 5, 20)
    q, p = P.nmi_permutation_null(u, v, 99, np.random.default_rng(1))
    assert P.normalized_mutual_information(u, v) > 0.7 > q and p == pytest.approx(1 / 100)
    crossed = np.tile(np.arange(4), 50)  # u's blocks of 40 each hold 10 of every crossed label
    assert P.normalized_mutual_information(u, crossed) == pytest.approx(0.0, abs=1e-12)
    q, p = P.nmi_permutation_null(u, crossed, 99, np.random.default_rng(1))
    assert p == 1.0 and q > 0.0
    with pytest.raises(ValueError, match="n_permutations"):
        P.nmi_permutation_null(u, v, 0, rng)
