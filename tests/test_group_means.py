"""Group means in the Jacobian pass and the delete-one-group jackknife built on them.

Oracles: the per-sample Jacobians of the same run (store_first_n = N), averaged by hand over each
group; :func:`resdyn.numerics.resampling.group_jackknife` applied to the stored group means.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from resdyn import artifacts
from resdyn.beyond import bootstrap
from resdyn.numerics.resampling import group_jackknife, jackknife_interval
from resdyn.pipeline import config as rconfig
from resdyn.study_a import jacobian, spectral

from helpers.tiny_models import make_model, sample_ids

pytestmark = pytest.mark.usefixtures("single_thread")

ATTRS = {"model_id": "tiny-llama", "revision": "step0", "content_hash": "abc", "code_version": "test"}
N, B = 6, 3


def samples(n: int = N) -> np.ndarray:
    return np.stack([sample_ids(seed=30 + i).numpy() for i in range(n)])


def run(folder, n_groups: int = B, **kwargs) -> dict[int, object]:
    model = make_model("llama")
    paths = {layer: folder / f"layer{layer:03d}.h5" for layer in (0, 1)}
    folder.mkdir(exist_ok=True)
    jacobian.write_layer_block(
        model, samples(), np.arange(N), [0, 1], paths, store_first_n=N, n_groups=n_groups, progress=False,
        attrs=ATTRS, **kwargs,
    )  # fmt: skip
    return paths


def test_group_means_are_the_means_of_their_samples(tmp_path):
    paths = run(tmp_path / "a", checkpoint_every=2)
    for path in paths.values():
        with h5py.File(path) as f:
            for kind in ("attn", "mlp"):
                per = f[kind]["per_sample"][()].astype(np.float64).mean(axis=1)  # (N, d, d)
                groups = f[kind]["group_means"][()]
                assert groups.shape == (B, 32, 32) and f[kind]["group_means"].attrs["group_size"] == N // B
                by_hand = per.reshape(B, N // B, 32, 32).mean(axis=1)
                np.testing.assert_allclose(groups, by_hand, atol=1e-6)
                np.testing.assert_allclose(groups.mean(axis=0), f[kind]["mean"][()], atol=1e-6)
    files = artifacts.JacobianBlocks.read([tmp_path / "a"])
    assert files.n_groups == B and sorted(files.group_means) == sorted(files.means)


def test_a_resumed_run_keeps_its_group_means(tmp_path):
    """Stopped after its first checkpoint (mid-group: groups of 2, checkpoints every 3), resumed,
    the files equal an uninterrupted run's."""
    reference = run(tmp_path / "ref", checkpoint_every=3)
    original = artifacts.JacobianSums.save

    def save_then_stop(self, path, fingerprint):
        original(self, path, fingerprint)
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(artifacts.JacobianSums, "save", save_then_stop)
        with pytest.raises(KeyboardInterrupt):
            run(tmp_path / "resumed", checkpoint_every=3)
    assert list((tmp_path / "resumed").glob(".*partial.npz"))
    resumed = run(tmp_path / "resumed", checkpoint_every=3)
    for layer in reference:
        with h5py.File(reference[layer]) as f, h5py.File(resumed[layer]) as g:
            np.testing.assert_array_equal(f["mlp/group_means"][()], g["mlp/group_means"][()])


def test_the_bootstrap_table_is_the_group_jackknife(tmp_path):
    run(tmp_path / "a")
    files = artifacts.JacobianBlocks.read([tmp_path / "a"])
    spectra, _ = spectral.spectra_table(files.means, noise=spectral.noise_samples(files))
    table, reps = bootstrap.jacobian_bootstrap_files([tmp_path / "a"], spectra=spectra)
    g = files.group_means[(1, "mlp")]()
    oracle = group_jackknife(spectral.henrici_departure, g)
    row = table[(table["metric"] == "henrici") & (table["layer"] == 1) & (table["kind"] == "mlp")].iloc[0]
    assert row["interval"] == "jackknife" and row["n_bootstrap_samples"] == N and row["n_resamples"] == B
    assert row["estimate"] == pytest.approx(oracle.estimate, rel=1e-9)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((max(0.0, oracle.low), oracle.high), rel=1e-9)
    assert "jackknife over 3 groups of 2 samples" in row["note"]
    # the full-depth rank: the same B replicates, each from the delete-one-group means of every sublayer
    erank = table[table["metric"] == "cum_erank_full_depth"].iloc[0]
    values = reps[reps["metric"] == "cum_erank_full_depth"]["value"].to_numpy()
    assert len(values) == B
    _, low, high = jackknife_interval(values, erank["estimate"], 0.95)
    assert (erank["ci_low"], erank["ci_high"]) == pytest.approx((max(1.0, low), min(32.0, high)))
    chain = [files.means[k]() for k in sorted(files.means, key=lambda k: spectral.sublayer_index(*k))]
    assert erank["estimate_all_samples"] == pytest.approx(spectral.cumulative_effective_rank(chain)[-1], rel=1e-12)
    # the beyond-noise share uses the spectra table's τ: the two tables agree on the estimate
    share = table[table["metric"] == "complex_fraction_beyond_noise"].sort_values("s")
    np.testing.assert_array_equal(share["estimate"].to_numpy(), spectra["complex_frac_beyond_noise"].to_numpy())
    # estimate_all_samples: of the stored all-N means (estimate: of the stored group means' average)
    cum = table[table["metric"] == "cum_erank"].sort_values("s")["estimate_all_samples"].to_numpy()
    np.testing.assert_allclose(cum, spectral.cumulative_effective_rank(chain), rtol=1e-12)


def test_without_groups_the_bootstrap_resamples_the_first_n(tmp_path):
    run(tmp_path / "a", n_groups=0)
    table, _ = bootstrap.jacobian_bootstrap_files([tmp_path / "a"], n_resamples=5)
    assert set(table[table["bootstrapped"]]["interval"]) == {"percentile"}


def test_spectra_noise_comes_from_the_groups(tmp_path):
    run(tmp_path / "a")
    files = artifacts.JacobianBlocks.read([tmp_path / "a"])
    noise = spectral.noise_samples(files)
    assert noise.n_total is None and noise.samples is files.group_means


@pytest.mark.parametrize(
    "n_groups,message",
    [(4, "does not divide samples.n=6"), (6, "makes groups of 1 sample"), (7, "does not divide")],
)
def test_group_counts_that_do_not_fit_are_one_line(n_groups, message):
    cfg = {"models": {"m": {}}, "samples": {"n": 6}, "jacobian": {"n_groups": n_groups}}
    errors = rconfig._group_errors(cfg)
    assert len(errors) == 1 and "jacobian.n_groups" in errors[0] and message in errors[0]
    assert rconfig._group_errors({**cfg, "jacobian": {"n_groups": 3}}) == []


def test_write_layer_block_refuses_unequal_groups(tmp_path):
    with pytest.raises(ValueError, match="n_groups=4: must be 0 or divide the 6 samples"):
        run(tmp_path / "a", n_groups=4)


def test_a_file_with_broken_group_means_is_refused(tmp_path):
    paths = run(tmp_path / "a")
    with h5py.File(paths[1], "r+") as f:
        del f["mlp/group_means"]
        f["mlp"].create_dataset("group_means", data=np.zeros((4, 32, 32), np.float32))
    with pytest.raises(ValueError, match="group_means has shape"):
        artifacts.JacobianBlocks.read([tmp_path / "a"])


def test_float16_group_means_store_deviations_and_read_back_the_means(tmp_path):
    """float16 keeps G_g − J̄ (attr offset = mean): the means read back within half-precision rounding
    of the deviations (relative to the spread between groups, not to J), and the jackknife agrees."""
    run(tmp_path / "f32")
    run(tmp_path / "f16", group_dtype="float16")
    a, b = (artifacts.JacobianBlocks.read([tmp_path / x]) for x in ("f32", "f16"))
    with h5py.File(tmp_path / "f16" / "layer001.h5") as f:
        assert f["mlp/group_means"].dtype == np.float16 and f["mlp/group_means"].attrs["offset"] == "mean"
    for key in a.group_means:
        g32, g16 = a.group_means[key](), b.group_means[key]()
        spread = np.abs(g32 - g32.mean(axis=0)).max()
        assert 0 < np.abs(g16 - g32).max() <= 2**-10 * spread + 1e-7  # fp16: 11 significant bits
    ja = bootstrap.jacobian_bootstrap_files([tmp_path / "f32"])[0].set_index(["metric", "layer", "kind", "s"])
    jb = bootstrap.jacobian_bootstrap_files([tmp_path / "f16"])[0].set_index(["metric", "layer", "kind", "s"])
    henrici = [k for k in ja.index if k[0] == "henrici"]
    for col in ("ci_low", "ci_high"):
        np.testing.assert_allclose(jb.loc[henrici, col], ja.loc[henrici, col], rtol=1e-2, atol=1e-6)


def test_float16_group_means_halve_their_disk_in_the_plan():
    from resdyn.cluster import cost

    s = cost.Shape(n_layers=2, d=1024, n_heads=8, n_kv_heads=8, d_ff=4096, vocab=1000)
    cfg = {"samples": {"n": 40, "length": 64}, "jacobian": {"positions": "last", "store_dtype": "float32"}}
    base = {"store_first_n": 0, "n_groups": 20}
    size = {
        dt: cost.cost_jacobians({**cfg, "jacobian": {**cfg["jacobian"], **base, "group_dtype": dt}}, s, [0], False)
        for dt in (None, "float16")
    }
    groups32 = size[None].disk_bytes - 2 * 4.0 * 1024**2  # two kinds' means
    groups16 = size["float16"].disk_bytes - 2 * 4.0 * 1024**2
    assert groups16 == pytest.approx(groups32 / 2)


def test_the_first_n_bootstrap_is_the_second_method_beside_the_jackknife(tmp_path):
    """With groups: bootstrap_first_n.tsv equals the per-sample bootstrap of the same files without
    their groups, every row labelled; without groups, or switched off: one row saying why."""
    run(tmp_path / "a")
    files = artifacts.JacobianBlocks.read([tmp_path / "a"])
    spectra, _ = spectral.spectra_table(files.means, noise=spectral.noise_samples(files))
    second = bootstrap.first_n_bootstrap_files([tmp_path / "a"], n_resamples=5, spectra=spectra)
    direct = bootstrap.jacobian_bootstrap_files([tmp_path / "a"], n_resamples=5, spectra=spectra, groups=False)[0]
    direct = direct[direct["bootstrapped"]].reset_index(drop=True)
    assert len(second) == len(direct) > 0 and set(second["interval"]) == {"percentile"}
    np.testing.assert_array_equal(second["ci_low"].to_numpy(), direct["ci_low"].to_numpy())
    assert all(n.startswith(bootstrap.FIRST_N_NOTE) for n in second["note"])
    artifacts.BootstrapFirstNTable.write(second, tmp_path / "b.tsv")
    off = bootstrap.first_n_bootstrap_files([tmp_path / "a"], enabled=False)
    assert len(off) == 1 and off["reason"][0] == "bootstrap.first_n is false"
    run(tmp_path / "none", n_groups=0)
    none = bootstrap.first_n_bootstrap_files([tmp_path / "none"])
    assert len(none) == 1 and "bootstrap.tsv is this method" in none["reason"][0]
    artifacts.BootstrapFirstNTable.write(none, tmp_path / "c.tsv")
