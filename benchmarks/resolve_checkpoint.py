"""Login-node cost of ``resolve_checkpoint`` on a hub snapshot: re-hashing every weight file
(before) vs reading the SHA-256 from the HF cache's blob names (after, one small file verified).

Builds, in a temporary HF cache in the ``hf download`` layout (files in ``blobs/``, linked from
the snapshot), one snapshot with ``--gb`` GB of safetensors shards (8B in bfloat16 is ~16 GB;
the time of the full hash grows linearly with it), a config.json, a tokenizer and a tiny
adapter, then times both ways ``--repeats`` times (the page cache is warm after the first read:
the "before" column is a lower bound for a cold network filesystem). Prints a Markdown table;
asserts nothing.

    python benchmarks/resolve_checkpoint.py --gb 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def build(cache: Path, gb: float, shards: int = 4) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    from helpers import hubcache

    snap = hubcache.add_snapshot(cache, "bench/big", "main")
    cfg = hubcache._shape("llama", 32, 4096, 32, 8, 14336, 128256, 131072)
    (snap / "config.json").write_text(json.dumps(cfg))
    (snap / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    per = int(gb * 1e9 / shards)
    index = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        rng = np.random.default_rng(i)  # distinct content per shard (distinct blobs)
        save_file({f"w{i}": rng.integers(0, 255, per, dtype=np.uint8)}, str(snap / name))
        index[f"w{i}"] = name
    (snap / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    hubcache.to_blob_layout(snap)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=2.0, help="weights in the snapshot (GB)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "hub"
        build(cache, args.gb)
        os.environ.update(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
        from resdyn import io
        from resdyn.lm import models

        spec = {
            "model": "big",
            "checkpoint": "main",
            "source": "hf",
            "repo": "bench/big",
            "revision": "main",
            "dtype": "bfloat16",
        }
        after_fn = models.weights_manifest
        times: dict[str, list[float]] = {"before (full sha256)": [], "after (blob names)": []}
        hashes = set()
        for _ in range(args.repeats):
            for label, manifest in (
                ("before (full sha256)", lambda f, p, verify=1: io.manifest(f, p)),
                ("after (blob names)", after_fn),
            ):
                models.weights_manifest = manifest
                t0 = time.perf_counter()
                hashes.add(models.resolve_checkpoint(spec)["content_hash"])
                times[label].append(time.perf_counter() - t0)
        models.weights_manifest = after_fn
    print(
        f"resolve_checkpoint on a {args.gb:g} GB snapshot (4 shards, blob layout), {args.repeats} repeats, "
        f"load {os.getloadavg()[0]:.2f}; same content hash both ways: {len(hashes) == 1}\n"
    )
    print("| method | median s | min s |\n|---|---|---|")
    for label, ts in times.items():
        print(f"| {label} | {statistics.median(ts):.3f} | {min(ts):.3f} |")


if __name__ == "__main__":
    main()
