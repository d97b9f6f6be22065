"""GPU check (run by benchmarks/gpu_check.sh): Jacobians, matmul rate, a bf16 lens step, decompositions.

    python benchmarks/gpu_check.py            # on a CUDA machine: Llama-3.1-8B-shaped layer, ≤ 8 min
    python benchmarks/gpu_check.py --dry      # CPU fallback at d = 256: checks the script itself

Prints one table — measured value, what resdyn.cluster.cost assumes for the GPU kind, their ratio — and
then ``MEASURED_RATES``, the measured throughputs in resdyn.cluster.cost's op classes and units, with
the line that puts them into resdyn/cluster/cost.py's ``DEVICES``.

Contents (≤ 8 min on one H100/H200): fp32/bf16/fp64 matmul and HBM copy rates; the structured
Jacobians of one Llama-3.1-8B-shaped layer (d 4096, d_ff 14336, 32/8 heads, T 128) on CUDA
against the CPU result (max |Δ|), their GEMM throughput as a fraction of the measured fp32
matmul rate and the attention core's rate by difference; two bf16 lens training steps (2
layers, V 128256, 4096 tokens); float64 4096² eigvals, eig with vectors + inverse (the
perturbative bootstrap), svd and svdvals on the device, with the eigenvalues checked against
the host's and the Henrici departure by subtraction against the host Schur form. With two or
more GPUs visible, the two-GPU check: a small Llama loaded by layer across cuda:0 and cuda:1
(resdyn.lm.models.load_model with a placement, the path of a model that does not fit one GPU)
gives the single-GPU residual states, boundary states, lens states and causal continuation (max
|Δ|; ``--dry`` runs the same code path with every device the CPU).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from resdyn.cluster import cost, gpu_kinds  # noqa: E402


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev, repeat=1, warm=None):
    """Mean seconds of ``repeat`` calls after one warm-up call (``warm``, e.g. the same op at a
    small size, when a full-size warm-up would cost too much: a 4096² eig is tens of seconds)."""
    (warm or fn)()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    sync(dev)
    return (time.perf_counter() - t0) / repeat, out


def model(d, d_ff, heads, kv, layers, vocab, dtype, dev):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=d,
        intermediate_size=d_ff,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        num_hidden_layers=layers,
        vocab_size=vocab,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    with torch.device(dev):
        m = LlamaForCausalLM(cfg)
    return m.to(dtype).eval()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry", action="store_true", help="CPU fallback at d = 256 (checks the script)")
    ap.add_argument(
        "--kind", default="h100", choices=tuple(gpu_kinds.GPU_KINDS), help="GPU kind of resdyn/data/gpus.yaml"
    )
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.dry
    dev = torch.device("cuda" if cuda else "cpu")
    d, d_ff, heads, kv, vocab, T = (4096, 14336, 32, 8, 128256, 128) if cuda else (256, 896, 2, 1, 4096, 32)
    rates = gpu_kinds.DEVICES[args.kind].rates if cuda else gpu_kinds.CPU_CALIBRATION
    rows = []
    measured: dict[str, float] = {}  # op class -> measured rate, in resdyn.cluster.cost's units
    t_all = time.perf_counter()

    def row(what, value, unit, assumed=None):
        ratio = f"{value / assumed:.2f}" if assumed else ""
        rows.append((what, f"{value:.4g}", unit, f"{assumed:.4g}" if assumed else "", ratio))
        print(f"  [{time.perf_counter() - t_all:6.1f} s] {what}: {value:.4g} {unit}", file=sys.stderr, flush=True)

    # 1. matmul and streaming throughput
    from resdyn.study_a.jacobian import full_fp32_matmul

    n = 8192 if cuda else 512
    for dtype, op in ((torch.float32, "gemm32"), (torch.bfloat16, "gemm16"), (torch.float64, "gemm64")):
        if not cuda and dtype is torch.bfloat16:
            continue
        a = torch.randn(n, n, device=dev, dtype=dtype)
        with full_fp32_matmul():
            t, _ = timed(lambda: a @ a, dev, repeat=5)
        measured[op] = 2 * n**3 / t
        row(f"matmul {str(dtype).removeprefix('torch.')} {n}²", measured[op], "FLOP/s", rates[op])
        del a
    big = torch.ones((2**28 if cuda else 2**24) // 8, device=dev, dtype=torch.float64)
    dst = torch.empty_like(big)
    t, _ = timed(lambda: dst.copy_(big), dev, repeat=5)  # noqa: F821 (del later)
    measured["stream"] = 2 * big.numel() * 8 / t
    row(f"copy {big.numel() * 8 / 2**20:.0f} MiB (read + write)", measured["stream"], "B/s", rates["stream"])
    del big, dst

    # 2. structured Jacobians of one Llama-3.1-8B-shaped layer: GPU vs CPU
    from resdyn.study_a import jacobian

    gm = model(d, d_ff, heads, kv, 1, vocab, torch.float32, dev)
    ids = torch.randint(0, vocab, (T,), generator=torch.Generator().manual_seed(0))
    eng = jacobian.JacobianEngine(gm, [0])
    t_gpu, jac_gpu = timed(lambda: eng.compute(ids.to(dev), "last"), dev, repeat=2 if cuda else 1)  # noqa: F821 (del later)
    shape = cost.Shape(1, d, heads, kv, d_ff, vocab, 4)
    c = cost.cost_jacobians(
        {
            "samples": {"n": 1, "length": T},
            "jacobian": {"positions": "last", "store_first_n": 0, "store_dtype": "float32"},
        },
        shape,
        [0],
        gpu=cuda,
    )
    kind = args.kind if cuda else "cpu"
    row("jacobians: s/sample (attn+mlp, 1 layer)", t_gpu, "s", cost.seconds(c, kind) - c.fixed_s)
    row("jacobians: GEMM FLOP/s ÷ measured fp32 matmul", c.work["gemm32"] / t_gpu / measured["gemm32"], "fraction")
    # the attention core's rate: what is left of the time after the priced GEMMs and streams
    rest = t_gpu - sum(v / measured.get(op, rates[op]) for op, v in c.work.items() if op != "jvp")
    if rest > 0:
        measured["jvp"] = c.work["jvp"] / rest
        row("jacobians: attention core (jvp) FLOP/s, by difference", measured["jvp"], "FLOP/s", rates["jvp"])
    if cuda:
        cm = model(d, d_ff, heads, kv, 1, vocab, torch.float32, torch.device("cpu"))
        cm.load_state_dict({k: v.cpu() for k, v in gm.state_dict().items()})
        jac_cpu = jacobian.JacobianEngine(cm, [0]).compute(ids, "last")
        del cm
    else:
        jac_cpu = jacobian.JacobianEngine(gm, [0], method="jvp").compute(ids, "last")  # the other engine
    for k in ("attn", "mlp"):
        ref = jac_cpu[(0, k)].double()
        delta = (jac_gpu[(0, k)].cpu().double() - ref).abs().max().item()
        row(
            f"jacobians: max |Δ| {k} ({'CUDA vs CPU' if cuda else 'structured vs jvp'}), max |J| "
            f"{ref.abs().max().item():.3g}",
            delta,
            "",
        )
    del gm, eng, jac_gpu, jac_cpu

    # 3. one bf16 lens training step (2 layers, the real vocabulary)
    from resdyn.study_b import lens

    lm = model(d, d_ff, heads, kv, 2, vocab, torch.bfloat16 if cuda else torch.float32, dev)
    B = 4096 if cuda else 256
    toks = torch.randint(0, vocab, (2 * B // T, T))
    batches = lens.token_batches(toks, B // T)
    t_lens, _ = timed(
        lambda: lens.train_lens(
            lm,  # noqa: F821 (del later)
            batches,
            steps=2,
            tokens_per_step=B,
            warmup_steps=0,
            optimizer="sgd_nesterov",
            lr=None,
            lr_schedule="constant",
            eval_every=10,
            progress=False,
        ),
        dev,
    )
    s2 = cost.Shape(2, d, heads, kv, d_ff, vocab, 2 if cuda else 4)
    lcfg = {
        "samples": {"length": T},
        "lens": {
            "tokens_per_step": B,
            "steps": 2,
            "eval_every": 10**9,
            "n_heldout_blocks": 0,
            "n_train_blocks": 2 * B // T,
            "readout_dtype": "bfloat16",
        },
    }
    lc = cost.cost_lens(lcfg, s2, gpu=cuda)
    row(f"lens: 2 steps of {B} tokens, 2 layers, V={vocab}", t_lens, "s", cost.seconds(lc, kind) - lc.fixed_s)
    del lm

    # 4. float64 decompositions on the device: eigvals (spectra, bootstrap exact), eig WITH
    # vectors + inverse (bootstrap perturbative: priced as 25 d³ at the eig rate + 8 d³ gemm64),
    # svd, svdvals — against the assumed rates, and the eigenvalues against the host's
    from resdyn.numerics import linalg

    rng = np.random.default_rng(0)
    a = np.eye(d) + rng.standard_normal((d, d)) / np.sqrt(d)
    ta = torch.as_tensor(a, device=dev)
    small = ta[:256, :256].clone()

    def eig_vectors(x):
        lam, V = torch.linalg.eig(x)
        return lam, torch.linalg.inv(V)

    for op, label, flops, fn in (
        ("eig", "eigvals", cost.decomposition_flops("eig", d), torch.linalg.eigvals),
        ("eig", "eig with vectors + inv(V)", 2.5 * cost.decomposition_flops("eig", d), eig_vectors),
        ("svd", "svd", cost.decomposition_flops("svd", d), torch.linalg.svd),
        ("svdvals", "svdvals", cost.decomposition_flops("svdvals", d), torch.linalg.svdvals),
    ):
        t, out = timed(lambda fn=fn: fn(ta), dev, warm=lambda fn=fn: fn(small))
        assumed = flops / rates[op] + (8.0 * d**3 / rates["gemm64"] if label.startswith("eig with") else 0.0)
        row(f"{label} {d}² float64 on {dev.type}", t, "s", assumed)
        if label == "eigvals":
            measured["eig"] = flops / t
        elif label in ("svd", "svdvals"):
            measured[op] = flops / t
        if label.startswith("eig with"):
            lam, Vinv = out  # A = V Λ V⁻¹ up to rounding: check it without a second eig
            resid = (Vinv @ ta.to(Vinv.dtype) @ torch.linalg.inv(Vinv) - torch.diag(lam)).abs().max().item()
            row("eig with vectors: max |V⁻¹ A V − Λ|", resid, "")
    lam_dev, nn_dev, fro = linalg.eigen_henrici(a, dev if cuda else None)
    lam_ref = np.sort_complex(np.linalg.eigvals(a))
    row("eigvals: max |Δλ| device vs host (sorted)", float(np.abs(np.sort_complex(lam_dev) - lam_ref).max()), "")
    _, nn_host, _ = linalg.eigen_henrici(a)
    row("Henrici: |Δ| device (subtraction) vs host Schur, ÷ ‖J‖_F", abs(nn_dev - nn_host) / fro, "")

    # 5. two GPUs: a model placed by layer gives the single-device numbers
    if not cuda or torch.cuda.device_count() >= 2:
        two_gpu_check(row, "cuda" if cuda else "cpu")
    else:
        print("  two-GPU check skipped: one GPU visible", file=sys.stderr)

    name = torch.cuda.get_device_name() if cuda else "CPU (dry run)"
    print(
        f"\nGPU check on {name}, torch {torch.__version__}, assumed rates: {kind}; {time.perf_counter() - t_all:.0f} s"
    )
    widths = [max(len(r[i]) for r in rows + [("what", "measured", "unit", "assumed", "ratio")]) for i in range(5)]
    for r in [("what", "measured", "unit", "assumed", "ratio")] + rows:
        print("  ".join(x.ljust(w) for x, w in zip(r, widths)))
    print(
        "\n# Measured rates in resdyn.cluster.cost's units (FLOP/s; B/s for stream). Each divided by the"
        "\n# datasheet peak of resdyn/data/gpus.yaml is the efficiency resdyn/cluster/cost.py assumes in"
        "\n# GPU_EFFICIENCY (the table keeps hardware numbers only): update it there, with the date and GPU."
        + ("" if cuda else "\n# (dry run: these are this CPU's rates at toy sizes, not for cost.py)")
    )
    if cuda:
        g = gpu_kinds.GPU_KINDS[kind]
        peaks = {
            "fp32_tflops": g.fp32_tflops,
            "bf16_tflops": g.bf16_tflops,
            "fp64_tflops": g.fp64_tflops,
            "fp64_gemm_tflops": max(g.fp64_tensor_tflops, g.fp64_tflops),
            "hbm_tb_s": g.hbm_tb_s,
        }
        for op, (col, eff) in gpu_kinds.GPU_EFFICIENCY.items():
            if op in measured:
                print(f"#   {op}: measured efficiency {measured[op] / (peaks[col] * 1e12):.4g} (assumed {eff})")
    print("MEASURED_RATES = {")
    for op in ("gemm32", "gemm16", "gemm64", "jvp", "eig", "svd", "svdvals", "stream"):
        if op in measured:
            print(f'    "{op}": {measured[op]:.3g},')
    print("}")
    return 0


def two_gpu_check(row, device: str) -> None:
    """A 8-layer Llama (d 512) loaded whole on one device and placed by layer on two (embed and
    layers 0-3 on the first, layers 4-7 and the head on the second: ``cuda:0``/``cuda:1``, or the CPU
    twice with ``--dry``) through resdyn.lm.models.load_model: the states and the causal
    continuation of both must agree (max |Δ|; bit-equal on the CPU, ~1e-6 across GPUs)."""
    import tempfile

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
        row(f"two GPUs: devices of the placed model ({', '.join(where)})", float(len(where)), "devices")
        ids = torch.randint(0, 300, (4, 64), generator=torch.Generator().manual_seed(0))
        for fn in (structure.residual_states, decompose.boundary_states, lens.layer_major_states):
            a, b = fn(one, ids), fn(two, ids)
            row(f"two GPUs: max |Δ| {fn.__name__}", float((a - b.to(a.device)).abs().max()), "")
        ca, cb = causal.Continuation(one, ids), causal.Continuation(two, ids)
        final_a, final_b = ca.run(ca.stream(3) * 0.5, 3), cb.run(cb.stream(3) * 0.5, 3)
        row(
            "two GPUs: max |Δ| causal continuation from layer 3",
            float((final_a - final_b.to(final_a.device)).abs().max()),
            "",
        )


if __name__ == "__main__":
    sys.exit(main())
