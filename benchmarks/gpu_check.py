"""GPU check: the one script a lent GPU runs (through benchmarks/gpu_check.sh; ≤ 8 min on one H200).

    python benchmarks/gpu_check.py [--kind h200] [--out DIR]   # one GPU, paper shapes
    python benchmarks/gpu_check.py --two-gpu                   # two GPUs: a model placed by layer across them
    python benchmarks/gpu_check.py --dry [--out DIR]           # on a CPU at small shapes: checks the script

Without CUDA the real modes stop with one line (torch's version, ``torch.version.cuda`` and what to
install) and exit status 2: a CPU torch never passes for a GPU check. Contents, at the shapes of
Llama 3.1 8B (d 4096, d_ff 14336, 32/8 heads, V 128256, T 128) with 4 layers in bfloat16:

* the numerics: fp32 pinned to IEEE as every GPU job pins it (:func:`resdyn.numerics.precision.pin_ieee`),
  the TF32 state and override variables, GPU model and library versions;
* matmul fp32/bf16/fp64 and HBM copy rates;
* the priced rules, each as its job runs it, timed and with its peak device memory
  (``torch.cuda.reset_peak_memory_stats`` / ``max_memory_allocated``) against the plan
  (``resdyn.pipeline.dag.job_cost`` of the config this script writes): ``jacobians`` (one block of
  the 4 layers, 32 samples in batches of 16, fp32 sublayer copies, summaries, the first 2 kept),
  ``lens`` (8 steps of 16,384 tokens, bfloat16 readout), ``spectra`` (float64, one layer's two
  sublayers);
* the Jacobians of layer 0 against reverse-mode autograd through HF's own decoder layer (VJP rows
  uᵀJ of the attention half and of the MLP half, fp32 copy of the layer) on the device: relative
  error above :data:`AUTOGRAD_RTOL` fails the check (exit status 1);
* one sample's Jacobians computed twice: bit-identical or not (reported, not a failure);
* float64 decompositions of a d × d matrix (eigvals, eig with vectors + inverse, svd, svdvals).

It prints one table (measured, planned, ratio), ``MEASURED_RATES`` in the cost model's op classes and
units, and writes a run folder ``resdyn calibrate`` reads (``--out``, default benchmarks/out/gpu_check):
``config.yaml`` (the priced jobs' config, with ``models/*/config.json``), each timed job's benchmark
file ``benchmarks/out/{rule}/{model}/{ckpt}[/{block}].tsv`` and log ``logs/...`` naming the device.
Format: docs/cost.md, "GPU check".
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from resdyn.cluster import cost, gpu_kinds  # noqa: E402

#: Relative error of uᵀJ against reverse-mode autograd allowed in IEEE fp32 (rounding is ~1e-6 at d = 4096).
AUTOGRAD_RTOL = 1e-4
#: Relative difference allowed between a model on one device and the same model placed across two.
TWO_GPU_RTOL = 1e-5
#: Random probes u of the VJP check.
AUTOGRAD_PROBES = 4
#: The three priced rules timed here and the config model each runs on.
TIMED = {"jacobians": "check4", "lens": "check4", "spectra": "check1"}
INSTALL = (
    "a CUDA build of torch (make setup TORCH_BUILD=cuda, or pip install torch --index-url "
    "https://download.pytorch.org/whl/cu128)"
)


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Model widths and workload of the check."""

    d: int
    d_ff: int
    heads: int
    kv: int
    vocab: int
    length: int
    samples: int
    lens_steps: int
    lens_tokens: int
    matmul: int


PAPER = Shapes(4096, 14336, 32, 8, 128256, 128, 32, 8, 16384, 8192)
DRY = Shapes(64, 160, 4, 2, 512, 16, 32, 4, 256, 512)


def cuda_refusal(n_gpus: int) -> str | None:
    """One line saying why this torch cannot run the real check on ``n_gpus`` GPUs, or None."""
    if not torch.cuda.is_available():
        return (
            f"gpu_check: no CUDA device: torch {torch.__version__}, torch.version.cuda = {torch.version.cuda}; "
            f"install {INSTALL} and run on a GPU node (benchmarks/gpu_check.sh --dry checks the script on a CPU)"
        )
    if torch.cuda.device_count() < n_gpus:
        return f"gpu_check: --two-gpu needs 2 GPUs, torch sees {torch.cuda.device_count()}"
    return None


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev: torch.device, repeat: int = 1, warm=None):
    """Mean seconds of ``repeat`` calls after one warm-up call (``warm``, e.g. the same op at a
    small size, when a full-size warm-up would cost too much: a 4096² eig is tens of seconds)."""
    (warm or fn)()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    sync(dev)
    return (time.perf_counter() - t0) / repeat, out


def measured_peak(fn, dev: torch.device):
    """(seconds, peak device bytes or NaN on a CPU, result) of one call of ``fn``."""
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = fn()
    sync(dev)
    seconds = time.perf_counter() - t0
    peak = float(torch.cuda.max_memory_allocated()) if dev.type == "cuda" else float("nan")
    return seconds, peak, out


def llama_config(sh: Shapes, n_layers: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=sh.d,
        intermediate_size=sh.d_ff,
        num_attention_heads=sh.heads,
        num_key_value_heads=sh.kv,
        num_hidden_layers=n_layers,
        vocab_size=sh.vocab,
        max_position_embeddings=max(1024, sh.length),
        torch_dtype="bfloat16",
    )


def build_model(sh: Shapes, n_layers: int, dtype: torch.dtype, dev: torch.device):
    """A random-weight Llama of the check's widths (seed 0) on ``dev`` in ``dtype``, eval mode."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(llama_config(sh, n_layers))
    return model.to(dtype).eval()


def check_config(run: Path, sh: Shapes, device: str) -> dict:
    """Write ``run``/config.yaml and the models' config.json files (4 layers, and 1 layer for spectra)
    and return the config as validated (paths relative to ``run``): the jobs this script times."""
    import os

    import yaml

    from resdyn.pipeline import config as rc

    for name, layers in (("check4", 4), ("check1", 1)):
        llama_config(sh, layers).to_json_file(_mkdir(run / "models" / name) / "config.json")
    models = {
        name: {"source": "local", "path": f"models/{name}", "dataset": "kjv", "family": "llama", "dtype": "bfloat16"}
        for name in ("check4", "check1")
    }
    blocks = sh.lens_steps * sh.lens_tokens // sh.length
    cfg = {
        "seed": 0,
        "device": device,
        "threads": 1,
        "datasets": {"kjv": {"source": "embedded", "parts": ["kjv"]}},
        "models": models,
        "samples": {"n": sh.samples, "length": sh.length, "seed": 0},
        "jacobian": {"positions": "last", "layers_per_job": 4, "store_first_n": 2, "n_groups": 0},
        "lens": {"checkpoints": "final", "n_train_blocks": blocks, "n_heldout_blocks": 1, "steps": sh.lens_steps,
                 "tokens_per_step": sh.lens_tokens, "readout_dtype": "bfloat16", "eval_every": 10**6},
    }  # fmt: skip
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    here = os.getcwd()
    os.chdir(run)
    try:
        return rc.load_config("config.yaml")
    finally:
        os.chdir(here)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def priced_job(config: dict, rule: str, kind: str) -> tuple[dict, cost.Cost, int]:
    """(wildcards, price, CPU threads) of the one job of ``rule`` on its :data:`TIMED` model, as the
    plan and ``resdyn calibrate`` price it."""
    from resdyn.pipeline import dag

    for r, w in dag.unique_jobs(config):
        if r == rule and w["model"] == TIMED[rule]:
            return w, dag.job_cost(config, rule, w, kind), dag.threads_for(config, rule, w, kind)
    raise KeyError(f"the check's config has no {rule} job for model {TIMED[rule]}")


@dataclasses.dataclass
class Timing:
    """One priced job as this script ran it: measured seconds of work and peak device bytes."""

    rule: str
    wildcards: dict
    price: cost.Cost
    threads: int
    seconds: float
    peak: float
    amount: float
    unit: str


class Report:
    """The printed table (measured, unit, planned, ratio), failed checks and the timed jobs."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, str]] = []
        self.failures: list[str] = []
        self.timings: list[Timing] = []
        self.measured: dict[str, float] = {}  # op class -> rate in resdyn.cluster.cost's units
        self.t0 = time.perf_counter()

    def row(self, what: str, value: float, unit: str, planned: float | None = None) -> None:
        ratio = f"{value / planned:.3g}" if planned else ""
        self.rows.append((what, f"{value:.4g}", unit, f"{planned:.4g}" if planned else "", ratio))
        print(f"  [{time.perf_counter() - self.t0:6.1f} s] {what}: {value:.4g} {unit}", file=sys.stderr, flush=True)

    def fail(self, line: str) -> None:
        self.failures.append(line)
        print(f"FAILED: {line}", file=sys.stderr, flush=True)

    def job(self, t: Timing, kind: str) -> None:
        """Rows of a timed job: rate measured vs planned (work only: the plan's start-up is not
        measured here) and, on a GPU, peak device memory vs the plan's."""
        self.timings.append(t)
        planned_s = cost.seconds(t.price, kind, t.threads) - t.price.fixed_s
        self.row(f"{t.rule} job: {t.unit} (work only)", t.amount / t.seconds, t.unit, t.amount / planned_s)
        if np.isfinite(t.peak):
            self.row(f"{t.rule} job: peak device memory", t.peak / 1e9, "GB", t.price.device_bytes / 1e9)


def time_jacobians(model, config: dict, kind: str, dev: torch.device, work: Path, report: Report) -> Path:
    """The ``jacobians`` job of the 4-layer model as the rule runs it (:func:`write_layer_block`:
    batched forward, fp32 sublayer copies, summaries, the first n kept); layer 0's file goes to its
    own folder (the spectra job's input). Returns that folder."""
    from resdyn.study_a import jacobian

    w, price, threads = priced_job(config, "jacobians", kind)
    n, length, jc = config["samples"]["n"], config["samples"]["length"], config["jacobian"]
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(1)).numpy()
    paths = {layer: _mkdir(work / ("layer0" if layer == 0 else "rest")) / f"layer{layer:03d}.h5" for layer in range(4)}
    for p in paths.values():
        p.unlink(missing_ok=True)

    def job():
        jacobian.write_layer_block(
            model, ids, np.arange(n), list(range(4)), paths, positions=jc["positions"], store_dtype=jc["store_dtype"],
            store_first_n=jc["store_first_n"], checkpoint_every=jc["checkpoint_every"], attrs={"model_id": "check4"},
            progress=False,
        )  # fmt: skip

    seconds, peak, _ = measured_peak(job, dev)
    report.job(Timing("jacobians", w, price, threads, seconds, peak, n, "samples/s"), kind)
    return paths[0].parent


def time_lens(model, config: dict, kind: str, dev: torch.device, report: Report) -> None:
    """The ``lens`` job of the 4-layer model as workflow/scripts/lens.py runs it (bfloat16 readout)."""
    from resdyn.study_b import lens

    w, price, threads = priced_job(config, "lens", kind)
    lc, length = config["lens"], config["samples"]["length"]
    skip = (
        "checkpoints",
        "n_train_blocks",
        "n_heldout_blocks",
        "train_tokens",
        "checkpoint_every",
        "source",
        "path",
        "repo",
    )
    opts = {k: v for k, v in lc.items() if k not in (*skip, "repo_type", "revision")}
    opts["warmup_steps"] = opts.pop("warmup")
    n_train = lc["n_train_blocks"]
    batch = max(1, opts["tokens_per_step"] // length)
    ids = torch.randint(0, model.config.vocab_size, (n_train + lc["n_heldout_blocks"], length))
    ids = ids.numpy()

    def job():
        return lens.train_lens(
            model,
            lens.token_batches(ids[:n_train], batch),
            heldout_batches=lens.token_batches(ids[n_train:], batch),
            **{**opts, "progress": False},
        )

    seconds, peak, _ = measured_peak(job, dev)
    tokens = lc["steps"] * lc["tokens_per_step"]
    report.job(Timing("lens", w, price, threads, seconds, peak, tokens, "tokens/s"), kind)


def time_spectra(config: dict, kind: str, gpu: bool, dev: torch.device, folder: Path, report: Report) -> None:
    """The ``spectra`` job of the 1-layer model as workflow/scripts/spectra.py runs it (float64, its
    eigenvalues and SVDs on the GPU unless the kind's FP64 is weak), on layer 0's Jacobians."""
    from resdyn import artifacts
    from resdyn.lm import models
    from resdyn.study_a import spectral

    w, price, threads = priced_job(config, "spectra", kind)
    sc = config["spectra"]
    device = models.device_name(cost.linalg_device(config, kind if gpu else None))

    def job():
        files = artifacts.JacobianBlocks.read([folder])
        noise = spectral.noise_samples(files, sc["noise_draws"], sc["noise_level"])
        _, arrays = spectral.spectra_table(
            files.means, k_fraction=sc["k_fraction"], tolerances=sc["complex_tolerances"], device=device, noise=noise
        )
        spectral.bottleneck_table(files.means, spectra=arrays)

    seconds, peak, _ = measured_peak(job, dev)
    report.job(Timing("spectra", w, price, threads, seconds, peak, 2, "sublayers/s"), kind)


def hf_vjp_rows(layer, call: tuple, h: torch.Tensor, t: int, probes: torch.Tensor, m: torch.Tensor | None = None):
    """Rows uᵀ ∂y[t]/∂x[t] for each probe u, by reverse-mode autograd through HF's decoder ``layer``
    called with its captured ``call`` on h (T, d); the gradient's row t is the diagonal block, the
    other positions held fixed. ``m`` None: the attention half, x = h and y = m_L (read at the input
    of ``post_attention_layernorm``). ``m`` given: the MLP half at m_L = m, x = m and y = h_{L+1}
    (the attention's output replaced by x − h, so the residual sum is x and ∂(h + (x − h))/∂x = I)."""
    args, kwargs = call
    box: dict = {}
    norm = layer.post_attention_layernorm.register_forward_pre_hook(lambda _m, a: box.__setitem__("m", a[0]))
    swap = layer.self_attn.register_forward_hook(
        lambda _mod, _a, out: out if "x" not in box else (box["x"][None] - h[None], *out[1:])
    )
    rows = []
    try:
        for u in probes:
            x = (h if m is None else m).detach().clone().requires_grad_(True)
            if m is not None:
                box["x"] = x
            with torch.enable_grad():
                inp = (h if m is not None else x)[None]
                out = layer(inp, *args[1:], **kwargs) if args else layer(**{**kwargs, "hidden_states": inp})
                y = box["m"] if m is None else (out[0] if isinstance(out, tuple) else out)
                (grad,) = torch.autograd.grad(y[0, t] @ u, x)
            rows.append(grad[t])
    finally:
        norm.remove()
        swap.remove()
    return torch.stack(rows)


def autograd_errors(model, ids: torch.Tensor, jacs: dict, t: int) -> dict[str, float]:
    """Relative errors ``max |U J − U J_ref| / max |U J_ref|`` of layer 0's Jacobians ``jacs``
    ({(0, "attn"): (1, d, d), (0, "mlp"): (1, d, d)} at position t of the sample ``ids``) against
    :func:`hf_vjp_rows` of an fp32 copy of HF's layer 0, at the boundary states h_0, m_0 the engine
    differentiates (``forward_boundaries`` in the model's dtype, then fp32) with fp32 rotary tables,
    for :data:`AUTOGRAD_PROBES` seeded probes U."""
    from resdyn.lm import decompose, generic, structure

    layers = structure.decoder_layers(model)
    layer32 = copy.deepcopy(layers[0]).float()
    with torch.no_grad():
        ctx = decompose.prepare(model, ids[None])
        h, m = decompose.forward_boundaries(decompose.sublayers(model), ctx, upto=0).float()[0, :2]
        calls, _ = generic.capture_calls(model, ids[None], layers)
        args, kwargs = generic.cast_call(calls[0], torch.float32)
        if "position_embeddings" not in kwargs:
            raise KeyError("HF's layer call has no position_embeddings keyword: this transformers is not supported")
        rope = structure.text_model(model).rotary_emb(h[None], torch.arange(h.shape[0], device=h.device)[None])
    call = (args, {**kwargs, "position_embeddings": rope})
    probes = torch.randn(AUTOGRAD_PROBES, h.shape[-1], generator=torch.Generator().manual_seed(0)).to(h)
    errors = {}
    for name, jac, at in (("attention", jacs[(0, "attn")][0], None), ("mlp", jacs[(0, "mlp")][0], m)):
        ref = hf_vjp_rows(layer32, call, h, t, probes, at)
        errors[name] = float((probes @ jac - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    return errors


def check_jacobians(model, length: int, dev: torch.device, report: Report) -> None:
    """Layer 0's Jacobians of one sample against autograd (:func:`autograd_errors`, fails above
    :data:`AUTOGRAD_RTOL`), and computed twice: bit-identical or not (reported)."""
    from resdyn.study_a import jacobian

    ids = torch.randint(0, model.config.vocab_size, (length,), generator=torch.Generator().manual_seed(2)).to(dev)
    engine = jacobian.JacobianEngine(model, [0])
    first = engine.compute(ids, "last")
    with jacobian.full_fp32_matmul():
        errors = autograd_errors(model, ids, first, length - 1)
    for name, err in errors.items():
        report.row(f"autograd: {name} uᵀJ vs VJP through HF's layer, relative (≤ {AUTOGRAD_RTOL:g})", err, "")
        if not err <= AUTOGRAD_RTOL:
            report.fail(f"layer 0 {name} Jacobian: relative error {err:.3g} against autograd (≤ {AUTOGRAD_RTOL:g})")
    second = engine.compute(ids, "last")
    same = all(torch.equal(first[k], second[k]) for k in first)
    delta = max(float((first[k] - second[k]).abs().max()) for k in first)
    report.row(f"determinism: one Jacobian twice, bit-identical {'yes' if same else 'NO'}; max |Δ|", delta, "")


def matmul_rates(dev: torch.device, n: int, rates: dict, report: Report) -> None:
    """fp32 (IEEE), bf16 (GPU only) and fp64 n × n matmul rates and a float64 copy's HBM traffic."""
    from resdyn.numerics import precision

    cuda = dev.type == "cuda"
    for dtype, op in ((torch.float32, "gemm32"), (torch.bfloat16, "gemm16"), (torch.float64, "gemm64")):
        if not cuda and dtype is torch.bfloat16:
            continue
        a = torch.randn(n, n, device=dev, dtype=dtype)
        with precision.ieee_fp32():
            t, _ = timed(lambda a=a: a @ a, dev, repeat=5)
        report.measured[op] = 2 * n**3 / t
        report.row(f"matmul {str(dtype).removeprefix('torch.')} {n}²", report.measured[op], "FLOP/s", rates[op])
        del a
    big = torch.ones((2**28 if cuda else 2**24) // 8, device=dev, dtype=torch.float64)
    dst = torch.empty_like(big)
    t, _ = timed(lambda: dst.copy_(big), dev, repeat=5)
    report.measured["stream"] = 2 * big.numel() * 8 / t
    what = f"copy {big.numel() * 8 / 2**20:.0f} MiB (read + write)"
    report.row(what, report.measured["stream"], "B/s", rates["stream"])


def decomposition_rates(d: int, dev: torch.device, rates: dict, report: Report) -> None:
    """float64 d × d eigvals (spectra, bootstrap exact), eig with vectors + inverse (the perturbative
    bootstrap: 25 d³ at the eig rate + 8 d³ gemm64), svd and svdvals on the device against the
    assumed rates; the eigenvalues and Henrici departure against the host's."""
    from resdyn.numerics import linalg

    rng = np.random.default_rng(0)
    a = np.eye(d) + rng.standard_normal((d, d)) / np.sqrt(d)
    ta = torch.as_tensor(a, device=dev)
    small = ta[:256, :256].clone()

    def eig_vectors(x):
        lam, vectors = torch.linalg.eig(x)
        return lam, torch.linalg.inv(vectors)

    for op, label, flops, fn in (
        ("eig", "eigvals", cost.decomposition_flops("eig", d), torch.linalg.eigvals),
        ("eig", "eig with vectors + inv(V)", 2.5 * cost.decomposition_flops("eig", d), eig_vectors),
        ("svd", "svd", cost.decomposition_flops("svd", d), torch.linalg.svd),
        ("svdvals", "svdvals", cost.decomposition_flops("svdvals", d), torch.linalg.svdvals),
    ):
        t, out = timed(lambda fn=fn: fn(ta), dev, warm=lambda fn=fn: fn(small))
        assumed = flops / rates[op] + (8.0 * d**3 / rates["gemm64"] if label.startswith("eig with") else 0.0)
        report.row(f"{label} {d}² float64 on {dev.type}", t, "s", assumed)
        if label in ("eigvals", "svd", "svdvals"):
            report.measured[op] = flops / t
        if label.startswith("eig with"):
            lam, vinv = out  # A = V Λ V⁻¹ up to rounding: checked without a second eig
            resid = (vinv @ ta.to(vinv.dtype) @ torch.linalg.inv(vinv) - torch.diag(lam)).abs().max().item()
            report.row("eig with vectors: max |V⁻¹ A V − Λ|", resid, "")
    lam_dev, nn_dev, fro = linalg.eigen_henrici(a, dev if dev.type == "cuda" else None)
    lam_ref = np.sort_complex(np.linalg.eigvals(a))
    report.row("eigvals: max |Δλ| device vs host (sorted)", float(np.abs(np.sort_complex(lam_dev) - lam_ref).max()), "")
    _, nn_host, _ = linalg.eigen_henrici(a)
    report.row("Henrici: |Δ| device (subtraction) vs host Schur, ÷ ‖J‖_F", abs(nn_dev - nn_host) / fro, "")


def two_gpu_check(report: Report, device: str) -> None:
    """A 8-layer Llama (d 512) loaded whole on one device and placed by layer on two (embed and
    layers 0-3 on the first, layers 4-7 and the head on the second: ``cuda:0``/``cuda:1``, or the CPU
    twice with ``--dry``) through resdyn.lm.models.load_model: the states and the causal
    continuation of both must agree (max |Δ| ÷ max |value| ≤ :data:`TWO_GPU_RTOL`, else the check
    fails; bit-equal on the CPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from resdyn.beyond import causal
    from resdyn.lm import corpus, decompose, models, structure
    from resdyn.study_b import lens

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "m"
        corpus.train_tokenizer(corpus.kjv_chapters()[:20], 300, Path(tmp) / "tok")
        cfg = LlamaConfig(
            hidden_size=512,
            intermediate_size=1024,
            num_attention_heads=8,
            num_key_value_heads=4,
            num_hidden_layers=8,
            vocab_size=300,
            max_position_embeddings=256,
        )
        torch.manual_seed(0)
        LlamaForCausalLM(cfg).save_pretrained(folder)
        corpus.load_tokenizer(Path(tmp) / "tok").save_pretrained(folder)
        rec = models.resolve_checkpoint(
            {"model": "m", "checkpoint": "local", "source": "local", "path": str(folder), "dtype": "float32"}
        )
        one, _ = models.load_model(rec, device)
        blocks = {"embed": 0, **{f"layers.{i}": int(i >= 4) for i in range(8)}, "head": 1}
        two, _ = models.load_model(rec, device, placement=blocks)
        where = sorted({str(p.device) for p in two.parameters()})
        report.row(f"two GPUs: devices of the placed model ({', '.join(where)})", float(len(where)), "devices")
        if device == "cuda" and where != ["cuda:0", "cuda:1"]:
            report.fail(f"the placed model's parameters are on {where}, not cuda:0 and cuda:1")
        ids = torch.randint(0, 300, (4, 64), generator=torch.Generator().manual_seed(0))
        pairs = {fn.__name__: (fn(one, ids), fn(two, ids)) for fn in (structure.residual_states,
                 decompose.boundary_states, lens.layer_major_states)}  # fmt: skip
        ca, cb = causal.Continuation(one, ids), causal.Continuation(two, ids)
        pairs["causal continuation from layer 3"] = (ca.run(ca.stream(3) * 0.5, 3), cb.run(cb.stream(3) * 0.5, 3))
        for name, (a, b) in pairs.items():
            rel = float((a - b.to(a.device)).abs().max() / a.abs().max().clamp_min(1e-30))
            report.row(f"two GPUs: max |Δ| ÷ max |value|, {name} (≤ {TWO_GPU_RTOL:g})", rel, "")
            if not rel <= TWO_GPU_RTOL:
                report.fail(f"two GPUs: {name} differs from one device's by {rel:.3g} (relative; ≤ {TWO_GPU_RTOL:g})")


def write_calibrate_run(run: Path, report: Report, device_label: str) -> None:
    """Each timed job's Snakemake benchmark file (``s``: the measured work plus the plan's start-up,
    which this script does not measure; ``max_rss`` NA: one process ran every job) and its log, whose
    closing line names the device as a job's does: ``resdyn calibrate`` reads them with ``config.yaml``."""
    from resdyn.pipeline import calibrate

    for t in report.timings:
        bench, log = (run / p for p in calibrate.job_files(t.rule, t.wildcards))
        _mkdir(bench.parent)
        _mkdir(log.parent)
        total = t.seconds + t.price.fixed_s
        hms = time.strftime("%H:%M:%S", time.gmtime(total))
        bench.write_text(f"s\th:m:s\tmax_rss\tcpu_time\n{total:.4f}\t{hms}\tNA\tNA\n")
        peak = f"{t.peak / 1e9:.3f} GB" if np.isfinite(t.peak) else "not measured (CPU)"
        log.write_text(
            f"INFO resdyn.rule.{t.rule}: gpu_check measured {t.seconds:.3f} s of work, the plan's start-up "
            f"{t.price.fixed_s:.1f} s added (not measured); peak device memory {peak}\n"
            f"INFO resdyn.rule.{t.rule}: done in {total:.1f} s wall; device {device_label}, "
            f"torch threads {torch.get_num_threads()}\n"
        )


def print_report(report: Report, header: str, cuda: bool, kind: str) -> None:
    """The table, the failed checks, then ``MEASURED_RATES`` with each one's efficiency."""
    print(f"\n{header}; {time.perf_counter() - report.t0:.0f} s")
    head = ("what", "measured", "unit", "planned", "ratio")
    widths = [max(len(r[i]) for r in [head, *report.rows]) for i in range(5)]
    for r in [head, *report.rows]:
        print("  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip())
    for line in report.failures:
        print(f"FAILED: {line}")
    print(
        "\n# Measured rates in resdyn.cluster.cost's units (FLOP/s; B/s for stream). Each divided by the"
        "\n# datasheet peak of resdyn/data/gpus.yaml is the efficiency resdyn/cluster/cost.py assumes in"
        "\n# GPU_EFFICIENCY (the table keeps hardware numbers only): update it there, with the date and GPU."
        + ("" if cuda else "\n# (dry run: these are this CPU's rates at toy sizes, not for cost.py)")
    )
    if cuda:
        peaks = gpu_kinds.datasheet_peaks(gpu_kinds.GPU_KINDS[kind])
        for op, (col, eff) in gpu_kinds.GPU_EFFICIENCY.items():
            if op in report.measured:
                print(f"#   {op}: measured efficiency {report.measured[op] / (peaks[col] * 1e12):.4g} (assumed {eff})")
    if not report.measured:
        return
    print("MEASURED_RATES = {")
    for op in ("gemm32", "gemm16", "gemm64", "eig", "svd", "svdvals", "stream"):
        if op in report.measured:
            print(f'    "{op}": {report.measured[op]:.3g},')
    print("}")


def numerics_line(dev: torch.device) -> str:
    """fp32 pinned to IEEE as a GPU job pins it; one line with the TF32 state and the versions."""
    from resdyn.numerics import precision

    rec = precision.pin_ieee(dev)
    tf32 = "off" if set(rec["fp32_precision"].values()) == {"ieee"} else "ON"
    return (
        f"numerics: TF32 {tf32} (fp32_precision {rec['fp32_precision']}; overrides {rec['tf32_overrides']}); "
        f"gpus {rec['gpus'] or ['none']}, capability {rec['capability']}; torch {rec['torch']}, cuda {rec['cuda']}, "
        f"cudnn {rec['cudnn']}, cublas {rec['cublas']}"
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="on a CPU at small shapes (checks the script)")
    ap.add_argument("--two-gpu", action="store_true", help="the two-GPU check: a model placed by layer across two")
    ap.add_argument("--kind", default="h200", choices=tuple(gpu_kinds.GPU_KINDS), help="GPU kind priced")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/gpu_check"), help="run folder for calibrate")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 every check passed, 1 a check failed, 2 no CUDA (real modes) or bad numerics."""
    args = parse(argv)
    refusal = None if args.dry else cuda_refusal(2 if args.two_gpu else 1)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    cuda = not args.dry
    dev = torch.device("cuda" if cuda else "cpu")
    report = Report()
    try:
        print(numerics_line(dev), flush=True)
    except ValueError as err:  # TORCH_ALLOW_TF32_CUBLAS_OVERRIDE forces TF32
        print(f"gpu_check: {err}", file=sys.stderr)
        return 2
    if args.two_gpu:
        two_gpu_check(report, dev.type)
    else:
        single_gpu_check(args, dev, report)
    name = torch.cuda.get_device_name() if cuda else "CPU (dry run)"
    kind = args.kind if cuda else "cpu"
    print_report(report, f"GPU check on {name}, torch {torch.__version__}, planned for: {kind}", cuda, kind)
    return 1 if report.failures else 0


def single_gpu_check(args: argparse.Namespace, dev: torch.device, report: Report) -> None:
    """Rates, the three priced rules at the check's shapes, the autograd and determinism checks, the
    decompositions; then the run folder for ``resdyn calibrate``."""
    cuda = dev.type == "cuda"
    sh, kind = (PAPER, args.kind) if cuda else (DRY, "cpu")
    rates = gpu_kinds.DEVICES[kind].rates
    run = _mkdir(args.out.resolve())
    config = check_config(run, sh, "cuda" if cuda else "cpu")
    matmul_rates(dev, sh.matmul, rates, report)
    model = build_model(sh, 4, torch.bfloat16, dev)
    with tempfile.TemporaryDirectory() as work:  # the Jacobian files (GBs at paper shapes) are not kept
        folder = time_jacobians(model, config, kind, dev, Path(work), report)
        check_jacobians(model, sh.length, dev, report)
        time_lens(model, config, kind, dev, report)
        del model
        time_spectra(config, kind, cuda, dev, folder, report)
    decomposition_rates(sh.d, dev, rates, report)
    label = f"cuda:{torch.cuda.get_device_name()}" if cuda else "cpu"
    write_calibrate_run(run, report, label)
    print(f"calibrate: cd {run} && resdyn calibrate . --configfile config.yaml --gpu {kind}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
