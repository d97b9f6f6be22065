"""How far a zoo training step is from this CPU's float32 matmul peak (a roofline for the zoo).

Prints a table and asserts nothing. For each default zoo shape: the FLOPs of one training step
(forward, backward, fused AdamW) counted by ``torch.utils.flop_counter.FlopCounterMode``; the
median CPU seconds of a step (1 thread, the pipeline's step: ``zoo.next_token_loss``, clip 1,
fused AdamW); the share of that time in matrix multiplies (``torch.profiler``: aten::mm, addmm,
bmm and the CPU flash-attention kernels); and the machine's single-thread float32 peak, taken
as the best of large square ``torch.mm`` products. Two bounds on any speed-up at float32 follow:
``only matmuls`` = step / matmul time (nothing but the matmuls left, at today's speed),
``at peak`` = step / (FLOPs / peak) (every FLOP at the peak rate, nothing else).

    python benchmarks/zoo_roofline.py            # llama8, llama16, olmo8
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resdyn.lm import zoo  # noqa: E402

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu")


def matmul_peak(n: int = 1024, repeats: int = 8) -> float:
    """Best single-thread float32 GFLOP/s of ``torch.mm`` on (n, n) @ (n, n)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = 0.0
    for _ in range(repeats):
        t = time.process_time()
        torch.mm(a, b)
        best = max(best, 2 * n**3 / (time.process_time() - t) / 1e9)
    return best


def train_step(model, opt, batch) -> None:
    loss = zoo.next_token_loss(model, batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def measure(family: str, layers: int, steps: int) -> dict[str, float]:
    """FLOPs, median CPU s and matmul share of one step of the zoo shape (family, layers)."""
    arch = zoo.Architecture(family, layers, 64, 4, 2, 256, 256)
    model = zoo.build_model(arch, 2048, 0, 0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.95), fused=True)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 2048, (16, 128), generator=g) for _ in range(steps + 2)]
    with FlopCounterMode(display=False) as counter:
        train_step(model, opt, batches[0])
    flops = counter.get_total_flops()
    times = []
    for b in batches[1:-1]:
        t = time.process_time()
        train_step(model, opt, b)
        times.append(time.process_time() - t)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train_step(model, opt, batches[-1])
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    mm = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS or "flash_attention" in e.key)
    return {"gflop": flops / 1e9, "step_s": sorted(times)[len(times) // 2], "mm_share": mm / total}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["llama8", "llama16", "olmo8"])
    ap.add_argument("--steps", type=int, default=7, help="timed steps per shape (median)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
            if ln.startswith("Model name")
        ),
        "?",
    )
    peak = matmul_peak()
    print(f"CPU: {cpu}; load (1 min) {os.getloadavg()[0]:.2f}; 1 thread; float32 torch.mm peak {peak:.1f} GFLOP/s")
    print(
        "| shape | GFLOP/step | CPU s/step | GFLOP/s | of peak | matmul share | bound: only matmuls | bound: at peak |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for shape in args.shapes:
        family = "olmo2" if shape.startswith("olmo") else "llama"
        layers = int("".join(ch for ch in shape if ch.isdigit()))
        m = measure(family, layers, args.steps)
        rate = m["gflop"] / m["step_s"]
        print(
            f"| {shape} | {m['gflop']:.2f} | {m['step_s']:.3f} | {rate:.1f} | {rate / peak:.0%} | {m['mm_share']:.0%} "
            f"| {1 / m['mm_share']:.2f}x | {m['step_s'] / (m['gflop'] / peak):.2f}x |"
        )
    print(f"load (1 min) after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
