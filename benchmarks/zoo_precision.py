"""CPU seconds per zoo training step in float32 and under bfloat16 autocast (``train.precision``),
for the default config's four zoo shapes, on this machine. Prints a table; asserts nothing.

    .venv/bin/python benchmarks/zoo_precision.py [--config config.yaml] [--steps 6] [--threads 1]

Each model is built as ``zoo_train`` builds it (``zoo.build_model``) and trained on random token
windows of the config's batch shape with AdamW, the precisions round-robin on the same batches;
the median of the steps after the first (warm-up) is printed with the ratio to float32. Whether
bfloat16 pays depends on the CPU: native bf16 instructions (``avx512_bf16``, ``amx_bf16`` in
/proc/cpuinfo, printed) or an emulation that is several times slower than float32.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from resdyn.lm import zoo
from resdyn.pipeline import config as rc


def cpu_bf16_flags() -> str:
    """The CPU's native bfloat16 feature flags (Linux /proc/cpuinfo), or "none"."""
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")).split()
    except (OSError, StopIteration):
        return "unknown"
    return ", ".join(f for f in ("avx512_bf16", "amx_bf16", "avx512f", "avx2") if f in flags) or "none"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="config.yaml")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = rc.load_config(a.config)
    print(f"CPU flags: {cpu_bf16_flags()}; {a.threads} thread(s); median of steps 2..{a.steps}")
    print("| model | float32 s/step | bfloat16 s/step | bfloat16 / float32 |\n|---|---|---|---|")
    for name, m in cfg["models"].items():
        if m["source"] != "train":
            continue
        t = m["train"]
        arch = zoo.Architecture(
            family=m["family"],
            n_layers=m["n_layers"],
            d_model=m["d_model"],
            n_heads=m["n_heads"],
            n_kv_heads=m["n_kv_heads"] or m["n_heads"],
            d_ff=m["d_ff"],
            max_position=m["max_position"],
        )
        vocab = cfg["tokenizer"]["vocab_size"]
        gen = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, vocab, (t["batch_size"], t["seq_len"]), generator=gen) for _ in range(a.steps)]
        seconds = {}
        for precision in ("float32", "bfloat16"):
            model = zoo.build_model(arch, vocab, seed=0)
            opt = torch.optim.AdamW(model.parameters(), lr=t["lr"], fused=True)
            times = []
            for batch in batches:
                start = time.process_time()
                zoo.next_token_loss(model, batch, precision).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                times.append(time.process_time() - start)
            seconds[precision] = statistics.median(times[1:])
        f32, b16 = seconds["float32"], seconds["bfloat16"]
        print(f"| {name} | {f32:.3f} | {b16:.3f} | {b16 / f32:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
