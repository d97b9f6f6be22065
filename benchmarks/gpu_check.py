"""GPU check (run by benchmarks/gpu_check.sh): Jacobians, matmul rate, a bf16 lens step, decompositions.

    python benchmarks/gpu_check.py            # on a CUDA machine: Llama-3.1-8B-shaped layer, ≤ 8 min
    python benchmarks/gpu_check.py --dry      # CPU fallback at d = 256: checks the script itself

Prints one table: measured value, what resdyn.cost assumes for the GPU kind, and their ratio
(update resdyn/cost.py's H100/H200 rates from it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from resdyn import cost  # noqa: E402


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev, repeat=1):
    fn()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    sync(dev)
    return (time.perf_counter() - t0) / repeat, out


def model(d, d_ff, heads, kv, layers, vocab, dtype, dev):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_attention_heads=heads, num_key_value_heads=kv,
                      num_hidden_layers=layers, vocab_size=vocab, max_position_embeddings=1024)
    torch.manual_seed(0)
    with torch.device(dev):
        m = LlamaForCausalLM(cfg)
    return m.to(dtype).eval()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry", action="store_true", help="CPU fallback at d = 256 (checks the script)")
    ap.add_argument("--kind", default="h100", choices=("h100", "h200"))
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.dry
    dev = torch.device("cuda" if cuda else "cpu")
    d, d_ff, heads, kv, vocab, T = (4096, 14336, 32, 8, 128256, 128) if cuda else (256, 896, 2, 1, 4096, 32)
    rates = cost.DEVICES[args.kind].rates if cuda else cost.CPU_CALIBRATION
    rows = []

    def row(what, measured, unit, assumed=None):
        ratio = f"{measured / assumed:.2f}" if assumed else ""
        rows.append((what, f"{measured:.4g}", unit, f"{assumed:.4g}" if assumed else "", ratio))
        print(f"  {what}: {measured:.4g} {unit}", file=sys.stderr, flush=True)

    # 1. matmul throughput
    from resdyn.jacobian import full_fp32_matmul

    n = 8192 if cuda else 512
    for dtype, op in ((torch.float32, "gemm32"), (torch.bfloat16, "gemm16"), (torch.float64, "gemm64")):
        if not cuda and dtype is not torch.float32:
            continue
        a = torch.randn(n, n, device=dev, dtype=dtype)
        with full_fp32_matmul():
            t, _ = timed(lambda: a @ a, dev, repeat=5)
        row(f"matmul {str(dtype).removeprefix('torch.')} {n}²", 2 * n**3 / t, "FLOP/s", rates[op])
    peak32 = float(rows[0][1])

    # 2. structured Jacobians of one Llama-3.1-8B-shaped layer: GPU vs CPU
    from resdyn import jacobian

    gm = model(d, d_ff, heads, kv, 1, vocab, torch.float32, dev)
    ids = torch.randint(0, vocab, (T,), generator=torch.Generator().manual_seed(0))
    eng = jacobian.JacobianEngine(gm, [0])
    t_gpu, jac_gpu = timed(lambda: eng.compute(ids.to(dev), "last"), dev, repeat=2 if cuda else 1)
    shape = cost.Shape(1, d, heads, kv, d_ff, vocab, 4)
    c = cost.cost_jacobians({"samples": {"n": 1, "length": T}, "jacobian": {"positions": "last", "store_first_n": 0,
                             "store_dtype": "float32"}}, shape, [0], gpu=cuda)
    row("jacobians: s/sample (attn+mlp, 1 layer)", t_gpu, "s", cost.seconds(c, args.kind if cuda else "cpu") - c.fixed_s)
    row("jacobians: GEMM FLOP/s ÷ measured fp32 matmul", c.work["gemm32"] / t_gpu / peak32, "fraction")
    if cuda:
        cm = model(d, d_ff, heads, kv, 1, vocab, torch.float32, torch.device("cpu"))
        cm.load_state_dict({k: v.cpu() for k, v in gm.state_dict().items()})
        jac_cpu = jacobian.JacobianEngine(cm, [0]).compute(ids, "last")
    else:
        jac_cpu = jacobian.JacobianEngine(gm, [0], method="jvp").compute(ids, "last")  # the other engine
    for kind in ("attn", "mlp"):
        delta = (jac_gpu[(0, kind)].cpu().double() - jac_cpu[(0, kind)].double()).abs().max().item()
        row(f"jacobians: max |Δ| {kind} ({'CUDA vs CPU' if cuda else 'structured vs jvp'})", delta, "")
    del gm, eng

    # 3. one bf16 lens training step (2 layers, the real vocabulary)
    from resdyn import lens

    lm = model(d, d_ff, heads, kv, 2, vocab, torch.bfloat16 if cuda else torch.float32, dev)
    B = 4096 if cuda else 256
    toks = torch.randint(0, vocab, (2 * B // T, T))
    batches = lens.token_batches(toks, B // T)
    t_lens, _ = timed(lambda: lens.train_lens(lm, batches, steps=2, tokens_per_step=B, warmup_steps=0,
                                              progress=False), dev)
    s2 = cost.Shape(2, d, heads, kv, d_ff, vocab, 2 if cuda else 4)
    lc = cost.cost_lens({"samples": {"length": T}, "lens": {"tokens_per_step": B, "steps": 2, "eval_every": 10**9,
                                                            "n_heldout_blocks": 0, "n_train_blocks": 2 * B // T}},
                        s2, gpu=cuda)
    row(f"lens: 2 steps of {B} tokens, 2 layers, V={vocab}", t_lens, "s",
        cost.seconds(lc, args.kind if cuda else "cpu") - lc.fixed_s)
    del lm

    # 4. decompositions on the device (float64), against the host
    from resdyn import spectral

    rng = np.random.default_rng(0)
    a = np.eye(d) + rng.standard_normal((d, d)) / np.sqrt(d)
    ta = torch.as_tensor(a, device=dev)
    for op, fn in (("eig", lambda: torch.linalg.eigvals(ta)), ("svd", lambda: torch.linalg.svd(ta)),
                   ("svdvals", lambda: torch.linalg.svdvals(ta))):
        t, _ = timed(fn, dev)
        row(f"{op} {d}² float64 on {dev.type}", t, "s", cost.decomposition_flops(op, d) / rates[op])
    lam_dev, nn_dev, fro = spectral.eigen_henrici(a, dev if cuda else None)
    lam_ref = np.sort_complex(np.linalg.eigvals(a))
    row("eigvals: max |Δλ| device vs host (sorted)", float(np.abs(np.sort_complex(lam_dev) - lam_ref).max()), "")
    _, nn_host, _ = spectral.eigen_henrici(a)
    row("Henrici: |Δ| device (subtraction) vs host Schur", abs(nn_dev - nn_host) / fro, "")

    print(f"\nGPU check on {torch.cuda.get_device_name() if cuda else 'CPU (dry run)'}, torch {torch.__version__}, "
          f"assumed rates: {args.kind if cuda else 'cpu'}")
    widths = [max(len(r[i]) for r in rows + [("what", "measured", "unit", "assumed", "ratio")]) for i in range(5)]
    for r in [("what", "measured", "unit", "assumed", "ratio")] + rows:
        print("  ".join(x.ljust(w) for x, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
