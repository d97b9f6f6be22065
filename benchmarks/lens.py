"""Benchmark: tuned-lens training throughput and final held-out KL, resdyn vs tuned-lens.

Prints tables and asserts nothing. Every method trains translators for the same model, on the
same token batches (one batch per step), for the same number of steps, with the same optimiser
(tuned-lens's trainer defaults: SGD + Nesterov, effective lr 1, momentum 0.9, weight decay
1e-3, global grad-norm clip 1, LR decayed linearly to 0); all are then scored by one
evaluator (mean KL(p_final ‖ p_lens) per layer on held-out batches). Wall and process-CPU
seconds are both printed: on a shared machine the CPU time is the steadier comparison.

Methods:
  resdyn      resdyn.study_b.lens.train_lens: one frozen forward per step, all layers' translators as one
              stacked (n, d, d) weight, the KL to the linear head as one fused flash-attention
              call (kl_kernel "flash"), global clipping as tuned-lens.
  resdyn-matmul  the same with kl_kernel "matmul": chunked logits, softmax and two matmuls
              (gradient-only on steps whose loss is not logged): the before/after pair.
  tuned-lens  the ``tuned-lens`` package's TunedLens module driven by the loop of its own trainer
              (tuned_lens/scripts/train_loop.py: one backward per layer, global clip) — its CLI
              trainer does not run on transformers 5. fp32 without autocast (its trainer wraps
              each layer in bf16 autocast, which on a CPU would measure bf16 emulation instead).
              Only when the package imports; otherwise the output says so.
  per-layer   the same loop as tuned-lens, written here with plain nn.Linear translators and the
              model's own readout (the baseline when tuned-lens cannot be imported).

Model: a small Llama built from its config and trained a few steps on a synthetic sparse Markov
chain with copy spans (``--model PATH`` instead loads an HF folder and tokenizes the embedded
KJV corpus with its tokenizer). ``--quick`` finishes in under 2 minutes on 1 CPU thread.

tuned-lens is not a resdyn dependency (it pins torchdata and its trainer needs transformers 4).
To compare against it, use a throwaway venv: ``python3 -m venv /tmp/tlvenv``, then
``pip install torch==<resdyn's torch>`` first (so pip never pulls a CUDA build), then
``pip install tuned-lens==0.2.0 --no-deps`` plus transformers, numpy, pandas, safetensors,
tqdm — its ``tuned_lens.nn`` imports with those alone — and run this file with that python.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resdyn.lm import structure  # noqa: E402
from resdyn.study_b import lens as L  # noqa: E402

# tuned-lens's trainer defaults (ingredients.Optimizer + train_loop): SGD-Nesterov, lr_scale 1,
# momentum 0.9, weight decay 1e-3, grad-norm clip 1, no warmup, LR decayed linearly to 0.
SGD = dict(lr=1.0, momentum=0.9, weight_decay=1e-3, clip=1.0, schedule="linear decay to 0")


# --- model and data ------------------------------------------------------------------------------


def markov_batches(n: int, batch: int, length: int, vocab: int, seed: int) -> list[torch.Tensor]:
    """Sparse random Markov chain with copied spans.

    Each token has 4 successors (probabilities .55/.25/.12/.08) drawn from a Zipf(1.1) law over
    the vocabulary, so a few hundred frequent tokens carry most of the mass and a model learns
    their transitions in tens of steps. The second half of each sequence repeats a span of the
    first, so attention in later layers changes the prediction: the lens has work at every depth.
    """
    g = torch.Generator().manual_seed(seed)
    zipf = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64) ** 1.1
    succ = torch.multinomial(zipf, vocab * 4, replacement=True, generator=torch.Generator().manual_seed(1234)).view(
        vocab, 4
    )
    weights = torch.tensor([0.55, 0.25, 0.12, 0.08])
    out = []
    for _ in range(n):
        x = torch.empty(batch, length, dtype=torch.long)
        x[:, 0] = torch.multinomial(zipf, batch, replacement=True, generator=g)
        for t in range(1, length):
            pick = torch.multinomial(weights, batch, replacement=True, generator=g)
            x[:, t] = succ[x[:, t - 1], pick]
        half = length // 2
        start = torch.randint(0, half // 2, (1,), generator=g).item()
        x[:, half : half + half // 2] = x[:, start : start + half // 2]
        out.append(x)
    return out


def build_llama(d: int, layers: int, vocab: int, seed: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=int(8 * d / 3) // 8 * 8,
        num_hidden_layers=layers,
        num_attention_heads=max(1, d // 32),
        num_key_value_heads=max(1, d // 64),
        max_position_embeddings=1024,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(cfg)


def pretrain(model: nn.Module, batches: list[torch.Tensor], lr: float = 3e-3) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    loss = float("nan")
    for ids in batches:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        loss = out.loss.item()
    return loss


def hf_batches(path: str, n: int, batch: int, length: int, seed: int) -> list[torch.Tensor]:
    from transformers import AutoTokenizer

    from resdyn.lm import corpus

    tok = AutoTokenizer.from_pretrained(path)
    stream = np.concatenate([np.asarray(tok(doc)["input_ids"]) for doc in corpus.kjv_chapters()[:400]])
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(stream) - length, size=(n, batch))
    return [torch.as_tensor(np.stack([stream[s : s + length] for s in row])).long() for row in starts]


# --- the per-layer loops (tuned-lens's trainer structure) -------------------------------------------


def per_layer_loop(
    model: nn.Module, batches: list[torch.Tensor], lens: nn.Module, readout, steps: int, autocast: bool = False
) -> None:
    """tuned-lens's train_loop body: no-grad forward, then one forward+backward per layer.

    ``readout(h, i)``: logits of the translated stream of layer i. KL as in tuned-lens:
    ``Σ p (log p − log_softmax(z))``, mean over tokens; global grad-norm clip, step, then the
    linear-decay schedule (transformers' get_linear_schedule_with_warmup with 0 warmup).
    """
    params = [p for p in lens.parameters() if p.requires_grad]
    opt = torch.optim.SGD(
        params,
        lr=SGD["lr"] * (1 - SGD["momentum"]),
        momentum=SGD["momentum"],
        nesterov=True,
        weight_decay=SGD["weight_decay"],
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, (steps - s) / steps))
    for step in range(steps):
        ids = batches[step % len(batches)]
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
        labels = out.logits.float().log_softmax(dim=-1)
        for i, h in enumerate(out.hidden_states[:-1]):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):  # as its trainer, per layer
                logits = readout(h, i)
                loss = torch.sum(labels.exp() * (labels - logits.log_softmax(-1)), dim=-1).mean()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, SGD["clip"])
        opt.step()
        opt.zero_grad(set_to_none=False)
        sched.step()


def run_plain(model: nn.Module, batches: list[torch.Tensor], steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    n, d = L.n_layers_of(model), model.get_output_embeddings().weight.shape[1]
    lens = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
    for t in lens:
        nn.init.zeros_(t.weight)
        nn.init.zeros_(t.bias)
    per_layer_loop(model, batches, lens, lambda h, i: structure.unembed_logits(model, h + lens[i](h)), steps)
    return torch.stack([t.weight.detach() for t in lens]), torch.stack([t.bias.detach() for t in lens])


def run_tuned_lens(
    model: nn.Module, batches: list[torch.Tensor], steps: int, autocast: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    from tuned_lens.nn import TunedLens  # noqa: PLC0415

    try:
        tl = TunedLens.from_model(model)
    except (NotImplementedError, ValueError):  # a family tuned-lens cannot resolve: our readout
        from tuned_lens.nn.lenses import TunedLensConfig  # noqa: PLC0415

        cfg = TunedLensConfig(
            base_model_name_or_path="bench", d_model=model.config.hidden_size, num_hidden_layers=L.n_layers_of(model)
        )
        tl = TunedLens(L.TunedLensReadout(model), cfg)
    per_layer_loop(model, batches, tl, lambda h, i: tl(h, idx=i), steps, autocast)
    return torch.stack([t.weight.detach() for t in tl]), torch.stack([t.bias.detach() for t in tl])


def run_tuned_lens_bf16(model: nn.Module, batches: list[torch.Tensor], steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """tuned-lens as its trainer runs it: each layer's readout and loss under bf16 autocast."""
    return run_tuned_lens(model, batches, steps, autocast=True)


def run_resdyn_matmul(model: nn.Module, batches: list[torch.Tensor], steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """resdyn with the chunked matmul + softmax KL (``kl_kernel="matmul"``), the fused kernel's reference."""
    return run_resdyn(model, batches, steps, kl_kernel="matmul")


def run_resdyn_bf16(model: nn.Module, batches: list[torch.Tensor], steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    return run_resdyn(model, batches, steps, readout_dtype="bfloat16")


def run_resdyn(model: nn.Module, batches: list[torch.Tensor], steps: int, **extra) -> tuple[torch.Tensor, torch.Tensor]:
    lens = L.train_lens(
        model,
        batches,
        steps=steps,
        optimizer="sgd_nesterov",
        lr=SGD["lr"],
        momentum=SGD["momentum"],
        weight_decay=SGD["weight_decay"],
        clip_grad_norm=SGD["clip"],
        clip_scope="global",
        lr_schedule="linear",
        warmup_steps=0,
        tokens_per_step=None,
        eval_every=steps,
        progress=False,
        **extra,
    )
    return lens.weight, lens.bias


# name -> trainer; "tuned-lens*" rows need the package (see the module docstring).
METHODS = {
    "resdyn": run_resdyn,
    "resdyn-matmul": run_resdyn_matmul,
    "resdyn-bf16": run_resdyn_bf16,
    "tuned-lens": run_tuned_lens,
    "tuned-lens-bf16": run_tuned_lens_bf16,
    "per-layer": run_plain,
}


# --- driver ------------------------------------------------------------------------------------------


def timed(fn, *args) -> tuple[float, float, tuple[torch.Tensor, torch.Tensor]]:
    """(wall seconds, process CPU seconds, result); CPU time is steadier on a shared machine."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn(*args)
    return time.perf_counter() - t0, time.process_time() - c0, out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small model and budget (< 2 min on 1 CPU thread)")
    ap.add_argument("--model", help="an HF model folder instead of the built-in small Llama")
    ap.add_argument("--steps", type=int, help="lens training steps (same for every method)")
    ap.add_argument("--batch", type=int, help="sequences per step")
    ap.add_argument("--seq", type=int, help="tokens per sequence")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: shared cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--train-batches",
        type=int,
        default=16,
        help="distinct training batches, cycled over the steps as the pipeline does (256 windows of 64 tokens = "
        "16 steps of 1024 tokens); 0: a new batch every step (every method then runs the model every step)",
    )
    ap.add_argument("--skip", nargs="*", default=[], choices=list(METHODS))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    q = args.quick
    steps = args.steps or (40 if q else 150)
    batch = args.batch or 4
    seq = args.seq or (128 if q else 256)
    heldout_n = 2 if q else 4
    n_train = min(steps, args.train_batches) if args.train_batches > 0 else steps
    t0 = time.perf_counter()
    if args.model:
        model = load_hf_model(args.model)
        vocab = model.get_output_embeddings().weight.shape[0]
        train = hf_batches(args.model, n_train, batch, seq, args.seed)
        heldout = hf_batches(args.model, heldout_n, batch, seq, args.seed + 1)
        source, pre_loss = args.model, float("nan")
    else:
        d, layers, vocab = (128, 6, 2048) if q else (256, 8, 4096)
        model = build_llama(d, layers, vocab, args.seed)
        pre_steps = 60 if q else 150
        pre_loss = pretrain(model, markov_batches(pre_steps, 4 if q else 8, 128, vocab, args.seed + 10), lr=1e-2)
        train = markov_batches(n_train, batch, seq, vocab, args.seed + 1)
        heldout = markov_batches(heldout_n, batch, seq, vocab, args.seed + 2)
        source = (
            f"random Llama d={d} n_layers={layers} vocab={vocab}, pretrained {pre_steps} steps (loss {pre_loss:.3f})"
        )
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    n = L.n_layers_of(model)
    tokens = steps * batch * seq
    print(f"model: {source}; setup {time.perf_counter() - t0:.1f} s")
    print(
        f"budget: {steps} steps × {batch}×{seq} tokens = {tokens} tokens; SGD-Nesterov {SGD}; "
        f"threads={args.threads}; torch {torch.__version__}"
    )

    with torch.no_grad():
        held = torch.cat([L.layer_major_states(model, b) for b in heldout], dim=1)
        logit_kl = L.layer_kl(model, None, None, held, 1 << 26)

    methods = {k: v for k, v in METHODS.items() if k not in args.skip}
    try:
        from importlib.metadata import version  # noqa: PLC0415

        import tuned_lens  # noqa: F401, PLC0415

        tl_note = f"tuned-lens {version('tuned-lens')} imported"
    except Exception as err:  # noqa: BLE001 — report any import failure, then use the baseline
        methods = {k: v for k, v in methods.items() if not k.startswith("tuned-lens")}
        tl_note = f"tuned-lens NOT importable ({type(err).__name__}: {err}); compared against the per-layer baseline"
    print(tl_note)
    regime = f"{n_train} distinct batches cycled" if n_train < steps else "a new batch every step"
    print(f"data: {regime}")

    results = {}
    for name, fn in methods.items():
        secs, cpu, (w, b) = timed(fn, model, train, steps)
        kl = L.layer_kl(model, w, b, held, 1 << 26)
        results[name] = (secs, kl, cpu)
        print(f"  {name}: {cpu:.1f} CPU s", flush=True)

    ref = "tuned-lens" if "tuned-lens" in results else "per-layer"
    print()
    head = (
        f"{'method':<15} {'wall s':>7} {'cpu s':>7} {'tokens/cpu-s':>12} {'speed vs ' + ref + ' (wall/cpu)':>30} "
        f"{'held-out KL (mean)':>19} {'vs ' + ref:>15}"
    )
    print(head)
    print(f"{'logit lens':<15} {'':>7} {'':>7} {'':>12} {'':>30} {logit_kl.mean():>19.5f} {'':>15}")
    for name, (secs, kl, cpu) in results.items():
        speed = f"{results[ref][0] / secs:.2f}× / {results[ref][2] / cpu:.2f}×" if ref in results else "n/a"
        rel = kl.mean() / results[ref][1].mean() if ref in results else float("nan")
        print(f"{name:<15} {secs:>7.2f} {cpu:>7.2f} {tokens / cpu:>12.0f} {speed:>30} {kl.mean():>19.5f} {rel:>14.4f}×")
    print()
    print("held-out KL per layer:")
    print(f"{'layer':>5} {'logit':>9} " + " ".join(f"{k:>10}" for k in results))
    for layer in range(n):
        print(f"{layer:>5} {logit_kl[layer]:>9.5f} " + " ".join(f"{v[1][layer]:>10.5f}" for v in results.values()))


def load_hf_model(path: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


if __name__ == "__main__":
    main()
