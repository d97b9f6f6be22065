"""Speed and memory of the sublayer-Jacobian engine (resdyn.study_a.jacobian). Prints a table; asserts nothing.

    .venv/bin/python benchmarks/jacobian.py [--quick] [--device cuda] [--model PATH] [--threads N]

(a) a small random Llama (8 layers, d = 64, T = 128; a stand-in for a zoo model, or ``--model``
    a saved HF folder): seconds per sample for all 2·L sublayer Jacobians at the last token
    (one forward pass + 2·L Jacobians), for the default "structured" method and the plain
    forward-mode "jvp" reference.
(b) one Llama-3.1-8B-shaped layer with random weights (d = 4096, d_ff = 14336, 32 query / 8 KV
    heads, T = 128; ``--quick``: d = 1024, d_ff = 3584, 8 / 2 heads), one sample: attention half
    and MLP half, seconds, FLOPs by the analytic count below, GFLOP/s, and the fraction of this
    machine's fp32 matmul throughput measured in the same run (best of 3 square matmuls);
    peak memory above the resident baseline. The matmul reference is measured before and after
    each case and the best is used (other jobs may share the machine).
(c) the baseline a user would otherwise write: reverse mode, one VJP per output row of the
    chosen position, through the full-sequence sublayer built from the HF layer's own modules
    (``h + self_attn(input_layernorm(h))`` with HF's mask and RoPE; ``m + mlp(norm(m))``), on the
    same inputs. Only ``--rows`` rows are timed and the time is extrapolated to d rows (marked).

(g) ``--generic``: the generic path (resdyn.lm.generic: forward mode through HF's modules,
    other positions' keys/values frozen) against the hand-written structured engine, per family,
    on random models of one shape (``--generic-d``, 4 layers, T = ``--length``): seconds per
    sample for all sublayer Jacobians at the last token, after a warm-up sample (which also runs
    the generic path's load-time self-check, timed separately), the ratio, and the largest
    difference between the two engines' Jacobians. Gemma 4 has no generic template.

Analytic FLOP count of the structured method, per position (H heads of width hd, Hkv KV heads,
d_q = H·hd, d_kv = Hkv·hd, S ≤ T visible keys):
  attention  2·d·d_q·d              W_o times the d tangent columns of the head outputs
           + 4·d·H·S·hd              forward-mode core: tangent scores and tangent values
           + 5·d·(d_q + 2·d_kv)      rescaling W_q, W_k, W_v by the pre-norm Jacobian
  MLP        2·d·d_ff·d              W_down times (diag(act'·up) W_gate + diag(act) W_up)
           + 3·d_ff·d + 6·d²         forming that matrix; the RMSNorm Jacobian (diag + rank 1)
Only these are counted (the rest is O(d·d_ff) per sample). Peak memory: CUDA
``max_memory_allocated``; CPU the process's peak RSS (VmHWM, reset per phase via
/proc/self/clear_refs) minus the RSS before the phase, after malloc_trim and with glibc told
to mmap every block ≥ 64 KiB, in a separate untimed run of the phase.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from resdyn.lm import decompose, structure
from resdyn.study_a import jacobian  # noqa: E402

# ----------------------------------------------------------------------------------------------
# Measurement helpers
# ----------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeats: int = 1) -> tuple[float, object]:
    """Best wall time of ``repeats`` calls (after synchronising the device) and the last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        result = fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best, result


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _mmap_threshold(nbytes: int, trim: bool = False) -> None:
    """Set glibc's M_MMAP_THRESHOLD (a fixed value also disables its dynamic adjustment); with
    ``trim``, return the heap's free pages to the OS (malloc_trim), so that reusing them later
    shows up in the RSS again."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, nbytes)
        if trim:
            libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak memory of a block above the memory in use when it starts (bytes).

    On CPU, the heap's free pages are returned to the OS first and glibc is told to mmap every
    allocation ≥ 64 KiB inside the block, so the peak RSS measures the block's own working
    memory (to page granularity); this makes
    allocation slower, so blocks measured here are not the timed ones. Afterwards the threshold
    is set to 32 MiB (the ceiling of glibc's dynamic threshold)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak = 0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            _mmap_threshold(1 << 16, trim=True)
            try:  # reset VmHWM to the current RSS (Linux ≥ 4.0)
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                pass
            self.base = _rss_bytes("VmRSS")
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self.base
        else:
            self.peak = _rss_bytes("VmHWM") - self.base
            _mmap_threshold(32 << 20)
        return False


def matmul_throughput(n: int, device: torch.device) -> float:
    """fp32 GFLOP/s of an n×n by n×n matmul on this device (best of 3, TF32 off)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device)
    b = torch.randn(n, n, generator=gen).to(device)
    with jacobian.full_fp32_matmul():
        a @ b  # warm-up
        seconds, _ = timed(lambda: a @ b, device, repeats=3)
    return 2 * n**3 / seconds / 1e9


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------


def random_llama(d: int, d_ff: int, heads: int, kv_heads: int, layers: int, device: torch.device, seed: int = 0):
    config = tf.LlamaConfig(
        vocab_size=256,
        hidden_size=d,
        intermediate_size=d_ff,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    return tf.LlamaForCausalLM(config).eval().to(device)


def random_ids(vocab: int, length: int, seed: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (length,), generator=gen).to(device)


# ----------------------------------------------------------------------------------------------
# (a) seconds per sample
# ----------------------------------------------------------------------------------------------


def bench_per_sample(model, length: int, samples: int, device: torch.device) -> list[tuple]:
    n = structure.n_layers(model)
    vocab = structure.text_model(model).embed_tokens.num_embeddings
    rows = []
    for method in ("structured", "jvp"):
        engine = jacobian.JacobianEngine(model, method=method)
        engine.compute(random_ids(vocab, length, 99, device))  # warm-up
        times = [
            timed(lambda s=s: engine.compute(random_ids(vocab, length, s, device)), device)[0] for s in range(samples)
        ]
        rows.append((f"(a) all {2 * n} sublayers, {method}", statistics.median(times), samples))
    return rows


def bench_core_constants(model, length: int, samples: int, device: torch.device) -> list[tuple]:
    """(a') Forward mode through every layer's attention core at the last token, batched over d
    tangents as in ``attn_jacobian``: the core's constants (RoPE tables, score scale) closed over
    (a dual times a plain tensor: PyTorch's zero-tangent path, a Python decomposition per op
    under vmap) versus passed as primals with zero tangents (what the engine does). Seconds per
    sample over all layers, and the largest difference between the two (0: the same numbers)."""
    adapters = [a.to_float32() for a in decompose.sublayers(model)]
    vocab = structure.text_model(model).embed_tokens.num_embeddings
    d = structure.hidden_size(model)

    @torch.no_grad()  # forward mode needs no autograd graph
    def one_sample(seed: int, lifted: bool) -> list[torch.Tensor]:
        ids = random_ids(vocab, length, seed, device)
        ctx = decompose.prepare(model, ids[None])
        states = structure.residual_states(model, ids[None])[0].float()
        outs = []
        for a in adapters:
            h = states[a.index]
            core = a.attention_core(h, length - 1, ctx)
            pre = a.norm("attn_pre")
            n = h[-1] if pre is None else pre(h[-1])
            primals = (a.project_q(n), *a.project_kv(n))
            gen = torch.Generator().manual_seed(seed)
            tangents = tuple(torch.randn(d, *p.shape, generator=gen).to(device) for p in primals)
            if lifted:

                def column(*t, core=core, primals=primals):
                    return core.jvp(primals, t)[1]
            else:

                def column(*t, core=core, primals=primals):
                    return torch.func.jvp(core, primals, t)[1]

            outs.append(torch.func.vmap(column)(*tangents))
        return outs

    rows, results = [], {}
    for lifted in (False, True):
        one_sample(99, lifted)  # warm-up
        times = [timed(lambda s=s: one_sample(s, lifted), device)[0] for s in range(samples)]
        results[lifted] = one_sample(0, lifted)
        rows.append(
            (
                f"(a') attention cores, constants {'as zero-tangent primals' if lifted else 'closed over'}",
                statistics.median(times),
                samples,
            )
        )
    diff = max(float((x - y).abs().max()) for x, y in zip(results[False], results[True]))
    return rows, diff


# ----------------------------------------------------------------------------------------------
# (b) one big layer, (c) the reverse-mode baseline
# ----------------------------------------------------------------------------------------------


def flops_attention(d: int, heads: int, kv_heads: int, hd: int, visible: int) -> float:
    return 2 * d * heads * hd * d + 4 * d * heads * visible * hd + 5 * d * (heads + 2 * kv_heads) * hd


def flops_mlp(d: int, d_ff: int) -> float:
    return 2 * d * d_ff * d + 3 * d_ff * d + 6 * d * d


def hf_sublayers(model, ids: torch.Tensor):
    """Full-sequence attention and MLP halves of layer 0 written with the HF layer's modules,
    with the mask and RoPE HF itself passes to the layer."""
    layer = structure.decoder_layers(model)[0]
    captured = {}
    handle = layer.register_forward_pre_hook(lambda _m, _a, kw: captured.update(kw), with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=ids[None], use_cache=False)
    finally:
        handle.remove()

    def attn_half(h: torch.Tensor) -> torch.Tensor:
        out, _ = layer.self_attn(
            hidden_states=layer.input_layernorm(h),
            position_embeddings=captured["position_embeddings"],
            attention_mask=captured["attention_mask"],
        )
        return h + out

    def mlp_half(m: torch.Tensor) -> torch.Tensor:
        return m + layer.mlp(layer.post_attention_layernorm(m))

    return attn_half, mlp_half


def reverse_rows(fn, x: torch.Tensor, t: int, rows: int, device: torch.device) -> tuple[float, torch.Tensor]:
    """Seconds per row of the baseline (one VJP per output row through the full sequence) and
    the rows computed (rows, d)."""
    x = x.detach().clone().requires_grad_(True)
    with jacobian.full_fp32_matmul():
        start_forward = time.perf_counter()
        out = fn(x[None])[0, t]
        _sync(device)
        forward = time.perf_counter() - start_forward
        grads = []
        _sync(device)
        start = time.perf_counter()
        for i in range(rows):
            (g,) = torch.autograd.grad(out[i], x, retain_graph=True)
            grads.append(g[t])
        _sync(device)
        per_row = (time.perf_counter() - start) / rows
    return per_row + forward / x.shape[-1], torch.stack(grads)


def bench_layer(args, device: torch.device) -> tuple[list[tuple], list[tuple], float, str]:
    if args.quick:
        d, d_ff, heads, kv_heads = 1024, 3584, 8, 2
    else:
        d, d_ff, heads, kv_heads = 4096, 14336, 32, 8
    hd, length, t = d // heads, args.length, args.length - 1
    model = random_llama(d, d_ff, heads, kv_heads, 1, device)
    ids = random_ids(256, length, 7, device)
    matmul_n = args.matmul_n or (2048 if args.quick else 4096)
    peak_gflops = matmul_throughput(matmul_n, device)

    engine = jacobian.JacobianEngine(model, [0])
    adapter = engine.fp32[0]
    with torch.no_grad():
        ctx = decompose.prepare(model, ids[None])
        states = decompose.forward_boundaries(engine.adapters, ctx)[0]
    h, m = states[0], states[1]

    def attention():
        with jacobian.full_fp32_matmul(), torch.no_grad():
            return jacobian.attn_jacobian(adapter, h, t, ctx)

    def mlp():
        with jacobian.full_fp32_matmul(), torch.no_grad():
            return jacobian.mlp_jacobian(adapter, m, t, ctx)

    attention(), mlp()  # warm-up
    rows_b, rows_c, results = [], [], []
    attn_half, mlp_half = hf_sublayers(model, ids)
    cases = [
        ("attention", attention, flops_attention(d, heads, kv_heads, hd, t + 1), attn_half, h),
        ("MLP", mlp, flops_mlp(d, d_ff), mlp_half, m),
    ]
    for name, fn, flops, baseline_fn, x in cases:
        seconds, jac = timed(fn, device, repeats=args.repeats)
        with PeakMemory(device) as mem:
            fn()
        per_row, baseline_rows = reverse_rows(baseline_fn, x, t, args.rows, device)
        with PeakMemory(device) as mem_c:
            reverse_rows(baseline_fn, x, t, 1, device)
        peak_gflops = max(peak_gflops, matmul_throughput(matmul_n, device))  # the load may vary
        results.append((name, seconds, flops, jac, mem.peak, per_row, baseline_rows, mem_c.peak))
    for name, seconds, flops, jac, mem, per_row, baseline_rows, mem_c in results:
        gflops = flops / seconds / 1e9
        rows_b.append((f"(b) {name} half", seconds, flops / 1e9, gflops, gflops / peak_gflops, mem))
        err = (baseline_rows - jac[: args.rows]).abs().max().item()
        extrapolated = per_row * d
        rows_c.append((f"(c) {name} half, reverse rows", extrapolated, args.rows, extrapolated / seconds, mem_c, err))
    shape = f"d={d}, d_ff={d_ff}, heads={heads}/{kv_heads}, T={length}"
    return rows_b, rows_c, peak_gflops, shape


# ----------------------------------------------------------------------------------------------


def family_models(d: int, device: torch.device) -> dict[str, torch.nn.Module]:
    """One random 4-layer model per family with an adapter (Gemma 4 excepted: no template), of
    width d, d_ff = 4d, d/32 heads (half as many KV heads), each family's features on."""
    heads = max(2, d // 32)
    common = dict(
        vocab_size=512,
        hidden_size=d,
        intermediate_size=4 * d,
        num_hidden_layers=4,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=4096,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    alternate = ["sliding_attention", "full_attention"] * 2
    window = 32
    builders = {
        "llama": (tf.LlamaForCausalLM, tf.LlamaConfig(**common)),
        "mistral": (tf.MistralForCausalLM, tf.MistralConfig(**common, sliding_window=window)),
        "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config(**common)),
        "olmo2": (tf.Olmo2ForCausalLM, tf.Olmo2Config(**common)),
        "gpt2": (tf.GPT2LMHeadModel, tf.GPT2Config(vocab_size=512, n_embd=d, n_inner=4 * d, n_layer=4, n_head=heads)),
        "gpt_neox (parallel)": (
            tf.GPTNeoXForCausalLM,
            tf.GPTNeoXConfig(
                vocab_size=512,
                hidden_size=d,
                intermediate_size=4 * d,
                num_hidden_layers=4,
                num_attention_heads=heads,
                rotary_pct=0.25,
            ),
        ),
        "qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config(**common, head_dim=d // heads)),
        "gemma2": (
            tf.Gemma2ForCausalLM,
            tf.Gemma2Config(**common, head_dim=d // heads, layer_types=alternate, sliding_window=window),
        ),
        "gemma3": (
            tf.Gemma3ForCausalLM,
            tf.Gemma3TextConfig(**common, head_dim=d // heads, layer_types=alternate, sliding_window=window),
        ),
        "phi3": (tf.Phi3ForCausalLM, tf.Phi3Config(**common, partial_rotary_factor=0.5)),
        "granite": (
            tf.GraniteForCausalLM,
            tf.GraniteConfig(**common, residual_multiplier=0.2, attention_multiplier=0.05, embedding_multiplier=12.0),
        ),
        "smollm3": (tf.SmolLM3ForCausalLM, tf.SmolLM3Config(**common)),
    }
    out = {}
    for name, (cls, config) in builders.items():
        config._attn_implementation = "eager"
        torch.manual_seed(0)
        out[name] = cls(config).eval().to(device)
    return out


def bench_generic(d: int, length: int, samples: int, device: torch.device) -> list[tuple]:
    """(family, structured s/sample, generic s/sample, self-check s, max |Δ|) per family."""
    rows = []
    for name, model in family_models(d, device).items():
        ids = [random_ids(512, length, s, device) for s in range(samples + 1)]
        engine = jacobian.JacobianEngine(model)
        reference = engine.compute(ids[0])
        hand = [timed(lambda x=x: engine.compute(x), device)[0] for x in ids[1:]]
        decompose.use_generic(model)
        generic = jacobian.JacobianEngine(model)
        first, jacs = timed(lambda: generic.compute(ids[0]), device)  # includes the self-check
        gen = [timed(lambda x=x: generic.compute(x), device)[0] for x in ids[1:]]
        decompose.use_generic(model, False)
        diff = max(float((jacs[k] - reference[k]).abs().max()) for k in reference)
        rows.append((name, statistics.median(hand), statistics.median(gen), first - statistics.median(gen), diff))
        del model
    return rows


def print_generic(rows: list[tuple], d: int, length: int, samples: int) -> None:
    print(
        f"\n(g) generic path vs hand-written (structured) engine, 4 layers, d={d}, d_ff={4 * d}, T={length}, "
        f"last token, median of {samples} samples"
    )
    print(
        f"{'family':22s} {'structured s':>13s} {'generic s':>10s} {'ratio':>7s} {'self-check s':>13s} {'max |Δ|':>9s}"
    )
    for name, hand, gen, check, diff in rows:
        print(f"{name:22s} {hand:13.3f} {gen:10.3f} {gen / hand:6.1f}× {check:13.2f} {diff:9.1e}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small layer for (b)/(c); < 2 min on 2 CPU cores")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--model", type=Path, help="a saved HF model folder to use for (a) instead of the random Llama")
    parser.add_argument("--length", type=int, default=128, help="tokens per sample T (default 128)")
    parser.add_argument("--samples", type=int, default=None, help="samples timed in (a) (default 3, quick 2)")
    parser.add_argument("--rows", type=int, default=None, help="baseline rows timed in (c) (default 32, quick 8)")
    parser.add_argument("--repeats", type=int, default=None, help="timing repeats in (b) (best of; default 3, quick 2)")
    parser.add_argument("--matmul-n", type=int, default=None, help="matmul size for the throughput reference")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--generic", action="store_true", help="only (g): generic path vs hand-written per family")
    parser.add_argument("--generic-d", type=int, default=256, help="model width d of (g) (default 256)")
    args = parser.parse_args(argv)
    args.samples = args.samples or (2 if args.quick else 3)
    args.rows = args.rows or (8 if args.quick else 32)
    args.repeats = args.repeats or (2 if args.quick else 3)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device available")

    start = time.perf_counter()
    if args.generic:
        rows_g = bench_generic(args.generic_d, args.length, args.samples, device)
        where = (
            torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else (
                f"CPU, {torch.get_num_threads()} threads, "
                f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
            )
        )
        print(f"\nresdyn.study_a.jacobian benchmark — {where}, torch {torch.__version__}")
        print_generic(rows_g, args.generic_d, args.length, args.samples)
        print(f"Total {time.perf_counter() - start:.0f} s.")
        return
    if args.model:
        model = tf.AutoModelForCausalLM.from_pretrained(args.model).eval().to(device)
        label = str(args.model)
    else:
        model = random_llama(64, 256, 4, 2, 8, device)
        label = "random Llama, 8 layers, d=64, d_ff=256, heads=4/2"
    rows_a = bench_per_sample(model, args.length, args.samples, device)
    rows_core, core_diff = bench_core_constants(model, args.length, args.samples, device)
    del model
    rows_b, rows_c, peak, shape = bench_layer(args, device)

    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:  # oversubscribed cores make OpenMP's spin-waits dominate small ops: show the load
        load = os.getloadavg()[0]
        where = f"CPU, {torch.get_num_threads()} threads, load average {load:.1f} on {os.cpu_count()} cores"
    print(f"\nresdyn.study_a.jacobian benchmark — {where}, torch {torch.__version__}, T={args.length}, last token")
    print(f"measured fp32 matmul throughput: {peak:.1f} GFLOP/s\n")
    print(f"(a) {label}")
    print(f"{'case':44s} {'s/sample':>10s} {'samples':>8s}")
    for name, seconds, n in rows_a:
        print(f"{name:44s} {seconds:10.3f} {n:8d}")
    print(f"{'case':58s} {'s/sample':>10s} {'samples':>8s} {'ratio':>7s}")
    for name, seconds, n in rows_core:
        print(f"{name:58s} {seconds:10.3f} {n:8d} {rows_core[0][1] / seconds:6.2f}×")
    print(f"largest difference between the two: {core_diff:.1e}")
    print(f"\n(b) one Llama-3.1-8B-shaped layer ({shape}), one sample")
    print(f"{'case':44s} {'seconds':>10s} {'GFLOP':>9s} {'GFLOP/s':>9s} {'of matmul':>10s} {'peak MiB':>9s}")
    for name, seconds, gflop, gflops, frac, mem in rows_b:
        print(f"{name:44s} {seconds:10.3f} {gflop:9.1f} {gflops:9.1f} {frac:10.0%} {mem / 2**20:9.0f}")
    print("\n(c) baseline: one VJP per output row through the full-sequence HF sublayer")
    print(f"{'case':44s} {'seconds':>10s} {'rows run':>9s} {'ratio':>9s} {'peak MiB':>9s} {'max |Δ|':>9s}")
    for name, seconds, rows, ratio, mem, err in rows_c:
        print(f"{name:44s} {seconds:9.1f}* {rows:9d} {ratio:8.0f}× {mem / 2**20:9.0f} {err:9.1e}")
    print(
        f"\n* extrapolated to all d rows from the rows run; ratio = baseline / structured; max |Δ| = largest "
        f"difference between the baseline rows and the structured Jacobian's rows. "
        f"Total {time.perf_counter() - start:.0f} s."
    )


if __name__ == "__main__":
    main()
