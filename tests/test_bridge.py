"""resdyn.beyond.bridge: transport of readout subspaces and cut-point alignment — known answers and oracles."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import ortho_group

from resdyn.beyond import bridge
from resdyn.study_a import spectral
from resdyn.study_b import phases, readout


def _orthogonal(d: int, seed: int) -> np.ndarray:
    return ortho_group.rvs(d, random_state=seed)


# ---------------------------------------------------------------- transport_ratio


def test_transport_known_answers():
    e = np.eye(4)
    assert bridge.transport_ratio(np.eye(4), e[:, :2], e[:, :2]) == 1.0
    assert bridge.transport_ratio(np.eye(4), e[:, :2], e[:, 2:]) == 0.0
    # J maps e0 -> (e0 + e1): half of its energy lies in span(e0)
    J = np.eye(4)
    J[1, 0] = 1.0
    assert bridge.transport_ratio(J, e[:, :1], e[:, :1]) == pytest.approx(0.5, abs=1e-15)
    # a permutation maps span(e0, e1) onto span(e2, e3) exactly
    perm = e[:, [2, 3, 0, 1]]
    assert bridge.transport_ratio(perm, e[:, :2], e[:, 2:]) == 1.0
    assert bridge.transport_ratio(perm, e[:, :2], e[:, :2]) == 0.0


def test_transport_matches_explicit_projector_oracle():
    rng = np.random.default_rng(3)
    d, k = 12, 3
    J = rng.standard_normal((d, d))
    V = np.linalg.qr(rng.standard_normal((d, k)))[0]
    W = np.linalg.qr(rng.standard_normal((d, k)))[0]
    P = W @ W.T
    oracle = np.linalg.norm(P @ J @ V, "fro") ** 2 / np.linalg.norm(J @ V, "fro") ** 2
    assert bridge.transport_ratio(J, V, W) == pytest.approx(oracle, rel=1e-13)
    # depends on the spans only: rotate both bases inside their subspaces
    R1, R2 = _orthogonal(k, 1), _orthogonal(k, 2)
    assert bridge.transport_ratio(J, V @ R1, W @ R2) == pytest.approx(oracle, rel=1e-12)
    # and not on the scale of J
    assert bridge.transport_ratio(7.5 * J, V, W) == pytest.approx(oracle, rel=1e-13)


def test_transport_nan_when_nothing_is_transported():
    e = np.eye(3)
    assert np.isnan(bridge.transport_ratio(np.zeros((3, 3)), e[:, :1], e[:, :1]))


def test_transport_validation_messages():
    e = np.eye(3)
    with pytest.raises(ValueError, match="orthonormal"):
        bridge.transport_ratio(np.eye(3), 2 * e[:, :1], e[:, :1])
    with pytest.raises(ValueError, match="square"):
        bridge.transport_ratio(np.ones((3, 2)), e[:, :1], e[:, :1])
    with pytest.raises(ValueError, match="expected d = 3"):
        bridge.transport_ratio(np.eye(3), np.eye(4)[:, :1], e[:, :1])


# ---------------------------------------------------------------- Haar draws


def test_haar_subspace_is_orthonormal_and_isotropic():
    d, k = 6, 2
    rng = np.random.default_rng(0)
    draws = [bridge.haar_subspace(d, k, rng) for _ in range(4000)]
    for V in draws[:5]:
        np.testing.assert_allclose(V.T @ V, np.eye(k), atol=1e-13)
    # Haar: E[V Vᵀ] = (k/d) I. Each entry's average over 4000 draws has sd ≤ ~0.006.
    mean_proj = np.mean([V @ V.T for V in draws], axis=0)
    np.testing.assert_allclose(mean_proj, (k / d) * np.eye(d), atol=0.03)


def test_haar_subspace_seeded_and_validated():
    a = bridge.haar_subspace(5, 2, np.random.default_rng(9))
    b = bridge.haar_subspace(5, 2, np.random.default_rng(9))
    assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="k must be in"):
        bridge.haar_subspace(3, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="numpy Generator"):
        bridge.haar_subspace(3, 1, 0)


# ---------------------------------------------------------------- transport_table


def test_transport_table_exact_transport_and_null():
    """J_0 maps S_0 exactly onto S_1 → transport 1 and no random draw reaches it (p = 0)."""
    d, k = 8, 2
    Q0, Q1 = _orthogonal(d, 10), _orthogonal(d, 11)
    sig = np.array([8.0, 7, 3, 2.5, 2, 1.5, 1.2, 1])
    A0 = Q1 @ np.diag(sig) @ Q0.T  # right singular vectors: columns of Q0
    A1 = _orthogonal(d, 12) @ np.diag(sig) @ Q1.T  # right singular vectors: columns of Q1
    J0 = Q1 @ Q0.T  # rotates Q0[:, i] onto Q1[:, i]
    t = bridge.transport_table([J0, np.eye(d)], [A0, A1], k=k, n_random=30, seed=4)
    row = t.iloc[0]
    assert list(t.columns) == bridge.TRANSPORT_COLUMNS and len(t) == 1
    assert row["transport"] == pytest.approx(1.0, abs=1e-12)
    assert row["random_p"] == 0.0 and row["chance"] == k / d and row["n_random"] == 30
    assert 0.0 < row["random_mean"] < 1.0 and row["random_sd"] > 0


def test_transport_table_random_mean_is_k_over_d_for_orthogonal_J():
    """For orthogonal J and Haar V: E‖P J V‖²/‖J V‖² = tr(P E[VVᵀ])/k = k/d exactly."""
    d, k, n = 10, 3, 3000
    A = np.diag(np.arange(d, 0, -1.0))
    t = bridge.transport_table([_orthogonal(d, 5)], [A, A], k=k, n_random=n, seed=1)
    row = t.iloc[0]
    se = row["random_sd"] / np.sqrt(n)
    assert abs(row["random_mean"] - k / d) < 4 * se


def test_transport_table_deterministic_per_layer_streams():
    rng = np.random.default_rng(2)
    d = 6
    Js = [rng.standard_normal((d, d)) for _ in range(3)]
    As = [np.eye(d) + 0.5 * rng.standard_normal((d, d)) for _ in range(4)]
    a = bridge.transport_table(Js, As, k=2, n_random=5, seed=7)
    b = bridge.transport_table(Js, As, k=2, n_random=5, seed=7)
    pd.testing.assert_frame_equal(a, b)
    # layer 0's null does not depend on how many layers follow
    c = bridge.transport_table(Js[:1], As[:2], k=2, n_random=5, seed=7)
    pd.testing.assert_frame_equal(a.iloc[:1], c)
    d2 = bridge.transport_table(Js, As, k=2, n_random=5, seed=8)
    assert not np.allclose(a["random_mean"], d2["random_mean"])


# ---------------------------------------------------------------- alignment


def test_largest_change_known_answers():
    assert bridge.largest_change([0.0, 0.0, 1.0, 1.0]) == (2, 1.0)
    assert bridge.largest_change([5.0, 4.0, 1.0, 0.5]) == (2, -3.0)
    assert bridge.largest_change([0.0, 1.0, 2.0]) == (1, 1.0)  # tie: first
    assert bridge.largest_change([0.0, np.nan, 1.0, 3.0]) == (3, 2.0)
    L, delta = bridge.largest_change([1.0])
    assert L is None and np.isnan(delta)


def test_alignment_distances_and_chance():
    # 8 points; steps placed exactly at the phase boundaries b1 + 1 = 3 and b2 + 1 = 6
    at_b1 = [0, 0, 0, 1, 1, 1, 1, 1]
    at_b2 = [0, 0, 0, 0, 0, 0, 2, 2]
    t = bridge.alignment_table({"a": at_b1, "b": at_b2, "c": [0, 5, 5, 5, 5, 5, 5, 5]}, b1=2, b2=5)
    assert t["change_layer"].tolist() == [3, 6, 1]
    assert t["dist_b1"].tolist() == [0, 3, 2]
    assert t["dist_b2"].tolist() == [3, 0, 5]
    assert t["dist_nearest"].tolist() == [0, 0, 2]
    # positions 1..7, distances to {3, 6}: 2,1,0,1,1,0,1 → mean 6/7
    assert t["chance_dist_nearest"].iloc[0] == pytest.approx(6 / 7)
    assert t["n_positions"].tolist() == [7, 7, 7]


def test_alignment_without_change():
    t = bridge.alignment_table({"flat": [np.nan, np.nan]}, b1=0, b2=0, b1_found=False)
    assert t["change_layer"].isna().all() and not bool(t["b1_found"].iloc[0])


# ---------------------------------------------------------------- the pipeline's tables


def _synthetic_model(n: int = 5, d: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    jac = {}
    for L in range(n):
        for kind in ("attn", "mlp"):
            jac[(L, kind)] = np.eye(d) + 0.3 * rng.standard_normal((d, d))
    translators = [np.eye(d) + 0.5 * rng.standard_normal((d, d)) for _ in range(n)]
    return jac, translators


def test_bridge_tables_end_to_end():
    n, d, k = 5, 6, 2
    jac, translators = _synthetic_model(n, d)
    spectra, _ = spectral.spectra_table(jac)
    bottle = spectral.bottleneck_table(jac)
    rss = readout.rss_profile(translators, [2, 3])
    profile, k_phase = phases.profile_at(rss, 0.5)
    cuts = phases.cutpoints(profile, method="none").at_k(k_phase, 0.5).to_json()
    table, align = bridge.bridge_tables(jac, translators, spectra, bottle, rss, cuts, k=k, n_random=7, seed=3)

    assert table["layer"].tolist() == list(range(n))
    # transport equals the direct computation with J_L = J_mlp J_attn
    V = [readout.readout_subspace(A, k) for A in translators]
    for L in range(n - 1):
        J = jac[(L, "mlp")] @ jac[(L, "attn")]
        assert table["transport"].iloc[L] == pytest.approx(bridge.transport_ratio(J, V[L], V[L + 1]), rel=1e-12)
    assert np.isnan(table["transport"].iloc[-1]) and np.isnan(table["rss"].iloc[-1])
    np.testing.assert_allclose(table["rss"].iloc[:-1], profile)
    assert (table["rss_k"] == k_phase).all()
    assert table["phase"].iloc[:-1].tolist() == phases.phase_of_layer(n - 1, cuts["b1"], cuts["b2"]).tolist()
    assert pd.isna(table["phase"].iloc[-1])
    # profiles copied from the tables they come from
    sp = spectra.set_index(["layer", "kind"])
    assert table["henrici_mlp"].iloc[2] == sp.loc[(2, "mlp"), "henrici"]
    assert table["complex_frac_attn"].iloc[1] == sp.loc[(1, "attn"), "complex_frac_J_tol1e-06"]
    assert table["cum_erank"].tolist() == bottle.set_index("s").loc[[2 * L + 1 for L in range(n)], "erank"].tolist()
    assert set(align["profile"]) == {
        "complex_frac_attn",
        "complex_frac_mlp",
        "henrici_attn",
        "henrici_mlp",
        "cum_erank",
        "transport",
    }
    assert list(align.columns) == bridge.ALIGNMENT_COLUMNS


def test_bridge_tables_of_a_parallel_residual_model_write(tmp_path):
    """Pythia-style layers (one operator I + J_attn + J_mlp per layer): the attn/mlp profiles are
    NaN, the layer profiles are aligned instead, and both tables pass their writers."""
    from resdyn import artifacts

    n, d, k = 5, 6, 2
    rng = np.random.default_rng(1)
    jac = {(L, "layer"): np.eye(d) + 0.3 * rng.standard_normal((d, d)) for L in range(n)}
    translators = [np.eye(d) + 0.5 * rng.standard_normal((d, d)) for _ in range(n)]
    spectra, _ = spectral.spectra_table(jac)
    bottle = spectral.bottleneck_table(jac)
    rss = readout.rss_profile(translators, [2, 3])
    profile, k_phase = phases.profile_at(rss, 0.5)
    cuts = phases.cutpoints(profile, method="none").at_k(k_phase, 0.5).to_json()
    table, align = bridge.bridge_tables(jac, translators, spectra, bottle, rss, cuts, k=k, n_random=7, seed=3)
    assert table["complex_frac_attn"].isna().all() and table["henrici_layer"].notna().all()
    assert set(align["profile"]) == {"complex_frac_layer", "henrici_layer", "cum_erank", "transport"}
    assert align["delta"].notna().all()
    for L in range(n - 1):
        assert table["transport"].iloc[L] == pytest.approx(
            bridge.transport_ratio(
                jac[(L, "layer")],
                readout.readout_subspace(translators[L], k),
                readout.readout_subspace(translators[L + 1], k),
            ),
            rel=1e-12,
        )
    artifacts.BridgeTable.write(table, tmp_path / "bridge.tsv")
    artifacts.BridgeAlignment.write(align, tmp_path / "bridge_alignment.tsv")


def test_bridge_tables_refuses_mismatched_inputs():
    jac, translators = _synthetic_model(4, 6)
    spectra, _ = spectral.spectra_table(jac)
    bottle = spectral.bottleneck_table(jac)
    rss = readout.rss_profile(translators, [2])
    cuts = phases.cutpoints(phases.profile_at(rss, 0.3)[0], method="none").at_k(2, 0.3).to_json()
    with pytest.raises(ValueError, match="translators 3 layers"):
        bridge.bridge_tables(jac, translators[:3], spectra, bottle, rss, cuts, k=2)
    with pytest.raises(ValueError, match="phase dimension k = 5"):
        bridge.bridge_tables(jac, translators, spectra, bottle, rss, {**cuts, "k": 5}, k=2)
    with pytest.raises(ValueError, match="complex_tolerances"):
        bridge.bridge_tables(jac, translators, spectra, bottle, rss, cuts, k=2, complex_tol=1e-4)
