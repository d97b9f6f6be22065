"""Benchmark: process CPU time per zoo training step, eager (the pipeline's path) vs torch.compile.

Prints a table and asserts nothing. Both variants train the same model (zoo.build_model, same
seed) on the same random token batches with the pipeline's step (zoo.next_token_loss, fused
AdamW, gradient clip 1), one after the other in this process, then eager again (drift check).
CPU time is ``getrusage`` of this process and its children (inductor compiles in workers), not
wall time: the machine may be shared. The compile warm-up (first step) is reported apart, with
the break-even step count of a 600-step job. Also prints lscpu's model name and ``uptime``.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resdyn.lm import zoo  # noqa: E402


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def run(arch: zoo.Architecture, batches: list[torch.Tensor], loss_fn) -> tuple[list[float], list[float]]:
    """(CPU seconds per step, loss per step) of training a fresh seeded model on ``batches``."""
    model = zoo.build_model(arch, 2048, 0, 0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.95), fused=True)
    times, losses = [], []
    for b in batches:
        c = cpu_seconds()
        loss = loss_fn(model, b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        times.append(cpu_seconds() - c)
    return times, losses


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--family", default="llama", choices=zoo.FAMILIES)
    ap.add_argument("--steps", type=int, default=12, help="steps per variant (the first 2 are warm-up)")
    ap.add_argument("--job-steps", type=int, default=600, help="train.steps of the job the warm-up is priced in")
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
    print(f"CPU: {cpu}; uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    arch = zoo.Architecture(args.family, args.layers, 64, 4, 2, 256, 256)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 2048, (16, 128), generator=g) for _ in range(args.steps)]
    eager, l_eager = run(arch, batches, zoo.next_token_loss)
    comp, l_comp = run(arch, batches, torch.compile(zoo.next_token_loss))
    eager2, _ = run(arch, batches, zoo.next_token_loss)
    e, c = median(eager[2:] + eager2[2:]), median(comp[2:])
    warm = comp[0] - c
    print(f"{args.family}{args.layers}, 16 x 128 tokens/step, float32, 1 thread; CPU s (process + children)")
    print(f"{'variant':<22} {'first step':>10} {'median step':>12} {'vs eager':>9}")
    print(f"{'eager (pipeline)':<22} {eager[0]:>10.3f} {e:>12.4f} {1.0:>8.2f}x")
    print(f"{'torch.compile':<22} {comp[0]:>10.3f} {c:>12.4f} {e / c:>8.2f}x")
    saved = (e - c) * args.job_steps
    print(
        f"compile warm-up {warm:.1f} CPU s; saves {saved:.1f} CPU s over a {args.job_steps}-step job "
        f"(net {saved - warm:+.1f})"
    )
    print(
        f"max |loss eager - loss compiled| over {args.steps} steps: "
        f"{max(abs(a - b) for a, b in zip(l_eager, l_comp)):.2e}"
    )


if __name__ == "__main__":
    main()
