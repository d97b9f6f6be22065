"""Benchmark: a lens fitted on fresh tokens (lens.train_tokens) against one on reused blocks.

Prints a table and asserts nothing. Both fits train the same zoo-shaped Llama (random weights:
the time does not depend on them) with the default config's lens options (Adam, ``--tokens-per-step``
512, held-out KL every 20 steps on 32 windows) for ``--steps`` steps. "reused" cycles 256
windows of 128 tokens, whose states and teacher statistics the stream keeps after their first
forward (they fit its 1 GiB cache), as ``lens.train_tokens: 0`` does; "fresh" runs the frozen
forward and the teacher statistics on every step's new tokens. Wall and process-CPU seconds are
printed; on a shared machine the CPU time is the steadier comparison. The last column
extrapolates to the default config's 600 steps: reused pays the forward on its first 32 steps
only, fresh on all 600.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resdyn.study_b import lens as L  # noqa: E402


def zoo_llama(layers: int, d: int, d_ff: int, vocab: int) -> torch.nn.Module:
    """The default config's zoo shape (llama8/12/16: d 64, 4 heads, 2 KV heads, d_ff 256, vocab 2,048)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=d_ff,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(cfg).eval()


def fit(model, batches, heldout, steps: int, fresh: bool, tokens_per_step: int) -> tuple[float, float]:
    """(wall s, process CPU s) of one lens fit."""
    options = dict(
        steps=steps,
        tokens_per_step=tokens_per_step,
        optimizer="adam",
        lr=3e-3,
        warmup_steps=20,
        eval_every=20,
        patience=3,
    )
    wall, cpu = time.perf_counter(), time.process_time()
    L.train_lens(model, batches, heldout_batches=heldout, fresh_tokens=fresh, tol=0.0, progress=False, **options)
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=96, help="lens steps per fit (default 96)")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens-per-step", type=int, default=512, help="default 512, as config.yaml")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = zoo_llama(args.layers, 64, 256, 2048)
    g = torch.Generator().manual_seed(0)
    tps = args.tokens_per_step
    windows = -(-args.steps * tps // 128)  # fresh: every step's tokens new
    blocks = torch.randint(0, 2048, (max(windows, 256) + 32, 128), generator=g)
    heldout = L.token_batches(blocks[-32:], 8)
    reused, fresh = L.token_batches(blocks[:256], 8), L.token_batches(blocks[:-32], 8)
    print(f"zoo Llama: {args.layers} layers, d 64, vocab 2048; {args.steps} steps of {tps:,} tokens")
    first_epoch = 256 * 128 // tps  # the reused set's steps that run its forwards
    first = fit(model, reused, heldout, first_epoch, False, tps)
    full = fit(model, reused, heldout, args.steps, False, tps)
    new = fit(model, fresh, heldout, args.steps, True, tps)
    cached_step = (full[1] - first[1]) / (args.steps - first_epoch)  # reused steps served from the cache
    print(f"{'fit':>8} {'wall_s':>8} {'cpu_s':>8} {'cpu_s/step':>11} {'cpu_s@600':>10}")
    at600 = first[1] + (600 - first_epoch) * cached_step
    print(f"{'reused':>8} {full[0]:8.1f} {full[1]:8.1f} {cached_step:11.3f} {at600:10.0f}")
    print(f"{'fresh':>8} {new[0]:8.1f} {new[1]:8.1f} {new[1] / args.steps:11.3f} {600 * new[1] / args.steps:10.0f}")
    print("cpu_s/step: reused after its first epoch (from the cache); fresh, every step with its forward")


if __name__ == "__main__":
    main()
