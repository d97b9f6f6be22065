"""configs/pythia-mini.yaml end to end: tiny random GPT-NeoX models (parallel residual) read from
a Hugging Face cache, study A over a checkpoint series and study B over a depth series on tuned
lenses imported from a tuned-lens Space in that cache (tests/helpers/hubcache.py builds it).

Checks against independent values: the imported translators equal the published params.pt, the
bottleneck rows are the layer operators' cumulative ranks (recomputed with numpy from the
Jacobian files), and the lens readout at the last layer is the model's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from resdyn import artifacts
from resdyn.study_a import spectral

from helpers import codecache, hubcache

ROOT = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
CKPTS = ["step0", "step1000", "step143000"]
MODELS = {
    "pythia_8l": "resdyn-ci/pythia-mini-8L",
    "pythia_12l": "resdyn-ci/pythia-mini-12L",
    "pythia_16l": "resdyn-ci/pythia-mini-16L",
}


def load_config_json(folder: Path) -> dict:
    import json

    return json.loads((folder / "config.json").read_text())


def _targets() -> list[str]:
    out = [f"results/pythia_8l/{c}/{t}" for c in CKPTS for t in ("bottleneck.tsv", "spectra.tsv")]
    out += [
        "results/pythia_8l/step143000/coupling.tsv",
        "results/pythia_8l/step143000/schur.tsv",
        "results/scaling/phase_widths.tsv",
    ]
    return out + ["results/pythia_8l/step143000/lens_metrics.tsv"]


@pytest.fixture(scope="module")
def pythia_run(tmp_path_factory, code_cache_seed):
    home = tmp_path_factory.mktemp("pythia-hf")
    hubcache.build_pythia(home)
    work = codecache.warm(tmp_path_factory.mktemp("pythia-run"), code_cache_seed)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("HF_HUB_CACHE", None)
    proc = subprocess.run(
        [
            SNAKEMAKE,
            "--cores",
            "2",
            "--configfile",
            str(ROOT / "configs" / "pythia-mini.yaml"),
            "--snakefile",
            str(ROOT / "Snakefile"),
            "--directory",
            str(work),
            *_targets(),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return home, work


@pytest.mark.slow
def test_study_a_funnel_over_the_checkpoint_series(pythia_run):
    _, work = pythia_run
    funnel = {}
    for ckpt in CKPTS:
        bn = pd.read_csv(work / f"results/pythia_8l/{ckpt}/bottleneck.tsv", sep="\t")
        assert bn["kind"].tolist() == ["layer"] * 8 and bn["s"].tolist() == list(range(1, 16, 2))
        loaders, attrs = artifacts.JacobianBlocks.read_means(
            [work / f"results/pythia_8l/{ckpt}/jacobians/layers000-007"]
        )
        assert attrs["residual"] == "parallel" and attrs["family"] == "gpt_neox"
        product = np.eye(32)
        for L in range(8):
            product = loaders[(L, "layer")]() @ product
            expected = spectral.effective_rank(np.linalg.svd(product, compute_uv=False))
            assert bn["erank"].iloc[L] == pytest.approx(expected, rel=1e-9)
        funnel[ckpt] = bn["erank"].round(2).tolist()
    print("\nstudy A funnel, erank of P_L = J_L ... J_0 by layer (pythia_8l):")
    for ckpt, row in funnel.items():
        print(f"  {ckpt:>10}: {row}")
    coupling = pd.read_csv(work / "results/pythia_8l/step143000/coupling.tsv", sep="\t")
    assert set(coupling["boundary"]) == {"pre_attn"} and set(coupling["kind"]) == {"layer"}


@pytest.mark.slow
def test_study_b_runs_on_imported_tuned_lenses(pythia_run):
    home, work = pythia_run
    for model, repo in MODELS.items():
        folder = work / f"results/{model}/step143000/lens"
        assert load_config_json(folder)["stop_reason"] == "imported"
        ours = load_file(str(folder / "translators.safetensors"))
        space = hubcache.repo_dir(home / "hub", hubcache.PYTHIA_LENS_REPO, "space")
        published = torch.load(next(space.glob(f"snapshots/*/lens/{repo}/params.pt")), weights_only=True)
        for i in range(ours["weight"].shape[0]):
            assert torch.equal(ours["weight"][i], published[f"{i}.weight"])
            assert torch.equal(ours["bias"][i], published[f"{i}.bias"])
    table = pd.read_csv(work / "results/pythia_8l/step143000/lens_metrics.tsv", sep="\t")
    tuned = table[table["lens"] == "tuned"]
    reference = tuned[tuned["layer"] == tuned["layer"].max()]
    assert (reference["kl"] == 0).all() and (reference["hit1"] == 1).all()
    print("\nlens table (pythia_8l, step143000, imported lens):")
    print(table[["lens", "layer", "kl", "ce", "hit1", "hit5"]].round(3).to_string(index=False))
    widths = pd.read_csv(work / "results/scaling/phase_widths.tsv", sep="\t")
    assert set(widths["group"]) == {"pythia"}
    # every model's width is fitted or, cut by a Kneedle fallback, left out and counted
    assert ((widths["n_obs"] + widths["n_fallback"]) == len(MODELS)).all()
    per_model = pd.read_csv(work / "results/scaling/widths.tsv", sep="\t")
    flagged = per_model.groupby("phase")["fallback"].sum()
    assert widths.set_index("phase")["n_fallback"].to_dict() == flagged.to_dict()
