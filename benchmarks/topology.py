"""Speed and memory of resdyn.study_a.topology: correlation_graph and signed_leiden at model scale.

Synthetic activations: d units in groups of 16; pairs of groups load ± on a shared latent factor
(so they are anti-correlated), every group has its own factor, plus unit noise. The tokens are
*generated chunk by chunk* (float32, 1024 tokens at a time) and streamed into correlation_graph,
so the n × d input is never held (100k × 4096 float32 would be 1.6 GB).

Each stage runs in a fresh child process so its peak RSS (resource.getrusage ru_maxrss) is its
own; tracemalloc's peak counts numpy's array allocations (not BLAS / igraph / leidenalg C++
internals). Prints a table; asserts nothing.

    python benchmarks/topology.py            # d = 4096, 100k tokens (minutes)
    python benchmarks/topology.py --quick    # d = 512, 10k tokens (< 1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc

import numpy as np

GROUP = 16  # units per planted group


def rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def token_chunks(n_tokens: int, d: int, seed: int, chunk: int = 1024, group: int = GROUP):
    """Yield float32 (≤ chunk) × d blocks of a signed group-factor model."""
    rng = np.random.default_rng(seed)
    n_groups = max(2, d // group)
    unit_group = np.minimum(np.arange(d) // group, n_groups - 1)
    shared = unit_group // 2  # groups 2p and 2p+1 share factor p ...
    sign = np.where(unit_group % 2 == 0, 1.0, -1.0).astype(np.float32)  # ... with opposite signs
    n_shared = int(shared.max()) + 1
    for start in range(0, n_tokens, chunk):
        b = min(chunk, n_tokens - start)
        f = rng.standard_normal((b, n_shared), dtype=np.float32)
        own = rng.standard_normal((b, n_groups), dtype=np.float32)
        x = rng.standard_normal((b, d), dtype=np.float32)
        x += f[:, shared] * sign
        x += 0.7 * own[:, unit_group]
        yield x


def child(args: argparse.Namespace) -> dict:
    from resdyn.study_a import topology as T

    base = current_rss_mib()
    tracemalloc.start()
    t0 = time.perf_counter()
    if args.stage == "correlation_graph":
        g = T.correlation_graph(token_chunks(args.tokens, args.d, args.seed), top_k=args.top_k)
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        edges = np.asarray(g.get_edgelist(), dtype=np.int64)
        np.savez(args.graph, edges=edges, weight=np.asarray(g.es["weight"]), d=args.d)
        w = np.asarray(g.es["weight"])
        extra = f"{g.ecount()} edges ({(w < 0).mean():.0%} negative)"
    else:
        import igraph as ig

        z = np.load(args.graph)
        g = ig.Graph(n=int(z["d"]), edges=z["edges"].tolist(), directed=False)
        g.es["weight"] = z["weight"].tolist()
        base = current_rss_mib()
        tracemalloc.reset_peak()
        t0 = time.perf_counter()
        part = T.signed_leiden_partition(g, args.resolution, seed=args.seed)
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        truth = np.minimum(np.arange(g.vcount()) // GROUP, max(2, g.vcount() // GROUP) - 1)
        nmi = ig.compare_communities(part.labels.tolist(), truth.tolist(), method="nmi")
        extra = (
            f"γ={part.resolution:g}: {part.n_communities} communities, "
            f"signed modularity {part.modularity:.3f}, NMI vs planted {nmi:.3f}"
        )
    return {
        "stage": args.stage,
        "seconds": seconds,
        "rss_before_mib": base,
        "peak_rss_mib": rss_mib(),
        "tracemalloc_peak_mib": peak / 2**20,
        "result": extra,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="d = 512, 10k tokens")
    ap.add_argument("--d", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--top-k", type=int, default=24)
    ap.add_argument("--resolution", type=float, nargs="+", default=[0.05])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    ap.add_argument("--graph", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.d is None:
        args.d = 512 if args.quick else 4096
    if args.tokens is None:
        args.tokens = 10_000 if args.quick else 100_000
    if len(args.resolution) == 1:
        args.resolution = args.resolution[0]
    if args.stage:
        print(json.dumps(child(args)))
        return

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        graph = os.path.join(tmp, "graph.npz")
        for stage in ("correlation_graph", "signed_leiden"):
            cmd = [sys.executable, __file__, "--stage", stage, "--graph", graph]
            cmd += ["--d", str(args.d), "--tokens", str(args.tokens), "--top-k", str(args.top_k)]
            res = args.resolution if isinstance(args.resolution, list) else [args.resolution]
            cmd += ["--resolution", *map(str, res), "--seed", str(args.seed)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))

    print(
        f"resdyn.study_a.topology benchmark: d={args.d}, tokens={args.tokens}, top_k={args.top_k}, "
        f"threads={os.environ.get('OMP_NUM_THREADS', 'default')}, cpus={os.cpu_count()}"
    )
    head = f"{'stage':<18} {'seconds':>8} {'RSS before':>11} {'peak RSS':>9} {'tracemalloc':>12}  result"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['stage']:<18} {r['seconds']:8.2f} {r['rss_before_mib']:9.0f}Mi "
            f"{r['peak_rss_mib']:7.0f}Mi {r['tracemalloc_peak_mib']:10.1f}Mi  {r['result']}"
        )
    d = args.d
    print(f"(one d×d float64 = {d * d * 8 / 2**20:.0f} MiB; RSS includes Python + numpy + igraph)")


if __name__ == "__main__":
    main()
