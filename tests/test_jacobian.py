"""resdyn.study_a.jacobian: exact per-token sublayer Jacobians and their HDF5 accumulation.

Oracle: ``torch.autograd.functional.jacobian`` of HF's full-sequence decoder layer (the attention
half read out by a hook, the MLP half by substituting m_L, see tests/test_arch.py), whose
diagonal (t, t) block is the Jacobian with the other positions held fixed.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from resdyn import artifacts
from resdyn.lm import decompose, structure
from resdyn.study_a import jacobian

from helpers import sigkill
from helpers.tiny_models import (
    FAMILIES,
    LENGTH,
    PARALLEL,
    WINDOW,
    attn_half_oracle,
    call_layer,
    capture_layer_calls,
    make_model,
    mlp_half_oracle,
    sample_ids,
)

pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py

REPO = Path(__file__).resolve().parents[1]
POSITIONS = [LENGTH - 1, 4]


def hf_oracles(name: str, model, ids: torch.Tensor, layer: int) -> dict[str, torch.Tensor]:
    """Full (T, d, T, d) Jacobians of HF's attention half, MLP half and whole layer."""
    calls = capture_layer_calls(model, ids)
    hf_layer = structure.decoder_layers(model)[layer]
    states = structure.residual_states(model, ids)[0]
    h = states[layer]
    m = decompose.boundary_states(model, ids)[2 * layer + 1]

    def jac(fn, x):
        return torch.autograd.functional.jacobian(fn, x, vectorize=True)

    return {
        "attn": jac(attn_half_oracle(name, hf_layer, calls[layer]), h),
        "mlp": jac(mlp_half_oracle(name, hf_layer, calls[layer], h), m),
        "layer": jac(lambda x: call_layer(hf_layer, calls[layer], x[None])[0], h),
    }


@pytest.fixture(scope="module", params=FAMILIES)
def family_case(request):
    name = request.param
    model = make_model(name)
    ids = sample_ids()
    jacs = jacobian.sublayer_jacobians(model, ids, positions=POSITIONS)
    oracles = {layer: hf_oracles(name, model, ids, layer) for layer in range(4)}
    return name, model, ids, jacs, oracles


def test_shapes_and_dtype(family_case):
    _, _, _, jacs, _ = family_case
    assert sorted(jacs) == [(layer, kind) for layer in range(4) for kind in ("attn", "mlp")]
    for jac in jacs.values():
        assert jac.shape == (len(POSITIONS), 32, 32) and jac.dtype == torch.float32


@pytest.mark.parametrize("kind", ["attn", "mlp"])
def test_equals_autograd_diagonal_block(family_case, kind):
    _, _, _, jacs, oracles = family_case
    for layer in range(4):
        for p, t in enumerate(POSITIONS):
            expected = oracles[layer][kind][t, :, t, :]
            torch.testing.assert_close(jacs[(layer, kind)][p], expected, atol=1e-5, rtol=0)


def test_chain_rule_gives_layer_jacobian(family_case):
    """J_mlp J_attn = ∂h_{L+1}[t]/∂h_L[t] of the whole HF layer (the MLP half is per-token)."""
    _, _, _, jacs, oracles = family_case
    for layer in range(4):
        for p, t in enumerate(POSITIONS):
            product = jacs[(layer, "mlp")][p] @ jacs[(layer, "attn")][p]
            torch.testing.assert_close(product, oracles[layer]["layer"][t, :, t, :], atol=1e-5, rtol=0)


def test_reference_method_agrees(family_case):
    """Forward mode through the whole per-token function gives the same Jacobians."""
    _, model, ids, jacs, _ = family_case
    reference = jacobian.sublayer_jacobians(model, ids, positions=POSITIONS, method="jvp", chunk_size=7)
    for key, jac in jacs.items():
        torch.testing.assert_close(reference[key], jac, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def parallel_case():
    model = make_model(PARALLEL)
    ids = sample_ids()
    return model, ids, jacobian.sublayer_jacobians(model, ids, positions=POSITIONS)


def parallel_oracles(model, ids: torch.Tensor, layer: int) -> dict[str, torch.Tensor]:
    """Full (T, d, T, d) Jacobians of HF's GPT-NeoX layer and of its two branches at h_L."""
    calls = capture_layer_calls(model, ids)
    hf_layer = structure.decoder_layers(model)[layer]
    h = structure.residual_states(model, ids)[0][layer]

    def attention_branch(x):
        box = {}
        handle = hf_layer.attention.register_forward_hook(lambda _m, _a, out: box.__setitem__("a", out[0]))
        try:
            call_layer(hf_layer, calls[layer], x[None])
        finally:
            handle.remove()
        return box["a"][0]

    def jac(fn):
        return torch.autograd.functional.jacobian(fn, h, vectorize=True)

    return {
        "layer": jac(lambda x: call_layer(hf_layer, calls[layer], x[None])[0]),
        "attn_branch": jac(attention_branch),
        "mlp_branch": jac(lambda x: hf_layer.mlp(hf_layer.post_attention_layernorm(x))),
    }


def test_parallel_residual_equals_autograd(parallel_case):
    """Parallel residual: the operator I + J_A + J_F and both branch Jacobians are the diagonal
    blocks of autograd through HF's GPTNeoXLayer."""
    model, ids, jacs = parallel_case
    assert sorted(jacs) == sorted((layer, kind) for layer in range(4) for kind in jacobian.PARALLEL_KINDS)
    for layer in range(4):
        oracles = parallel_oracles(model, ids, layer)
        for kind, oracle in oracles.items():
            for p, t in enumerate(POSITIONS):
                torch.testing.assert_close(jacs[(layer, kind)][p], oracle[t, :, t, :], atol=1e-5, rtol=0)
        eye = torch.eye(32)
        torch.testing.assert_close(
            jacs[(layer, "layer")], eye + jacs[(layer, "attn_branch")] + jacs[(layer, "mlp_branch")], atol=1e-6, rtol=0
        )
        assert (jacs[(layer, "attn_branch")][0]).abs().max() > 1e-2  # both branches matter
        assert (jacs[(layer, "mlp_branch")][0]).abs().max() > 1e-2


def test_parallel_reference_method_agrees(parallel_case):
    model, ids, jacs = parallel_case
    reference = jacobian.sublayer_jacobians(model, ids, positions=POSITIONS, method="jvp", chunk_size=7)
    for key, jac in jacs.items():
        torch.testing.assert_close(reference[key], jac, atol=1e-5, rtol=0)


def test_layer_norm_jacobian_products():
    """layer_norm_right/left equal a @ J and J @ a of autograd's LayerNorm Jacobian (with bias)."""
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(6, eps=1e-3)
    with torch.no_grad():
        norm.weight.add_(torch.randn(6))
        norm.bias.add_(torch.randn(6))
    x, a, b = torch.randn(6), torch.randn(3, 6), torch.randn(6, 4)
    J = torch.autograd.functional.jacobian(norm, x)
    torch.testing.assert_close(jacobian.layer_norm_right(a, x, norm), a @ J, atol=1e-6, rtol=0)
    torch.testing.assert_close(jacobian.layer_norm_left(x, b, norm), J @ b, atol=1e-6, rtol=0)
    assert jacobian.norm_right(a, x, norm).shape == (3, 6)


def test_parallel_layer_file_schema(tmp_path):
    """Parallel layers store the operator and both branches; JacobianBlocks.read_means returns the operator."""
    model = make_model(PARALLEL)
    samples = _samples(3)
    paths = {layer: tmp_path / f"layer{layer:03d}.h5" for layer in range(4)}
    jacobian.write_layer_block(model, samples, [10, 11, 12], range(4), paths, progress=False)
    with h5py.File(paths[1], "r") as f:
        assert f.attrs["residual"] == "parallel"
        assert sorted(f) == sorted([*jacobian.PARALLEL_KINDS, "positions", "sample_ids"])
        layer_mean, a_mean, m_mean = (f[k]["mean"][()] for k in jacobian.PARALLEL_KINDS)
    np.testing.assert_allclose(layer_mean, np.eye(32) + a_mean + m_mean, atol=1e-5)
    loaders, _ = artifacts.JacobianBlocks.read_means([tmp_path])
    assert sorted(loaders) == [(layer, "layer") for layer in range(4)]
    np.testing.assert_allclose(loaders[(1, "layer")](), layer_mean)
    assert sorted(artifacts.JacobianBlocks.read_branches([tmp_path])) == sorted(
        (layer, k) for layer in range(4) for k in ("attn_branch", "mlp_branch")
    )


@pytest.mark.parametrize("name", ["mistral", "olmo3", "gemma4"])
def test_sliding_window_matters(name):
    """On a sliding layer the window changes the Jacobian, and the windowed one is the oracle's."""
    model = make_model(name)
    ids = sample_ids()
    layer = 0
    engine = jacobian.JacobianEngine(model, [layer])
    assert engine.fp32[layer].window == WINDOW
    windowed = engine.compute(ids)[(layer, "attn")][0]
    oracle = hf_oracles(name, model, ids, layer)["attn"][LENGTH - 1, :, LENGTH - 1, :]
    torch.testing.assert_close(windowed, oracle, atol=1e-5, rtol=0)
    engine.fp32[layer].window = None  # pretend the layer were full
    full = engine.compute(ids)[(layer, "attn")][0]
    assert (full - windowed).abs().max() > 1e-3


def test_kv_shared_layer_depends_on_query_only():
    """Gemma 4 KV-shared layers: keys/values come from the source layer, so J_attn is the
    oracle's (which reads HF's shared K/V) — checked above — and differs from treating the
    layer's own projections as K/V."""
    model = make_model("gemma4")
    adapters = decompose.sublayers(model)
    assert adapters[2].shares_kv and adapters[2].kv_source == 0


def test_positions_argument():
    model = make_model("llama")
    ids = sample_ids()
    default = jacobian.sublayer_jacobians(model, ids, layers=[1])
    assert default[(1, "attn")].shape == (1, 32, 32)
    every = jacobian.sublayer_jacobians(model, ids, positions="all", layers=[1])
    assert every[(1, "mlp")].shape == (LENGTH, 32, 32)
    torch.testing.assert_close(every[(1, "attn")][-1], default[(1, "attn")][0], atol=1e-6, rtol=0)
    negative = jacobian.sublayer_jacobians(model, ids, positions=[-1], layers=[1])
    assert torch.equal(negative[(1, "attn")], default[(1, "attn")])
    assert jacobian.resolve_positions(None, 5) == [4]
    assert jacobian.resolve_positions([0, -2], 5) == [0, 3]
    for bad in (5, [1, 1], "first", [1.5], []):
        with pytest.raises(ValueError):
            jacobian.resolve_positions(bad, 5)


def test_bf16_weights_give_fp32_jacobians():
    """bf16 model: Jacobians are fp32, taken on an fp32 copy (the model stays bf16), and equal
    those of an fp32 model with the same (bf16-rounded) weights at the bf16 model's states up
    to the bf16 rounding of those states."""
    model = make_model("olmo2").to(torch.bfloat16)
    ids = sample_ids()
    jacs = jacobian.sublayer_jacobians(model, ids, layers=[1])
    assert all(j.dtype == torch.float32 and torch.isfinite(j).all() for j in jacs.values())
    assert next(model.parameters()).dtype == torch.bfloat16
    upcast = jacobian.sublayer_jacobians(model.float(), ids, layers=[1])
    for key in jacs:
        torch.testing.assert_close(jacs[key], upcast[key], atol=0.05, rtol=0.05)


def test_spectral_norm_power_iteration():
    gen = torch.Generator().manual_seed(0)
    d = jacobian.EXACT_SPECTRAL_MAX_D + 88
    u, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    s = torch.linspace(0.1, 1.0, d, dtype=torch.float64)
    s[-1] = 3.0
    j = (u * s) @ v.T
    assert jacobian.spectral_norm(j[None]).item() == pytest.approx(3.0, rel=1e-12)
    small = j[:64, :64]
    assert jacobian.spectral_norm(small[None]).item() == pytest.approx(torch.linalg.svdvals(small)[0].item(), rel=1e-12)


# ----------------------------------------------------------------------------------------------
# HDF5 block writer
# ----------------------------------------------------------------------------------------------

ATTRS = {"model_id": "tiny-llama", "revision": "step0", "content_hash": "abc", "code_version": "test"}


def _samples(n: int = 5) -> np.ndarray:
    return np.stack([sample_ids(seed=10 + i).numpy() for i in range(n)])


def test_write_layer_block_schema(tmp_path):
    model = make_model("llama")
    samples = _samples()
    ids = np.arange(100, 105)
    paths = {layer: tmp_path / f"layer{layer:03d}.h5" for layer in (1, 3)}
    jacobian.write_layer_block(
        model, samples, ids, [1, 3], paths, positions=[-1, 2], store_first_n=2, checkpoint_every=2,
        attrs=ATTRS, progress=False,
    )  # fmt: skip
    per_sample = [jacobian.sublayer_jacobians(model, torch.as_tensor(s), [-1, 2], layers=[1, 3]) for s in samples]
    assert not list(tmp_path.glob(".*")), "temporary or checkpoint files left behind"
    for layer, path in paths.items():
        with h5py.File(path) as f:
            assert f.attrs["model_id"] == "tiny-llama" and f.attrs["layer"] == layer
            assert list(f.attrs["positions"]) == [LENGTH - 1, 2]
            assert list(f["sample_ids"][()]) == list(ids)
            for kind in ("attn", "mlp"):
                g = f[kind]
                stack = torch.stack([p[(layer, kind)] for p in per_sample]).double()  # (N, P, d, d)
                assert g["mean"].dtype == np.float32 and g["mean"].shape == (32, 32)
                np.testing.assert_allclose(g["mean"][()], stack.mean((0, 1)).numpy(), atol=1e-6)
                assert g["count"][()] == 5 and g["count"].attrs["n_jacobians"] == 10
                eye = torch.eye(32, dtype=torch.float64)
                np.testing.assert_allclose(
                    g["fro_minus_identity"][()], torch.linalg.matrix_norm(stack - eye), atol=1e-6
                )
                np.testing.assert_allclose(g["trace"][()], stack.diagonal(dim1=-2, dim2=-1).sum(-1), atol=1e-6)
                np.testing.assert_allclose(g["spectral_norm"][()], torch.linalg.matrix_norm(stack, ord=2), atol=1e-6)
                assert g["per_sample"].shape == (2, 2, 32, 32) and g["per_sample"].compression == "gzip"
                np.testing.assert_array_equal(g["per_sample"][()], stack[:2].float().numpy())


def test_store_dtype_float64_and_string_ids(tmp_path):
    model = make_model("gemma4")
    paths = {2: tmp_path / "layer002.h5"}
    jacobian.write_layer_block(
        model, _samples(2), ["a", "b"], [2], paths, store_dtype="float64", attrs=ATTRS, progress=False
    )
    with h5py.File(paths[2]) as f:
        assert f["attn/mean"].dtype == np.float64
        assert [s.decode() for s in f["mlp/sample_ids"][()]] == ["a", "b"]
        assert "per_sample" not in f["attn"]


def test_non_finite_jacobian_raises_and_writes_nothing(tmp_path):
    model = make_model("llama")
    with torch.no_grad():
        structure.decoder_layers(model)[1].mlp.up_proj.weight[0, 0] = float("nan")
    paths = {layer: tmp_path / f"layer{layer:03d}.h5" for layer in (0, 1)}
    with pytest.raises(FloatingPointError) as err:
        jacobian.write_layer_block(model, _samples(2), [7, 8], [0, 1], paths, attrs=ATTRS, progress=False)
    message = str(err.value)
    for needle in ("tiny-llama", "step0", "layer 1", "'mlp'", "sample id 7"):
        assert needle in message, message
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".h5" or ".h5." in p.name]


def test_bad_arguments(tmp_path):
    model = make_model("llama")
    paths = {0: tmp_path / "layer000.h5"}
    cases = [
        dict(samples=_samples(2).astype(float)),
        dict(sample_ids=[1, 1]),
        dict(layers=[0, 9], out_paths={0: paths[0], 9: tmp_path / "x.h5"}),
        dict(out_paths={}),
        dict(store_dtype="float16"),
        dict(store_first_n=3),
        dict(checkpoint_every=0),
        dict(positions=[LENGTH]),
    ]
    for override in cases:
        kwargs = dict(samples=_samples(2), sample_ids=[1, 2], layers=[0], out_paths=paths, progress=False)
        kwargs.update(override)
        with pytest.raises(ValueError):
            jacobian.write_layer_block(model, **kwargs)


_RUNNER = sigkill.RUNNER_HEADER + textwrap.dedent("""
    from helpers.tiny_models import make_model, sample_ids
    from resdyn.study_a import jacobian

    if held:
        hold.hold_at_first_save(jacobian.JacobianSums, "save", out)
    model = make_model("qwen2")
    samples = np.stack([sample_ids(seed=10 + i).numpy() for i in range(8)])
    paths = {{layer: f"{{out}}/layer{{layer:03d}}.h5" for layer in (0, 2)}}
    jacobian.write_layer_block(
        model, samples, np.arange(8), [0, 2], paths, positions=[-1, 3], store_first_n=3,
        checkpoint_every=2, attrs={{"model_id": "tiny-qwen2", "revision": "r"}}, progress=True,
    )
    """)


def _contents(folder: Path) -> dict[str, np.ndarray]:
    out = {}
    for path in sorted(folder.glob("layer*.h5")):
        with h5py.File(path) as f:
            f.visititems(
                lambda name, obj: (
                    out.__setitem__(f"{path.name}/{name}", obj[()]) if isinstance(obj, h5py.Dataset) else None
                )
            )
            out.update({f"{path.name}@{k}": v for k, v in f.attrs.items()})
    return out


def test_resume_after_sigkill_equals_uninterrupted_run(tmp_path):
    script = tmp_path / "runner.py"
    script.write_text(_RUNNER.format(tests=str(REPO / "tests")))
    resumed, reference = tmp_path / "resumed", tmp_path / "reference"
    resumed.mkdir()
    reference.mkdir()
    ref_proc = sigkill.start(script, reference, "free")  # uninterrupted, runs alongside

    proc = sigkill.start(script, resumed, "held")
    checkpoint = resumed / ".layer000.h5.partial.npz"
    sigkill.kill_once_checkpointed(proc, resumed, checkpoint)
    assert not list(resumed.glob("layer*.h5")), "killed run left outputs"

    rerun = sigkill.start(script, resumed, "free")
    _, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err[-3000:]
    assert "resuming from" in err, err[-3000:]
    assert not checkpoint.exists()
    _, ref_err = ref_proc.communicate(timeout=120)
    assert ref_proc.returncode == 0, ref_err[-3000:]

    got, expected = _contents(resumed), _contents(reference)
    assert sorted(got) == sorted(expected) and len(got) > 20
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_inconsistent_checkpoint_is_ignored(tmp_path):
    model = make_model("llama")
    paths = {0: tmp_path / "layer000.h5"}
    kwargs = dict(layers=[0], out_paths=paths, checkpoint_every=1, attrs=ATTRS, progress=False)
    jacobian.write_layer_block(model, _samples(3), [1, 2, 3], **kwargs)
    with h5py.File(paths[0]) as f:
        expected = f["attn/mean"][()]
    # A checkpoint from other samples: written by a run that is stopped after its first sample.
    checkpoint = artifacts.JacobianSums.path(paths, [0])
    original = artifacts.JacobianSums.save
    saved = []

    def save_then_stop(self, path, fingerprint):
        original(self, path, fingerprint)
        saved.append(path)
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(artifacts.JacobianSums, "save", save_then_stop)
        with pytest.raises(KeyboardInterrupt):
            jacobian.write_layer_block(model, _samples(4)[1:], [1, 2, 3], **kwargs)
    assert saved and checkpoint.exists()
    with pytest.warns(UserWarning, match="ignoring checkpoint"):
        jacobian.write_layer_block(model, _samples(3), [1, 2, 3], **kwargs)
    with h5py.File(paths[0]) as f:
        np.testing.assert_array_equal(f["attn/mean"][()], expected)
    assert not checkpoint.exists()


@pytest.mark.parametrize("name", FAMILIES)
def test_batched_engine_equals_one_sample_at_a_time(name):
    """compute_batch (one forward for B samples, GPU default) = B unbatched computes, up to the
    rounding of the batched forward; B = 1 is bit-equal."""
    model = make_model(name)
    g = torch.Generator().manual_seed(5)
    batch = torch.randint(0, model.config.vocab_size, (3, LENGTH), generator=g)
    engine = jacobian.JacobianEngine(model, [0, 2])
    together = engine.compute_batch(batch, POSITIONS)
    for b in range(3):
        alone = engine.compute(batch[b], POSITIONS)
        assert together[b].keys() == alone.keys()
        for key, jac in alone.items():
            torch.testing.assert_close(together[b][key], jac, rtol=1e-5, atol=1e-5)
    single = engine.compute_batch(batch[:1], POSITIONS)[0]
    for key, jac in engine.compute(batch[0], POSITIONS).items():
        assert torch.equal(single[key], jac)


def test_write_layer_block_batched_equals_unbatched(tmp_path):
    model = make_model("llama")
    samples = _samples()
    ids = np.arange(100, 105)
    out = {}
    for batch in (1, 4):
        paths = {layer: tmp_path / f"b{batch}" / f"layer{layer:03d}.h5" for layer in (1, 3)}
        jacobian.write_layer_block(
            model,
            samples,
            ids,
            [1, 3],
            paths,
            store_first_n=2,
            checkpoint_every=3,
            attrs=ATTRS,
            progress=False,
            batch_size=batch,
        )
        with h5py.File(paths[3]) as f:
            out[batch] = {k: f["mlp"][k][()] for k in ("mean", "trace", "spectral_norm", "per_sample")}
    for key in out[1]:
        np.testing.assert_allclose(out[4][key], out[1][key], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the one reader of the files


@pytest.fixture(scope="module")
def written_run(tmp_path_factory):
    """Two block folders (layers 0 and 1) of 4 samples, 2 positions, the first 3 kept whole."""
    root = tmp_path_factory.mktemp("jac")
    model = make_model("llama")
    for layer in (0, 1):
        folder = root / f"layers{layer:03d}-{layer:03d}"
        folder.mkdir()
        path = folder / f"layer{layer:03d}.h5"
        jacobian.write_layer_block(
            model,
            _samples(4),
            np.arange(4) * 10,
            [layer],
            {layer: path},
            positions=[-1, -2],
            store_first_n=3,
            attrs=ATTRS,
            progress=False,
        )
    return sorted(root.iterdir())


@pytest.fixture
def run_copy(written_run, tmp_path):
    import shutil

    return [Path(shutil.copytree(f, tmp_path / f.name)) for f in written_run]


def test_read_jacobians_loads_what_the_files_hold(written_run):
    jf = artifacts.JacobianBlocks.read(written_run)
    keys = [(L, k) for L in (0, 1) for k in ("attn", "mlp")]
    assert sorted(jf.means) == sorted(jf.per_sample) == keys and jf.branches == {}
    assert (jf.d, jf.n_samples_total, jf.n_stored, jf.sample_ids.tolist()) == (32, 4, 3, [0, 10, 20])
    assert jf.attrs["layer"] == 0 and jf.attrs["model_id"] == "tiny-llama"
    for L, kind in keys:
        with h5py.File(written_run[L] / f"layer{L:03d}.h5") as f:  # oracle: the datasets read directly
            mean, per = f[kind]["mean"][()], f[kind]["per_sample"][()]
        got = jf.means[(L, kind)]()
        assert got.dtype == np.float64 and np.array_equal(got, mean.astype(np.float64))
        assert np.array_equal(jf.per_sample[(L, kind)](), per.astype(np.float64).mean(axis=1))
    means, attrs = artifacts.JacobianBlocks.read_means(written_run)
    assert sorted(means) == keys and attrs == jf.attrs
    per, means, info = artifacts.JacobianBlocks.read_per_sample(written_run)
    assert info["n_bootstrap_samples"] == 3 and info["n_samples_total"] == 4 and per[(1, "mlp")]().shape == (3, 32, 32)


def _edit(path: Path, fn) -> None:
    with h5py.File(path, "r+") as f:
        fn(f)


def _set(name: str, value):
    def fn(f):
        del f[name]
        f.create_dataset(name, data=value)

    return fn


def _other_model(f):
    for kind in ("attn", "mlp"):
        _set(f"{kind}/mean", np.eye(33))(f)
        del f[kind]["per_sample"]


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda f: f.__delitem__("mlp"), r"layer001.h5: not a readable Jacobian file \(no group 'mlp'\)"),
        (lambda f: f["attn"].__delitem__("count"), r"layer001.h5: group 'attn' lacks dataset 'count'"),
        (_other_model, r"layer001.h5: attn/mean is 33×33, but .*layer000.h5: attn/mean is 32×32"),
        (_set("mlp/mean", np.zeros((32, 31))), r"layer001.h5: mlp/mean has shape \(32, 31\); expected a square"),
        (
            _set("attn/per_sample", np.zeros((3, 2, 32, 31), np.float32)),
            r"layer001.h5: attn/per_sample has shape \(3, 2, 32, 31\); expected \(n, P, 32, 32\)",
        ),
        (
            _set("attn/per_sample", np.zeros((2, 2, 32, 32), np.float32)),
            r"layer001.h5: attn holds 2 whole Jacobians of 4 samples, but .*layer000.h5: attn holds 3 of 4",
        ),
        (lambda f: f["attn"].__delitem__("per_sample"), r"layer001.h5: attn holds 0 whole Jacobians"),
        (_set("mlp/sample_ids", np.arange(4) * 7), r"layer001.h5: mlp holds 3 .* \(or other sample ids\)"),
        (_set("mlp/sample_ids", np.arange(3)), r"layer001.h5: mlp/sample_ids has shape \(3,\), but count = 4"),
        (lambda f: f.attrs.__setitem__("layer", 0), r"layer001.h5: attn: sublayer \(0, 'attn'\) appears in two files"),
        (lambda f: f.attrs.__setitem__("layer", 2), r"cover layers \[0, 2\]; expected 0..1 without gaps"),
        (lambda f: f.attrs.__delitem__("layer"), r"layer001.h5: not a readable Jacobian file"),
    ],
)
def test_read_jacobians_names_the_file_and_what_is_wrong(run_copy, edit, match):
    _edit(run_copy[1] / "layer001.h5", edit)
    with pytest.raises(ValueError, match=match):
        artifacts.JacobianBlocks.read(run_copy)


def test_non_finite_values_are_refused_when_loaded(run_copy):
    path = run_copy[1] / "layer001.h5"

    def poison(f):
        mean = f["mlp/mean"][()]
        mean[3, 4] = np.nan
        f["mlp/mean"][...] = mean
        per = f["attn/per_sample"][()]
        per[1, 0, 0, :2] = np.inf
        f["attn/per_sample"][...] = per

    _edit(path, poison)
    jf = artifacts.JacobianBlocks.read(run_copy)  # the index is fine: values are checked when read
    with pytest.raises(FloatingPointError, match=rf"{path}: mlp/mean has 1 non-finite entries"):
        jf.means[(1, "mlp")]()
    with pytest.raises(FloatingPointError, match=rf"{path}: attn/per_sample has 2 non-finite entries"):
        jf.per_sample[(1, "attn")]()
    jf.means[(1, "attn")]()  # the other groups still load


def test_not_hdf5_and_no_files(run_copy, tmp_path):
    (run_copy[1] / "layer001.h5").write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match=r"layer001.h5: not a readable Jacobian file"):
        artifacts.JacobianBlocks.read(run_copy)
    with pytest.raises(FileNotFoundError, match="no layer.*.h5 Jacobian files"):
        artifacts.JacobianBlocks.read([tmp_path / "empty"])


def test_per_sample_jacobians_needs_stored_samples(tmp_path):
    model = make_model("llama")
    jacobian.write_layer_block(
        model, _samples(2), [1, 2], [0], {0: tmp_path / "layer000.h5"}, attrs=ATTRS, progress=False
    )
    assert artifacts.JacobianBlocks.read([tmp_path]).n_stored == 0
    with pytest.raises(ValueError, match=r"layer000.h5: no per_sample dataset .* jacobian.store_first_n ≥ 2"):
        artifacts.JacobianBlocks.read_per_sample([tmp_path])


@pytest.mark.parametrize("name", FAMILIES)
def test_engine_code_avoids_the_zero_tangent_decomposition(name):
    """Forward mode through resdyn's own code never runs PyTorch's Python decompositions.

    A dual tensor times a plain tensor or a Python number (RoPE tables, the score scale) takes
    the zero-tangent path, which under vmap runs torch._refs op by op (~5x slower per op); the
    attention core's constants therefore enter jvp as primals with zero tangents
    (arch.AttentionCore). Calls made inside transformers' own modules (q/k RMSNorm, GELU) are
    outside resdyn and not counted.
    """
    import sys

    model = make_model(name)
    ids = sample_ids()
    jacobian.sublayer_jacobians(model, ids, positions=POSITIONS)  # warm-up: lazy imports
    ours: list[str] = []

    def watch(frame, event, arg):
        if event != "call" or "torch/_refs" not in frame.f_code.co_filename:
            return
        caller = frame.f_back
        while caller is not None and not any(p in caller.f_code.co_filename for p in ("/resdyn/", "/transformers/")):
            caller = caller.f_back
        if caller is not None and "/resdyn/" in caller.f_code.co_filename:
            ours.append(f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}")

    sys.setprofile(watch)
    try:
        jacs = jacobian.sublayer_jacobians(model, ids, positions=POSITIONS)
    finally:
        sys.setprofile(None)
    assert len(jacs) == 8
    assert ours == [], f"{name}: {len(ours)} decomposed ops called from resdyn, first at {sorted(set(ours))[:3]}"


NEW_FAMILIES = ["qwen3", "gemma2", "gemma3", "phi3", "granite", "smollm3"]


@pytest.mark.parametrize("name", NEW_FAMILIES)
def test_new_families_match_float64_autograd(name):
    """Qwen3, Gemma 2/3, Phi-3, Granite and SmolLM3 in float64: the engine (which differentiates fp32 copies of the
    layers) against autograd through HF's float64 decoder layer, both halves and their product,
    to 1e-5 (HF's own fp32 upcasts — Gemma's norms, the eager softmax — bound the oracle too)."""
    model = make_model(name).double()
    ids = sample_ids()
    layer = 1
    jacs = jacobian.sublayer_jacobians(model, ids, positions=POSITIONS, layers=[layer])
    oracles = hf_oracles(name, model, ids, layer)
    for p, t in enumerate(POSITIONS):
        for kind in ("attn", "mlp"):
            torch.testing.assert_close(jacs[(layer, kind)][p].double(), oracles[kind][t, :, t, :], atol=1e-5, rtol=0)
        product = (jacs[(layer, "mlp")][p] @ jacs[(layer, "attn")][p]).double()
        torch.testing.assert_close(product, oracles["layer"][t, :, t, :], atol=1e-5, rtol=0)


def test_iter_batch_frees_each_samples_jacobians_before_the_next():
    """One sample's Jacobians at a time: once the consumer drops a sample's, they are gone before
    the next sample's are computed (the device holds one sample's, not the batch's)."""
    import weakref

    model = make_model("llama")
    engine = jacobian.JacobianEngine(model, [0, 1])
    batch = torch.randint(0, model.config.vocab_size, (3, LENGTH), generator=torch.Generator().manual_seed(2))
    refs: list = []
    seen = 0
    for out in engine.iter_batch(batch, POSITIONS):
        assert refs and all(r() is None for r in refs) or seen == 0
        refs = [weakref.ref(t) for t in out.values()]
        seen += 1
        del out
    assert seen == 3


#: Tensor methods that read a value back to the host (on a GPU each waits for the device to finish).
HOST_READS = ("item", "tolist", "cpu", "__float__", "__int__", "__bool__", "__index__")


@pytest.fixture
def host_reads(monkeypatch):
    """A Counter of the host reads (:data:`HOST_READS`) made while ``counting`` is true."""
    import collections

    counts: collections.Counter = collections.Counter()
    counts.counting = False

    def wrap(name, original):
        def method(self, *args, **kwargs):
            if counts.counting:
                counts[name] += 1
            return original(self, *args, **kwargs)

        return method

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, wrap(name, getattr(torch.Tensor, name)))
    return counts


@pytest.mark.parametrize("name", ["llama", "olmo2", "gemma4", "gpt2", "gpt_neox"])
def test_the_jacobian_loop_reads_nothing_back_to_the_host(name, host_reads):
    """Every layer's and position's Jacobians are computed without one host read (norm scales,
    Gemma 4's per-layer input and the residual branches stay device tensors)."""
    model = make_model(name)
    engine = jacobian.JacobianEngine(model)
    batch = torch.stack([sample_ids(seed=3), sample_ids(seed=4)])
    host_reads.counting = True
    out = list(engine.iter_batch(batch, POSITIONS))
    host_reads.counting = False
    assert len(out) == 2 and all(torch.isfinite(j).all() for o in out for j in o.values())
    assert not host_reads, dict(host_reads)


def test_the_block_writer_reads_back_once_per_sample_and_sublayer(tmp_path, host_reads):
    """Per sample: one copy of every sublayer's finiteness flag and summaries, then each sublayer's
    float64 sum (the d × d data): 1 + K host reads for K sublayers, whatever the positions."""
    model = make_model("llama")
    paths = {layer: tmp_path / f"layer{layer:03d}.h5" for layer in (0, 1)}
    n, kinds = 3, 4
    host_reads.counting = True
    jacobian.write_layer_block(model, _samples(n), [1, 2, 3], [0, 1], paths, POSITIONS, attrs=ATTRS, progress=False)
    host_reads.counting = False
    assert dict(host_reads) == {"cpu": n * (1 + kinds)}


def test_the_gpu_tangent_chunk_covers_d_in_one_pass_at_paper_shapes():
    """Llama 3.1 8B (d 4,096, 32 heads of 128) at T = 128: one vmap pass on a GPU; the CPU's 1 GiB
    budget needs two (4,080 directions); at T = 2,048 the GPU chunk stays within its budget."""
    from types import SimpleNamespace

    from resdyn.numerics import sizes

    llama8b = SimpleNamespace(n_heads=32, head_dim=128)
    assert jacobian._attn_chunk(llama8b, 128, 4096, gpu=True) == 4096
    assert jacobian._attn_chunk(llama8b, 128, 4096, gpu=False) == 4080
    long = jacobian._attn_chunk(llama8b, 2048, 4096, gpu=True)
    assert 1 <= long < 4096 and long * sizes.attention_tangent_bytes(32, 128, 2048) <= sizes.TANGENT_BUDGET_GPU_BYTES
    assert (long + 1) * sizes.attention_tangent_bytes(32, 128, 2048) > sizes.TANGENT_BUDGET_GPU_BYTES


def test_spectral_norm_of_a_non_finite_matrix_is_nan():
    j = torch.eye(4)[None].repeat(2, 1, 1)
    j[1, 0, 1] = float("nan")
    got = jacobian.spectral_norm(j)
    assert got[0] == pytest.approx(1.0) and torch.isnan(got[1])
