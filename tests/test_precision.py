"""fp32 numerics pinned at a job's start (resdyn.numerics.precision), recorded in provenance and in
the resume checkpoints, and the generic path's placement of activations on each layer's device.

No GPU here: the GPU side is mocked (torch.cuda's device queries, the numerics record a checkpoint
was written under); the precision settings themselves are real torch state, restored after each test.
"""

from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from resdyn import artifacts
from resdyn.io import resume_mismatch
from resdyn.lm import decompose, generic
from resdyn.numerics import precision
from resdyn.study_a import jacobian
from resdyn.study_b import lens as L

from helpers.lens_models import PINNED_RESUME, build, synthetic_batches
from helpers.tiny_models import make_model, sample_ids

pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py

REPO = Path(__file__).resolve().parents[1]
GPU_SCRIPTS = ("jacobians", "activations", "lens", "lens_metrics", "causal")


@pytest.fixture(autouse=True)
def restore_precision():
    """pin_ieee changes process-wide torch state: put it back for the other tests."""
    before = precision.fp32_precision()
    yield
    precision.set_fp32_precision(before)
    assert precision.fp32_precision() == before


def _fake_gpus(monkeypatch, names: list[str]) -> None:
    """torch.cuda as a job on ``names`` GPUs would see it (nothing is run on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: names[i])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(precision, "_cublas_version", lambda: "12.8.4.1")


def test_pin_ieee_sets_every_backend_with_the_new_api_and_records_cpu(monkeypatch):
    precision.set_fp32_precision({"global": "none", "cudnn.conv": "tf32"})  # torch's defaults: conv in TF32
    assert precision.fp32_precision()["cudnn.conv"] == "tf32"  # the case where it does not hold

    def legacy(*_args, **_kwargs):
        raise AssertionError("legacy TF32 API called (mixing it with fp32_precision makes torch raise)")

    monkeypatch.setattr(torch, "set_float32_matmul_precision", legacy)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", legacy)
    monkeypatch.delenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", raising=False)
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    record = precision.pin_ieee("cpu")
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert torch.backends.cudnn.conv.fp32_precision == "ieee" and torch.backends.cudnn.rnn.fp32_precision == "ieee"
    assert set(record["fp32_precision"].values()) == {"ieee"}
    assert record["device"] == "cpu" and record["gpus"] == [] and record["cudnn"] is None
    assert record["torch"] == torch.__version__
    assert record["tf32_overrides"] == {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": None, "NVIDIA_TF32_OVERRIDE": "0"}
    json.dumps(record)  # a sidecar field: plain JSON


def test_the_jacobian_context_uses_the_new_api_and_restores_the_settings(monkeypatch):
    def legacy(*_args, **_kwargs):
        raise AssertionError("legacy TF32 API called")

    monkeypatch.setattr(torch, "set_float32_matmul_precision", legacy)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", legacy)
    precision.set_fp32_precision({"global": "none", "cuda.matmul": "tf32", "cudnn.conv": "tf32"})
    before = precision.fp32_precision()
    model = make_model("llama")
    with jacobian.full_fp32_matmul():
        assert set(precision.fp32_precision().values()) == {"ieee"}
    assert precision.fp32_precision() == before
    jacs = jacobian.JacobianEngine(model, [0]).compute(sample_ids(), [3])  # runs the context inside
    assert precision.fp32_precision() == before and jacs[(0, "attn")].shape[0] == 1


def test_the_cublas_tf32_override_stops_a_cuda_job_in_one_line(monkeypatch):
    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
    with pytest.raises(ValueError, match=r"^TORCH_ALLOW_TF32_CUBLAS_OVERRIDE='1' forces TF32 .*unset it") as err:
        precision.pin_ieee("cuda:0")
    assert "\n" not in str(err.value)
    assert precision.pin_ieee("cpu")["tf32_overrides"]["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == "1"  # harmless on CPU
    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "0")
    _fake_gpus(monkeypatch, ["NVIDIA H200"])
    assert precision.pin_ieee("cuda:0")["gpus"] == ["NVIDIA H200"]


def test_the_record_on_a_gpu_names_the_models_and_versions(monkeypatch):
    _fake_gpus(monkeypatch, ["NVIDIA H200", "NVIDIA H200"])
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    record = precision.pin_ieee("cuda")
    assert record["device"] == "cuda" and record["gpus"] == ["NVIDIA H200", "NVIDIA H200"]
    assert (record["capability"], record["cuda"], record["cudnn"], record["cublas"]) == (
        "9.0",
        "12.8",
        91002,
        "12.8.4.1",
    )
    resume = precision.resume_numerics("cuda")
    assert set(resume) == set(precision.RESUME_FIELDS) and "capability" not in resume


def test_resume_mismatch_names_both_setups_and_only_for_numerics():
    a = {"device": "cuda", "gpus": ["NVIDIA H100 80GB HBM3"], "torch": "2.13.0", "cuda": "12.8"}
    b = {**a, "gpus": ["NVIDIA A100-SXM4-80GB"], "cuda": "12.6"}
    why = resume_mismatch(precision.resume_key("x", a), precision.resume_key("y", b), "other inputs")
    assert "NVIDIA H100 80GB HBM3" in why and "NVIDIA A100-SXM4-80GB" in why and "'12.8'" in why and "'12.6'" in why
    assert "torch" not in why and "\n" not in why  # only what differs, one line
    assert resume_mismatch(precision.resume_key("x", a), precision.resume_key("y", a), "other inputs") == "other inputs"
    assert resume_mismatch("0" * 64, precision.resume_key("y", a), "other inputs") == "other inputs"  # an older key


def _numerics_of(monkeypatch, gpu: str) -> None:
    """Checkpoints written and read from now on carry the numerics of a job on ``gpu``."""
    record = {**precision.numerics_record("cpu"), "device": "cuda", "gpus": [gpu], "torch": "2.13.0+cu128"}
    monkeypatch.setattr(precision, "numerics_record", lambda device: dict(record))


def _mean(path: Path) -> np.ndarray:
    with h5py.File(path) as f:
        return f["attn/mean"][()]


def test_a_jacobian_checkpoint_from_another_gpu_is_not_resumed(tmp_path, monkeypatch):
    model = make_model("llama")
    samples = np.stack([sample_ids(seed=10 + i).numpy() for i in range(3)])
    paths = {0: tmp_path / "layer000.h5"}
    kwargs = dict(layers=[0], out_paths=paths, checkpoint_every=1, attrs={"model_id": "m"}, progress=False)
    jacobian.write_layer_block(model, samples, [1, 2, 3], **kwargs)
    expected = _mean(paths[0])
    paths[0].unlink()
    checkpoint = artifacts.JacobianSums.path(paths, [0])
    original = artifacts.JacobianSums.save

    def save_then_stop(self, path, fingerprint):
        original(self, path, fingerprint)
        raise KeyboardInterrupt

    for resumed_on, resumes in (("NVIDIA H100 80GB HBM3", True), ("NVIDIA A100-SXM4-80GB", False)):
        _numerics_of(monkeypatch, "NVIDIA H100 80GB HBM3")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(artifacts.JacobianSums, "save", save_then_stop)
            with pytest.raises(KeyboardInterrupt):
                jacobian.write_layer_block(model, samples, [1, 2, 3], **kwargs)
        assert checkpoint.exists()
        _numerics_of(monkeypatch, resumed_on)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            jacobian.write_layer_block(model, samples, [1, 2, 3], **kwargs)
        lines = [str(w.message) for w in caught if "ignoring checkpoint" in str(w.message)]
        if resumes:
            assert not lines, lines
        else:
            assert len(lines) == 1 and "NVIDIA H100 80GB HBM3" in lines[0] and "NVIDIA A100-SXM4-80GB" in lines[0]
        np.testing.assert_array_equal(_mean(paths[0]), expected)
        paths[0].unlink()
        assert not checkpoint.exists()


class _Stop(Exception):
    pass


def test_a_lens_checkpoint_from_another_gpu_is_not_resumed(tmp_path, monkeypatch):
    model = build("llama", pretrain_steps=0)
    data, heldout = synthetic_batches(6, seed=1), synthetic_batches(2, seed=2)
    opts = {**PINNED_RESUME, "steps": 14}
    path = tmp_path / ".lens.partial.pt"
    save = artifacts.LensCheckpoint.save
    _numerics_of(monkeypatch, "NVIDIA H100 80GB HBM3")
    ref = L.train_lens(model, data, heldout_batches=heldout, **opts)

    def save_then_stop(*args, **kwargs):
        save(*args, **kwargs)
        raise _Stop

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(artifacts.LensCheckpoint, "save", save_then_stop)
        with pytest.raises(_Stop):
            L.train_lens(model, data, heldout_batches=heldout, checkpoint=path, checkpoint_every=7, **opts)
    assert path.exists()
    _numerics_of(monkeypatch, "NVIDIA A100-SXM4-80GB")
    with pytest.warns(UserWarning, match=r"ignoring lens checkpoint .*NVIDIA H100 80GB HBM3.*NVIDIA A100-SXM4-80GB"):
        got = L.train_lens(model, data, heldout_batches=heldout, checkpoint=path, checkpoint_every=7, **opts)
    assert torch.equal(got.weight, ref.weight) and not path.exists()


def test_every_gpu_script_pins_the_numerics_first():
    """Each GPU job's first statement in its step block is step.pin_numerics (so nothing runs before)."""
    for name in GPU_SCRIPTS:
        tree = ast.parse((REPO / "workflow" / "scripts" / f"{name}.py").read_text())
        block = next(node for node in tree.body if isinstance(node, ast.With))
        calls = [
            ast.unparse(s) for s in block.body if not (isinstance(s, ast.Assign) and "snakemake" in ast.unparse(s))
        ]
        assert calls[0].startswith("step.pin_numerics(models.pick_device("), (name, calls[0])


def test_the_step_records_the_numerics_in_its_sidecar(tmp_path, monkeypatch):
    from resdyn.provenance import sidecars

    class Job:  # what Snakemake hands a script, reduced to what Step reads
        rule, input, output, log, threads = "lens", [], [str(tmp_path / "out.tsv")], [], 1
        wildcards, params = {}, {}

    monkeypatch.delenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", raising=False)
    step = sidecars.Step(Job())
    record = step.pin_numerics(torch.device("cpu"))
    (tmp_path / "out.tsv").write_text("a\n1\n")
    step.finish()
    side = json.loads((tmp_path / "out.tsv.prov.json").read_text())
    assert side["numerics"] == record and side["numerics"]["device"] == "cpu"


def test_the_generic_path_places_activations_on_each_layer_device(monkeypatch):
    """A model spread over devices, mocked on CPU: every generic layer_forward goes through the
    hand-written adapters' placement helper, which moves h, the context and HF's captured call to
    the layer's device (here "meta", the only second device a CPU has)."""
    model = decompose.use_generic(make_model("qwen2"))
    ids = sample_ids()[None]
    ctx = decompose.prepare(model, ids)
    adapters = decompose.sublayers(model)
    assert all(isinstance(a, generic.GenericSublayers) for a in adapters)
    seen = []
    placed = generic.GenericSublayers.placed

    def spy(self, h, ctx, kv=None):
        seen.append(self.index)
        return placed(self, h, ctx, kv)

    monkeypatch.setattr(generic.GenericSublayers, "placed", spy)
    reference = decompose.forward_boundaries(adapters, ctx)
    assert seen == [a.index for a in adapters]
    h = reference[:, 2]
    same, sctx, _ = adapters[1].placed(h, ctx)
    assert same is h and sctx is ctx  # one device: no copy
    meta = torch.device("meta")
    monkeypatch.setattr(generic.GenericSublayers, "device", property(lambda self: meta))
    moved, mctx, _ = adapters[1].placed(h, ctx)
    assert moved.device == meta and mctx.position_ids.device == meta and h.device.type == "cpu"
    args, kwargs = adapters[1]._attn_call(mctx, moved)
    tensors = [v for v in (*args, *kwargs.values(), *(x for v in kwargs.values() if isinstance(v, tuple) for x in v))]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    assert tensors and all(t.device == meta for t in tensors)
