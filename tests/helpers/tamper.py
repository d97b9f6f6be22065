"""Damage a finished run on purpose and check that `resdyn verify` and/or Snakemake notice.

Used by tests/test_tamper.py (one finished run per session, a fresh copy per tamper) and runnable
by hand to print the table:

    python tests/helpers/tamper.py /tmp/tamper-work      # builds the run there once, then tampers copies

The run is a workflow copy with a *local* model (random tiny Llama saved with save_pretrained,
its own BPE tokenizer) and a *text* corpus, so that local weights, tokenizer files and corpus
text — the sources users edit by hand — are all in the DAG.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import yaml

try:
    from helpers import codecache
except ImportError:  # run as a script (python tests/helpers/tamper.py DIR): tests/helpers is on the path
    import codecache

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
IGNORE = shutil.ignore_patterns(
    ".venv",
    ".git",
    "results",
    "models",
    "logs",
    ".snakemake",
    "report.html",
    "__pycache__",
    ".pytest_cache",
    "out",
    "*.egg-info",
    "benchmarks",
)
CONFIG = "configs/tamper.yaml"
MODEL, CKPT = "loc", "local"
DATA_DIRS = ("results", "models", "local", "corpus", "configs", ".snakemake")


def env_for(work: Path) -> dict:
    # The copy's own resdyn must be imported (the venv's editable install points elsewhere).
    return {**os.environ, "PYTHONPATH": str(work), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def run(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=work, env=env_for(work), capture_output=True, text=True)


def snakemake(work: Path, *args: str, config: str = CONFIG) -> subprocess.CompletedProcess:
    return run(work, str(BIN / "snakemake"), "--configfile", config, *args)


def verify(work: Path) -> subprocess.CompletedProcess:
    return run(work, str(BIN / "resdyn"), "verify")


def planned_rules(work: Path, config: str = CONFIG) -> set[str]:
    """Rules a dry run would execute (empty when nothing is to be done)."""
    proc = snakemake(work, "-n", config=config)
    if proc.returncode != 0:
        raise AssertionError(f"dry run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    if "Nothing to be done" in proc.stdout + proc.stderr or "Job stats:" not in proc.stdout:
        return set()
    stats = proc.stdout.split("Job stats:", 1)[1]
    rules = set()
    for line in stats.splitlines():
        m = re.fullmatch(r"\s*([A-Za-z_]\w*)\s+(\d+)\s*", line)
        if m and m[1] != "total":
            rules.add(m[1])
        if line.strip().startswith("total"):
            break
    return rules - {"all"}


# --- the finished run -------------------------------------------------------------------------


def make_corpus(work: Path) -> list[str]:
    """Two UTF-8 text files of KJV chapters (blank-line separated): the `text` dataset."""
    from resdyn.lm import corpus

    chapters = corpus.kjv_chapters()[:40]
    (work / "corpus").mkdir(parents=True, exist_ok=True)
    paths = []
    for i, part in enumerate((chapters[:20], chapters[20:])):
        path = work / "corpus" / f"part{i}.txt"
        path.write_text("\n\n".join(part) + "\n", encoding="utf-8")
        paths.append(f"corpus/part{i}.txt")
    return paths


def make_local_model(folder: Path, docs: list[str], seed: int = 0) -> None:
    """A random tiny Llama (4 layers, d=32) with its own byte-level BPE tokenizer, HF format."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from resdyn.lm import corpus

    folder.mkdir(parents=True, exist_ok=True)
    corpus.train_tokenizer(docs, 300, folder)
    vocab = len(AutoTokenizer.from_pretrained(str(folder)))
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(str(folder), safe_serialization=True)


def tamper_config(paths: list[str]) -> dict:
    """The smoke preset's sizes, on the local model and the text corpus."""
    smoke = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    cfg = {k: v for k, v in smoke.items() if k not in ("datasets", "models", "scaling", "tokenizer")}
    cfg["datasets"] = {"txt": {"source": "text", "paths": paths, "split_paragraphs": True, "heldout_fraction": 0.2}}
    cfg["models"] = {
        MODEL: {
            "source": "local",
            "dataset": "txt",
            "family": "llama",
            "path": "local/m",
            "n_layers": 4,
            "d_model": 32,
            "n_heads": 4,
            "n_kv_heads": 2,
            "d_ff": 64,
            "max_position": 64,
        }
    }
    cfg["jacobian"] = {**cfg["jacobian"], "layers_per_job": 2}
    cfg["scaling"] = {"groups": {"llama": [MODEL]}}
    return cfg


def build(work: Path, cores: int = 2, code_cache: Path | None = None) -> Path:
    """Copy the workflow to ``work``, make the local model and corpus, run it to the end
    (``code_cache``: a seed of tests/helpers/codecache.py to start its code versions from)."""
    shutil.copytree(ROOT, work, ignore=IGNORE)
    if code_cache is not None:
        codecache.carry(ROOT, work, code_cache)
    paths = make_corpus(work)
    docs = [d for p in paths for d in (work / p).read_text().split("\n\n")]
    make_local_model(work / "local" / "m", docs)
    (work / CONFIG).write_text(yaml.safe_dump(tamper_config(paths), sort_keys=True))
    proc = snakemake(work, "--cores", str(cores))
    if proc.returncode != 0:
        raise AssertionError(f"tamper run failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return work


def fresh_copy(finished: Path, dest: Path) -> Path:
    """A full copy of the finished run (mtimes kept, so Snakemake sees it as up to date), its rules'
    code versions carried over (tests/helpers/codecache.py)."""
    shutil.copytree(finished, dest, symlinks=True)
    return codecache.carry(finished, dest)


# --- tampers ----------------------------------------------------------------------------------

R = f"results/{MODEL}/{CKPT}"


@dataclass
class Tamper:
    name: str
    apply: Callable[[Path], None]
    #: (problem kind, text the line must contain) that `resdyn verify` must print; None: not expected
    verify: tuple[str, str] | None
    #: rules a dry run must plan (Snakemake notices by itself); None: not expected
    rebuild: set[str] | None = None


def _flip_h5(path: Path, dataset: str) -> None:
    with h5py.File(path, "r+") as f:
        ds = f[dataset]
        a = ds[()]
        a.flat[0] = a.flat[0] + 1.0
        ds[...] = a


def _edit_text(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def _edit_tsv(path: Path) -> None:
    lines = path.read_text().splitlines()
    cells = lines[1].split("\t")
    cells[-2 if len(cells) > 1 else 0] = "12345"
    lines[1] = "\t".join(cells)
    path.write_text("\n".join(lines) + "\n")


def _swap_weights(work: Path) -> None:
    """Replace the local model's weights with another random model of the same shapes."""
    from safetensors.torch import load_file, save_file

    path = work / "local" / "m" / "model.safetensors"
    tensors = load_file(str(path))
    rng = np.random.default_rng(1)
    import torch

    swapped = {
        k: torch.as_tensor(rng.normal(0, 0.02, v.shape).astype(np.float32)) if v.ndim == 2 else v
        for k, v in tensors.items()
    }
    save_file(swapped, str(path), metadata={"format": "pt"})


def _stale_chain(work: Path) -> None:
    """Rebuild phases.json legitimately under a changed config, leaving its consumers as they were."""
    cfg = yaml.safe_load((work / CONFIG).read_text())
    cfg["phases"]["smoothing"] = "none"
    (work / "configs" / "stale.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(
        work,
        "--cores",
        "1",
        "--allowed-rules",
        "phases",
        "--forcerun",
        "phases",
        f"{R}/phases.json",
        config="configs/stale.yaml",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _sidecar_of_missing(work: Path) -> None:
    (work / R / "bootstrap.tsv").unlink()


def _corrupt_sidecar(work: Path) -> None:
    (work / R / "rss.tsv.prov.json").write_text("{ not json")


def _edit_checkpoint_record(work: Path) -> None:
    path = work / "models" / MODEL / CKPT / "checkpoint.json"
    rec = json.loads(path.read_text())
    rec["content_hash"] = "0" * 64
    path.write_text(json.dumps(rec, indent=2))


def _add_file_to_dir(work: Path) -> None:
    (work / R / "lens" / "extra.txt").write_text("not made by the lens rule\n")


def _remove_file_from_dir(work: Path) -> None:
    next((work / R / "activations").glob("layer*.h5")).unlink()


def _replace_png(work: Path) -> None:
    from PIL import Image

    png = work / "results" / "figures" / MODEL / CKPT / "funnel.png"
    Image.new("RGB", (10, 10), "white").save(png)


def _orphan_artifact(work: Path) -> None:
    (work / "results" / MODEL / "notes.tsv").write_text("a\tb\n1\t2\n")


TAMPERS = [
    Tamper(
        "flipped value in a Jacobian HDF5",
        lambda w: _flip_h5(next((w / R / "jacobians").rglob("layer000.h5")), "attn/mean"),
        ("changed output", "jacobians/layers000-001: differs from what rule jacobians wrote (changed layer000.h5"),
    ),
    Tamper(
        "deleted sidecar of a Jacobian block",
        lambda w: (w / R / "jacobians" / "layers002-003.prov.json").unlink(),
        ("missing sidecar", "jacobians/layers002-003"),
    ),
    Tamper(
        "swapped local model weights",
        _swap_weights,
        ("changed input", "local/m/model.safetensors"),
        {"resolve_checkpoint", "jacobians", "lens"},
    ),
    Tamper(
        "edited final table (scorecard.tsv)",
        lambda w: _edit_tsv(w / "results" / MODEL / "scorecard.tsv"),
        ("changed output", f"results/{MODEL}/scorecard.tsv"),
    ),
    Tamper(
        "edited intermediate table (spectra.tsv)",
        lambda w: _edit_tsv(w / R / "spectra.tsv"),
        ("changed output", f"{R}/spectra.tsv"),
        {"checkpoints", "bridge"},
    ),
    Tamper(
        "edited corpus text file",
        lambda w: _edit_text(w / "corpus" / "part0.txt", "the", "a"),
        ("changed input", "corpus/part0.txt"),
        {"corpus", "samples", "lens_tokens", "jacobians"},
    ),
    Tamper(
        "edited tokenizer file (local model)",
        lambda w: _edit_text(w / "local" / "m" / "tokenizer.json", '"<|endoftext|>"', '"<|end|>"'),
        ("changed input", "local/m/tokenizer.json"),
        {"resolve_checkpoint", "samples"},
    ),
    Tamper(
        "edited model config.json (local model)",
        lambda w: _edit_text(w / "local" / "m" / "config.json", '"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-05'),
        ("changed input", "local/m/config.json"),
        {"resolve_checkpoint", "jacobians"},
    ),
    Tamper(
        "sidecar without artifact (bootstrap.tsv deleted)",
        _sidecar_of_missing,
        ("sidecar without artifact", f"{R}/bootstrap.tsv.prov.json"),
        {"bootstrap"},
    ),
    Tamper(
        "stale chain (phases.json rebuilt, consumers not)",
        _stale_chain,
        ("stale chain", f"made from a version of {R}/phases.json"),
        {"phase_metrics", "bridge", "causal"},
    ),
    Tamper(
        "corrupted samples.h5 (flipped token id)",
        lambda w: _flip_h5(w / "results" / MODEL / "samples.h5", "input_ids"),
        ("changed output", f"results/{MODEL}/samples.h5"),
    ),
    Tamper(
        "edited checkpoint.json", _edit_checkpoint_record, ("changed output", f"models/{MODEL}/{CKPT}/checkpoint.json")
    ),
    Tamper("file added inside a directory output (lens/)", _add_file_to_dir, ("changed output", "added extra.txt")),
    Tamper(
        "file removed from a directory output (activations/)",
        _remove_file_from_dir,
        ("changed output", "removed layer00"),
    ),
    Tamper("figure PNG replaced", _replace_png, ("changed output", f"results/figures/{MODEL}/{CKPT}/funnel.png")),
    Tamper("corrupt sidecar (not JSON)", _corrupt_sidecar, ("unreadable sidecar", f"{R}/rss.tsv")),
    Tamper(
        "artifact without provenance (file dropped into results/)",
        _orphan_artifact,
        ("missing sidecar", f"results/{MODEL}/notes.tsv"),
    ),
]


def check(tamper: Tamper, work: Path) -> dict:
    """Apply ``tamper`` to ``work`` (a fresh copy); return what verify and Snakemake reported."""
    tamper.apply(work)
    out: dict = {"tamper": tamper.name}
    proc = verify(work)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    out["verify_rc"] = proc.returncode
    out["verify_lines"] = lines
    if tamper.verify:
        kind, text = tamper.verify
        out["verify"] = any(ln.startswith(kind + ":") and text in ln for ln in lines)
    if tamper.rebuild is not None:
        planned = planned_rules(work)
        out["planned"] = planned
        out["snakemake"] = tamper.rebuild <= planned
    return out


def main(base: str) -> int:
    base_path = Path(base)
    finished = base_path / "finished"
    if not (finished / "results").is_dir():
        build(finished)
    print("| tamper | verify | snakemake dry run |\n|---|---|---|")
    for i, t in enumerate(TAMPERS):
        work = fresh_copy(finished, base_path / f"t{i:02d}")
        r = check(t, work)
        v = "flagged" if r.get("verify") else ("-" if t.verify is None else "MISSED")
        s = "rebuilds" if r.get("snakemake") else ("-" if t.rebuild is None else "MISSED")
        print(f"| {t.name} | {v} | {s} |", flush=True)
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
