"""The writers of the artifacts layer that stream, resume or hold several files: Jacobians, activations, lens.

Each writer round-trips through its class's reader, and a corrupted file is refused (or, for a
resumable state, ignored with a warning) with a message naming the file and the fault.
"""

from __future__ import annotations

import json

import h5py
import numpy as np
import pandas as pd
import pytest

from resdyn import artifacts as A

# --------------------------------------------------------------------------------------------
# Jacobians: partial sums (resume state) and the per-layer files


def _filled_sums(n=4, p=2, d=3, first_n=2, next_index=4, seed=0) -> A.JacobianSums:
    """Sums of layer 0 (attn, mlp) and parallel layer 1, filled with random values."""
    rng = np.random.default_rng(seed)
    acc = A.JacobianSums([0, 1], n, p, d, first_n, {1: A.JacobianBlocks.PARALLEL_KINDS})
    for key in acc.sums:
        acc.sums[key] = rng.standard_normal((d, d))
        acc.first[key] = rng.standard_normal((first_n, p, d, d)).astype(np.float32)
    for key in acc.per:
        acc.per[key] = rng.standard_normal((n, p))
    acc.next_index = next_index
    return acc


def _fresh(n=4, p=2, d=3, first_n=2):
    return lambda: A.JacobianSums([0, 1], n, p, d, first_n, {1: A.JacobianBlocks.PARALLEL_KINDS})


def test_jacobian_sums_round_trip(tmp_path):
    acc = _filled_sums(next_index=2)
    path = A.JacobianSums.path({0: tmp_path / "layer000.h5", 1: tmp_path / "layer001.h5"}, [0, 1])
    assert path == tmp_path / ".layer000.h5.partial.npz"
    acc.save(path, "fp")
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary file left behind
    back = A.JacobianSums.resume(path, _fresh(), "fp", n_samples=4)
    assert back.next_index == 2 and back.kinds == acc.kinds
    for name in ("sums", "per", "first"):
        got, want = getattr(back, name), getattr(acc, name)
        assert sorted(got) == sorted(want)
        for key in want:
            assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key], equal_nan=True), key
    A.JacobianSums.remove(path)
    A.JacobianSums.remove(path)  # gone already: no error
    assert not path.exists()
    assert A.JacobianSums.resume(path, _fresh(), "fp", 4).next_index == 0  # no file: a fresh start


@pytest.mark.parametrize(
    "spoil, match",
    [
        (lambda path: path.write_bytes(b"not an npz file"), "ignoring checkpoint .*partial.npz: "),
        (lambda path: _filled_sums(next_index=2).save(path, "other"), "partial.npz: it was written for other samples"),
        (lambda path: _filled_sums(next_index=5).save(path, "fp"), r"partial.npz: next sample index 5 outside 1..4"),
        (
            lambda path: _filled_sums(next_index=2, d=4).save(path, "fp"),
            r"partial.npz: sum_0_attn: float64\(4, 4\), expected float64\(3, 3\)",
        ),
        (lambda path: np.savez(path, next_index=np.array(2), fingerprint=np.array("fp")), "partial.npz: 'sum_0_attn'"),
    ],
)
def test_jacobian_sums_that_do_not_fit_are_ignored_naming_the_file(tmp_path, spoil, match):
    path = tmp_path / ".layer000.h5.partial.npz"
    spoil(path)
    with pytest.warns(UserWarning, match=match):
        acc = A.JacobianSums.resume(path, _fresh(), "fp", n_samples=4)
    assert acc.next_index == 0 and not acc.sums[(0, "attn")].any()


def test_jacobian_layer_files_round_trip_through_the_reader(tmp_path):
    n, p, d = 4, 2, 3
    acc = _filled_sums(n, p, d)
    ids = np.array([7, 3, 5, 1])
    attrs = {"model_id": "m", "options": {"a": 1}, "sizes": [1, 2]}
    for layer in (0, 1):
        A.JacobianBlocks.write_layer(
            A.JacobianBlocks.layer_file(tmp_path, layer), layer, acc, ids, [5, 6], "float64", attrs, "llama", "exact"
        )
    assert sorted(q.name for q in tmp_path.iterdir()) == ["layer000.h5", "layer001.h5"]
    jf = A.JacobianBlocks.read([tmp_path])
    assert (jf.d, jf.n_samples_total, jf.n_stored, jf.sample_ids.tolist()) == (d, n, 2, [7, 3])
    assert sorted(jf.means) == [(0, "attn"), (0, "mlp"), (1, "layer")]
    assert sorted(jf.branches) == [(1, "attn_branch"), (1, "mlp_branch")]
    for key in jf.means:  # oracle: the mean is the sum over N·P Jacobians
        np.testing.assert_array_equal(jf.means[key](), acc.sums[key] / (n * p))
        np.testing.assert_array_equal(jf.per_sample[key](), acc.first[key].astype(np.float64).mean(axis=1))
    for key in jf.branches:
        np.testing.assert_array_equal(jf.branches[key](), acc.sums[key] / (n * p))
    assert (
        jf.attrs["options"] == '{"a": 1}' and jf.attrs["sizes"] == [1, 2] and jf.attrs["schema"] == "resdyn.jacobian/1"
    )
    with h5py.File(tmp_path / "layer001.h5") as f:
        assert f.attrs["residual"] == "parallel" and f.attrs["positions"].tolist() == [5, 6]
        np.testing.assert_array_equal(f["mlp_branch/trace"][()], acc.per[(1, "mlp_branch", "trace")])
        assert int(f["layer/count"][()]) == n and f["layer/count"].attrs["n_jacobians"] == n * p


def test_jacobian_layer_file_refuses_unfinished_sums_and_a_corrupt_file_is_named(tmp_path):
    acc = _filled_sums(next_index=3)
    path = A.JacobianBlocks.layer_file(tmp_path, 0)
    with pytest.raises(ValueError, match=r"layer000.h5: refusing to write layer 0: the sums cover 3 of 4 samples"):
        A.JacobianBlocks.write_layer(path, 0, acc, np.arange(4), [0, 1], "float32", {}, "llama", "exact")
    assert not path.exists() and not list(tmp_path.iterdir())
    acc.next_index = 4
    A.JacobianBlocks.write_layer(path, 0, acc, np.arange(4), [0, 1], "float32", {}, "llama", "exact")
    path.write_bytes(path.read_bytes()[:200])  # truncated
    with pytest.raises(ValueError, match=r"layer000.h5: not a readable Jacobian file"):
        A.JacobianBlocks.read([tmp_path])


def test_jacobian_staging_is_published_whole(tmp_path):
    out = tmp_path / "layers000-001"
    staging = A.JacobianBlocks.staging(out)
    assert staging == tmp_path / ".layers000-001.staging"
    staging.mkdir()
    (staging / "layer000.h5").write_bytes(b"new")
    out.mkdir()
    (out / "stale.h5").write_bytes(b"old")
    A.JacobianBlocks.publish(staging, out)
    assert not staging.exists() and sorted(q.name for q in out.iterdir()) == ["layer000.h5"]


# --------------------------------------------------------------------------------------------
# Activations: the in-memory and the streaming writer


def _states(n=3, n_layers=2, t=4, d=5, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 2 * n_layers + 1, t, d)).astype(np.float32)


@pytest.mark.parametrize("residual", A.Activations.RESIDUAL_KINDS)
def test_activations_write_and_stream_round_trip_the_same_files(tmp_path, residual):
    states, ids = _states(), np.array([4, 9, 2])
    attrs = {"model_id": "m", "extra": {"a": [1, 2]}}
    written = A.Activations.write(states, ids, 1, tmp_path / "a", "float32", attrs, residual)
    with A.Activations.stream(tmp_path / "b", 2, 3, 4, 5, "float32", ids, 1, attrs, residual) as put:
        for i in range(3):
            put(i, states[i])
    assert [p.name for p in written] == ["layer000.h5", "layer001.h5"]
    for folder in (tmp_path / "a", tmp_path / "b"):
        assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []  # no temporary file left
        np.testing.assert_array_equal(A.Activations.read_all_boundaries(folder), states)
        assert [(layer, p.name) for layer, p in A.Activations.layers(folder)] == [
            (0, "layer000.h5"),
            (1, "layer001.h5"),
        ]
        want = ("pre_attn",) if residual == "parallel" else ("pre_attn", "pre_mlp")
        assert A.Activations.boundaries(folder / "layer001.h5") == want
        with h5py.File(folder / "layer001.h5") as f:
            assert f["positions"][()].tolist() == [1, 2, 3, 4] and f["sample_ids"][()].tolist() == [4, 9, 2]
            assert f.attrs["extra"] == '{"a": [1, 2]}' and f.attrs["schema"] == A.Activations.SCHEMA
    for name in ("layer000.h5", "layer001.h5"):  # streaming writes the same datasets and attributes
        with h5py.File(tmp_path / "a" / name) as fa, h5py.File(tmp_path / "b" / name) as fb:
            assert sorted(fa) == sorted(fb) and dict(fa.attrs) == dict(fb.attrs)
            for key in fa:
                assert fa[key].dtype == fb[key].dtype and np.array_equal(fa[key][()], fb[key][()])


def test_activations_stream_interrupted_leaves_nothing_and_bad_files_are_named(tmp_path):
    states, ids = _states(), np.arange(3)
    with pytest.raises(KeyboardInterrupt):
        with A.Activations.stream(tmp_path, 2, 3, 4, 5, "float32", ids, 0, {}) as put:
            put(0, states[0])
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="residual='mixed': allowed are"):
        A.Activations.write(states, ids, 0, tmp_path, "float32", {}, "mixed")
    A.Activations.write(states, ids, 0, tmp_path, "float32", {})
    with h5py.File(tmp_path / "layer001.h5", "r+") as f:
        f.attrs["layer"] = 5
    with pytest.raises(ValueError, match=r"layer001.h5: holds layer 5, but it is file 1"):
        A.Activations.layers(tmp_path)
    (tmp_path / "layer001.h5").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"layer001.h5: cannot read the activation file's layer attribute"):
        A.Activations.layers(tmp_path)
    with pytest.raises(ValueError, match=r"layer001.h5: cannot read activations 'pre_attn'"):
        A.Activations.read_boundary(tmp_path / "layer001.h5", "pre_attn")


# --------------------------------------------------------------------------------------------
# Lens folder: translators, curves, config; the tuned-lens export; the training checkpoint


def test_read_translator_matrices_is_bit_equal_to_the_torch_path(tmp_path):
    """The torch-free reader (safetensors.numpy) gives exactly what torch's loader gives."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(0)
    weight = torch.randn(3, 6, 6, generator=g) * torch.logspace(-8, 3, 36).reshape(6, 6)  # many exponents
    save_file({"weight": weight, "bias": torch.randn(3, 6, generator=g)}, str(tmp_path / "translators.safetensors"))
    got = A.LensFolder.read_translator_matrices(tmp_path)
    oracle = load_file(str(tmp_path / "translators.safetensors"))["weight"].double().numpy()
    assert len(got) == 3
    for a, w in zip(got, oracle):
        assert a.dtype == np.float64
        np.testing.assert_array_equal(a, np.eye(6) + w)


def test_read_translator_matrices_names_the_file_and_what_is_wrong(tmp_path):
    from safetensors.numpy import save_file

    with pytest.raises(FileNotFoundError, match="no translators"):
        A.LensFolder.read_translator_matrices(tmp_path)
    path = tmp_path / "translators.safetensors"
    path.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        A.LensFolder.read_translator_matrices(tmp_path)
    save_file({"weight": np.zeros((2, 3, 4), np.float32)}, str(path))
    with pytest.raises(ValueError, match=r"'weight' has shape \(2, 3, 4\); expected \(n, d, d\)"):
        A.LensFolder.read_translator_matrices(tmp_path)
    save_file({"bias": np.zeros((2, 3), np.float32)}, str(path))
    with pytest.raises(ValueError, match="'weight' has shape None"):
        A.LensFolder.read_translator_matrices(tmp_path)


def _lens_config(n=3, d=4):
    return {
        "format": A.LensFolder.FORMAT,
        "model_id": "m",
        "d_model": d,
        "n_layers": n,
        "vocab_size": 11,
        "unembed_hash": "ab" * 32,
        "training": {"lr": 0.5},
        "convergence": [{"layer": 0, "converged": True}],
    }


def _lens_arrays(n=3, d=4, seed=0):
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((n, d, d)) * np.logspace(-8, 3, d * d).reshape(d, d)).astype(np.float32)
    curves = pd.DataFrame(
        {
            "step": [0, 0, 5],
            "tokens_seen": [0, 0, 640],
            "layer": [0, 1, 0],
            "split": ["heldout", "heldout", "train"],
            "kl": [1 / 3, np.pi * 1e-9, 2.0**-40 + 1.0],
        }
    )
    return weight, rng.standard_normal((n, d)).astype(np.float32), curves


def test_lens_folder_round_trip(tmp_path):
    weight, bias, curves = _lens_arrays()
    folder = A.LensFolder.write(tmp_path / "lens", weight, bias, curves, _lens_config())
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "curves.tsv", "translators.safetensors"]
    back = A.LensFolder.read(folder)
    assert back.weight.dtype == np.float32 and np.array_equal(back.weight, weight) and np.array_equal(back.bias, bias)
    pd.testing.assert_frame_equal(back.curves, curves, check_exact=True)  # 17 digits: float64 exactly
    assert back.config == _lens_config()
    mats = A.LensFolder.read_translator_matrices(folder)
    for a, w in zip(mats, weight, strict=True):
        np.testing.assert_array_equal(a, np.eye(4) + w.astype(np.float64))


def test_lens_translators_file_equals_the_torch_writer_bytes(tmp_path):
    """The numpy writer produces the bytes safetensors.torch's save_file produced before (the oracle)."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    weight, bias, curves = _lens_arrays()
    A.LensFolder.write(tmp_path / "lens", weight, bias, curves, _lens_config())
    save_file(
        {"weight": torch.from_numpy(weight), "bias": torch.from_numpy(bias)},
        str(tmp_path / "oracle"),
        metadata={"format": A.LensFolder.FORMAT},
    )
    assert (tmp_path / "lens" / "translators.safetensors").read_bytes() == (tmp_path / "oracle").read_bytes()


def _spoil_config(key, value):
    def spoil(folder):
        cfg = json.loads((folder / "config.json").read_text())
        cfg[key] = value
        (folder / "config.json").write_text(json.dumps(cfg))

    return spoil


def _nan_weight(folder):
    from safetensors.numpy import save_file

    weight, bias, _ = _lens_arrays()
    weight[1, 2, 3] = np.nan
    save_file({"weight": weight, "bias": bias}, str(folder / "translators.safetensors"))


@pytest.mark.parametrize(
    "spoil, error, match",
    [
        (lambda f: (f / "config.json").unlink(), FileNotFoundError, r"lens/config.json: no lens config"),
        (lambda f: (f / "config.json").write_text("{"), ValueError, r"lens/config.json: not valid JSON"),
        (
            _spoil_config("format", "other/1"),
            ValueError,
            r"lens/config.json: format='other/1'; allowed: 'resdyn.lens/1'",
        ),
        (
            _spoil_config("n_layers", 5),
            A.ArtifactError,
            r"lens/translators.safetensors: translators of shape \(3, 4, 4\), but config.json says n_layers=5",
        ),
        (
            lambda f: (f / "translators.safetensors").write_bytes(b"xx"),
            ValueError,
            r"lens/translators.safetensors: not a readable safetensors file",
        ),
        (_nan_weight, A.ArtifactError, r"lens/translators.safetensors: weight holds NaN/Inf"),
        (
            lambda f: (f / "curves.tsv").write_text("step\tkl\n0\t1.0\n"),
            A.ArtifactError,
            r"lens/curves.tsv: columns \['step', 'kl'\], expected \['step', 'tokens_seen', 'layer', 'split', 'kl'\]",
        ),
        (lambda f: (f / "curves.tsv").write_text(""), ValueError, r"lens/curves.tsv: not a readable curves table"),
    ],
)
def test_lens_folder_faults_are_named(tmp_path, spoil, error, match):
    weight, bias, curves = _lens_arrays()
    folder = A.LensFolder.write(tmp_path / "lens", weight, bias, curves, _lens_config())
    spoil(folder)
    with pytest.raises(error, match=match):
        A.LensFolder.read(folder)


def test_lens_folder_refuses_to_write_what_it_could_not_read(tmp_path):
    weight, bias, curves = _lens_arrays()
    with pytest.raises(A.ArtifactError, match=r"refusing to write translators of shapes \(3, 4, 4\), \(3, 3\)"):
        A.LensFolder.write(tmp_path / "lens", weight, bias[:, :3], curves, _lens_config())
    with pytest.raises(A.ArtifactError, match="refusing to write a lens with curve columns"):
        A.LensFolder.write(tmp_path / "lens", weight, bias, curves.drop(columns="split"), _lens_config())
    assert not (tmp_path / "lens").exists()


def test_tuned_lens_export_round_trip(tmp_path):
    torch = pytest.importorskip("torch")
    state = {"0.weight": torch.eye(3), "0.bias": torch.arange(3.0)}
    folder = A.LensFolder.write_tuned_lens(tmp_path / "tl", state, {"d_model": 3, "num_hidden_layers": 1})
    back = torch.load(folder / "params.pt", weights_only=True)
    assert list(back) == list(state) and all(torch.equal(back[k], v) for k, v in state.items())
    assert json.loads((folder / "config.json").read_text()) == {"d_model": 3, "num_hidden_layers": 1}
    first = (folder / "params.pt").read_bytes()  # the same state gives the same bytes (no temporary name inside)
    A.LensFolder.write_tuned_lens(tmp_path / "tl", state, {"d_model": 3, "num_hidden_layers": 1})
    assert (folder / "params.pt").read_bytes() == first


def test_lens_checkpoint_round_trip_and_foreign_files_are_ignored_naming_the_file(tmp_path):
    torch = pytest.importorskip("torch")
    path = A.LensCheckpoint.path(tmp_path / "lens")
    assert path == tmp_path / ".lens.partial.pt"
    assert A.LensCheckpoint.load(path, "k") is None  # no file: a fresh start, no warning
    state = {"weight": torch.randn(2, 3, 3), "step": 7, "rows": [(0, 1, "train", 0.5)], "train_kl": None}
    A.LensCheckpoint.save(path, "k", state)
    back = A.LensCheckpoint.load(path, "k")
    assert back["format"] == A.LensCheckpoint.FORMAT and back["key"] == "k" and back["step"] == 7
    assert torch.equal(back["weight"], state["weight"]) and back["rows"] == [(0, 1, "train", 0.5)]
    with pytest.warns(UserWarning, match=r"ignoring lens checkpoint .*\.lens\.partial\.pt: it was written for another"):
        assert A.LensCheckpoint.load(path, "other key") is None
    path.write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match=r"ignoring lens checkpoint .*\.lens\.partial\.pt: "):
        assert A.LensCheckpoint.load(path, "k") is None
    A.LensCheckpoint.remove(path)
    A.LensCheckpoint.remove(path)
    assert not path.exists()


# --------------------------------------------------------------------------------------------
# Figures: inputs read by their classes, the PNG + PDF pair, the render cache


def test_every_figure_input_is_read_by_one_artifact_class():
    from resdyn.plots import catalogue

    for spec in catalogue.FIGURES:
        for template in spec.inputs:
            cls = A.by_relpath(template)
            assert cls.relpath == template and hasattr(cls, "read"), (spec.name, template)
    with pytest.raises(ValueError, match=r"no artifact class has the path 'results/x.tsv'"):
        A.by_relpath("results/x.tsv")


def test_figure_inputs_are_validated_naming_the_file(tmp_path):
    from resdyn.plots import render

    path = tmp_path / "bottleneck.tsv"
    pd.DataFrame({"s": [0], "erank": [1.0]}).to_csv(path, sep="\t", index=False)
    with pytest.raises(A.ArtifactError, match=r"bottleneck.tsv: lacks column\(s\) \['layer', 'kind'"):
        render.load(path, "results/{model}/{ckpt}/bottleneck.tsv")
    (tmp_path / "phases.json").write_text("[1, 2]")
    with pytest.raises(A.ArtifactError, match=r"phases.json: expected a JSON object of phase cut points, got list"):
        render.load(tmp_path / "phases.json", "results/{model}/{ckpt}/phases.json")
    arrays = {
        "L000_attn": {
            "eigenvalues": np.array([1 + 1j]),
            "singular_values": np.ones(1),
            "singular_values_JmI": np.zeros(1),
        }
    }
    A.SpectraArrays.write(arrays, tmp_path / "spectra.h5", {"rule": "spectra"})
    got = render.load(tmp_path / "spectra.h5", "results/{model}/{ckpt}/spectra.h5")
    assert sorted(got) == ["L000_attn"] and np.array_equal(got["L000_attn"]["eigenvalues"], [1 + 1j])


def _figure():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2))
    fig.add_subplot().plot([0, 1], [1, 0])
    return fig


def test_figure_write_both_formats_with_metadata(tmp_path):
    from PIL import Image

    paths = {"png": tmp_path / "f.png", "pdf": tmp_path / "f.pdf"}
    A.Figure.write(_figure(), paths, 40, {"png": {"resdyn_provenance": '{"a": 1}'}, "pdf": {"Subject": "s-meta"}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.pdf", "f.png"]
    assert Image.open(paths["png"]).text["resdyn_provenance"] == '{"a": 1}'
    assert paths["pdf"].read_bytes().startswith(b"%PDF") and b"s-meta" in paths["pdf"].read_bytes()
    with pytest.raises(ValueError, match=r"figure formats \['svg'\] not supported"):
        A.Figure.write(_figure(), {"svg": tmp_path / "f.svg"}, 40)
    with pytest.raises(ValueError, match="share one file"):
        A.Figure.write(_figure(), {"png": tmp_path / "g.x", "pdf": tmp_path / "g.x"}, 40)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.pdf", "f.png"]


def test_figure_pdf_keeps_the_png_layout_in_one_draw(tmp_path, monkeypatch):
    """The PDF of a constrained-layout figure: one draw (no layout pass), the PNG's axes positions,
    the same bytes as a PDF saved after the PNG with the layout frozen by matplotlib's own "none"
    placeholder engine (the oracle), and the figure's engine restored afterwards."""
    from matplotlib.figure import Figure
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    def constrained():
        fig = Figure(figsize=(3, 2), layout="constrained")
        for ax in fig.subplots(1, 2):
            ax.plot([0, 1], [1, 0])
            ax.set_title("a title", fontsize=12)
            ax.set_xlabel("x label")
        return fig

    oracle = constrained()
    oracle.savefig(tmp_path / "o.png", dpi=40)
    oracle.set_layout_engine("none")
    meta = {"Subject": "s", "CreationDate": None}  # no clock in the bytes
    oracle.savefig(tmp_path / "o.pdf", format="pdf", metadata=meta)
    fig = constrained()
    draws = []
    original = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, r: (draws.append(type(r).__name__), original(self, r))[1])
    A.Figure.write(fig, {"png": tmp_path / "f.png", "pdf": tmp_path / "f.pdf"}, 40, {"pdf": meta})
    # PNG: the layout's draw and its own; PDF (MixedModeRenderer): its own draw only
    assert draws == ["RendererAgg", "RendererAgg", "MixedModeRenderer"]
    assert (tmp_path / "f.pdf").read_bytes() == (tmp_path / "o.pdf").read_bytes()
    assert [ax.get_position().bounds for ax in fig.axes] == [ax.get_position().bounds for ax in oracle.axes]
    assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)


def test_figure_cache_round_trip_and_tampered_entry(tmp_path):
    cache = A.FigureCache(tmp_path / "figures" / ".cache")
    outs = [tmp_path / "figures" / "m" / "f.png", tmp_path / "figures" / "m" / "f.pdf"]
    outs[0].parent.mkdir(parents=True)
    for o in outs:
        o.write_bytes(b"drawn " + o.suffix.encode())
    assert not cache.restore(outs, "a" * 64)  # empty cache
    cache.store(outs, "a" * 64)
    assert cache.entry(outs[0], "a" * 64) == tmp_path / "figures" / ".cache" / "m" / f"f.{'a' * 16}.png"
    for o in outs:
        o.unlink()
    assert cache.restore(outs, "a" * 64) and outs[0].read_bytes() == b"drawn .png"
    cache.store(outs, "b" * 64)  # a new key replaces the file's old entries
    assert sorted(p.name for p in cache.folder.rglob("f.*")) == sorted(
        [f"f.{'b' * 16}.png", f"f.{'b' * 16}.png.sha256", f"f.{'b' * 16}.pdf", f"f.{'b' * 16}.pdf.sha256"]
    )
    entry = cache.entry(outs[1], "b" * 64)
    entry.write_bytes(b"tampered")
    for o in outs:
        o.unlink()
    assert not cache.restore(outs, "b" * 64) and not any(o.exists() for o in outs)  # nothing written
