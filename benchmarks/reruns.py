"""Edit -> planned jobs on a finished run (docs/reruns.md, "Measured"): dry runs after edits
that change no number and after one that does.

    python benchmarks/reruns.py WORKDIR [--config configs/smoke.yaml]

WORKDIR is a finished run (results/, models/, .snakemake/). It is not modified: the workflow and
Snakemake's records are copied to a temporary folder, results/ and models/ linked, and each edit
is made there, dry-run (``snakemake -n``) and undone. Prints a markdown table: the planned jobs
per rule, their number, and how many are model jobs (GPU rules and zoo training).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from resdyn.pipeline import config as rc

ROOT = Path(__file__).resolve().parents[1]
MODEL_RULES = {"zoo_train", "jacobians", "activations", "lens", "lens_metrics", "causal"}
JACOBIAN = "resdyn/study_a/jacobian.py"
ARTIFACTS = "resdyn/artifacts/study_a.py"
NEW_FIGURE = [
    (
        "resdyn/plots/zoo.py",
        "def training_curve(",
        "def training_copy(df, title):\n    return training_curve(df, title)\n\n\ndef training_curve(",
    ),
    (
        "resdyn/plots/catalogue.py",
        "FIGURES: tuple[FigureSpec, ...] = (",
        'FIGURES: tuple[FigureSpec, ...] = (\n    FigureSpec("training2", "zoo", ("models/{model}/training.tsv",), '
        '"zoo:training_copy", "copy", "Zoo", "training", NONE),',
    ),
]
NEW_FAMILY = [  # (file, None, text): a new file
    (
        "resdyn/lm/adapters/newfam.py",
        None,
        'from resdyn.lm.sublayers import LayerSublayers\n\n\nclass NewSublayers(LayerSublayers):\n    mlp_post = "x"\n',
    ),
    (
        "resdyn/lm/families.py",
        "FAMILIES: dict[str, Family] = {",
        'FAMILIES: dict[str, Family] = {\n    "newfam": Family(("newfam",), "NewLayer", '
        '"resdyn.lm.adapters.newfam:NewSublayers"),',
    ),
]
#: (label, [(file, old, new)], config change or None)
EDITS = [
    ("none (the checked-out code on the run's records)", [], None),
    (
        "comment in resdyn/artifacts/study_a.py",
        [(ARTIFACTS, "class SpectraTable(", "# a comment\nclass SpectraTable(")],
        None,
    ),
    (
        "docstring of attn_jacobian reworded",
        [(JACOBIAN, "other positions frozen.", "every other position fixed.")],
        None,
    ),
    (
        "new unused helper in resdyn/study_a/jacobian.py",
        [(JACOBIAN, "def attn_jacobian(", "def _unused_helper():\n    return 1\n\n\ndef attn_jacobian(")],
        None,
    ),
    (
        "new unused helper in resdyn/artifacts/study_a.py",
        [(ARTIFACTS, "class SpectraTable(", "def _unused_helper():\n    return 1\n\n\nclass SpectraTable(")],
        None,
    ),
    (
        "new artifact class in resdyn/artifacts/study_a.py",
        [
            (
                ARTIFACTS,
                "class SpectraTable(",
                'class NewTable(TsvArtifact):\n    relpath = CKPT_DIR + "new.tsv"\n\n\nclass SpectraTable(',
            )
        ],
        None,
    ),
    ("new figure (plot function + catalogue entry)", NEW_FIGURE, None),
    ("new family (adapter class + table entries)", NEW_FAMILY, None),
    (
        "jacobian/lens checkpoint_every changed",
        [],
        lambda c: (
            c["jacobian"].update(checkpoint_every=c["jacobian"]["checkpoint_every"] + 1),
            c["lens"].update(checkpoint_every=c["lens"]["checkpoint_every"] + 1),
        ),
    ),
    ("device changed", [], lambda c: c.update(device="cpu" if c["device"] != "cpu" else "auto")),
    (
        "zoo checkpoint added (llama8 train.checkpoints + step 400)",
        [],
        lambda c: c["models"].update(
            llama8={
                **c["models"]["llama8"],
                "train": {  # a new dict: YAML anchors share
                    **c["models"]["llama8"]["train"],
                    "checkpoints": [0, 200, 400, 600],
                },
            }
        ),
    ),
    (
        "body of attn_jacobian edited",
        [(JACOBIAN, "    x = h[t].detach().clone()", "    x = h[t].detach().clone() * 1")],
        None,
    ),
]


def planned(work: Path, config: str) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": str(work)}
    out = subprocess.run(
        [str(Path(sys.executable).with_name("snakemake")), "-n", "--configfile", config],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if "Nothing to be done" in out:
        return {}
    jobs = {}
    for line in out.split("Job stats:", 1)[1].splitlines():
        m = re.fullmatch(r"\s*(\w+)\s+(\d+)\s*", line)
        if m and m[1] not in ("total", "all"):
            jobs[m[1]] = int(m[2])
        if line.strip().startswith("total"):
            break
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--config", default="config.yaml")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "wf"
        shutil.copytree(
            ROOT,
            work,
            ignore=shutil.ignore_patterns(
                ".venv", ".git", "results", "models", "logs", ".snakemake", "__pycache__", "out"
            ),
        )
        shutil.copytree(
            a.workdir / ".snakemake",
            work / ".snakemake",
            symlinks=True,
            ignore=shutil.ignore_patterns("conda", "singularity", "log"),
        )
        for d in ("results", "models"):
            (work / d).symlink_to((a.workdir / d).resolve())
        base = rc.load_config(work / a.config)  # every key, defaults filled in
        print("| edit | planned jobs | total | model jobs |\n|---|---|---|---|")
        for label, edits, change in EDITS:
            originals = {rel: (work / rel).read_text() for rel, old, _ in edits if old is not None}
            for rel, old, new in edits:
                if old is None:
                    (work / rel).write_text(new)
                    continue
                text = (work / rel).read_text()
                if old not in text:
                    raise SystemExit(f"{rel}: {old!r} not found (the edit needs updating)")
                (work / rel).write_text(text.replace(old, new, 1))
            config = a.config
            if change:
                cfg = yaml.safe_load(yaml.safe_dump(base))
                change(cfg)
                (work / "configs" / "_edit.yaml").write_text(yaml.safe_dump(cfg))
                config = "configs/_edit.yaml"
            jobs = planned(work, config)
            for rel, text in originals.items():
                (work / rel).write_text(text)
            for rel, old, _ in edits:
                if old is None:
                    (work / rel).unlink()
            shown = ", ".join(f"{r} ×{n}" if n > 1 else r for r, n in jobs.items()) or "none"
            n_model = sum(n for r, n in jobs.items() if r in MODEL_RULES)
            print(f"| {label} | {shown} | {sum(jobs.values())} | {n_model} |", flush=True)


if __name__ == "__main__":
    main()
