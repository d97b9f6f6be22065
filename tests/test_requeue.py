"""A requeued job resumes from its checkpoint (marker `slurm`; .ci/slurm-up starts a local SLURM).

Through the SLURM executor with the repository's profile (`slurm-requeue: true`, so every job is
submitted with `sbatch --requeue`), one lens job — the workflow's training function with its
checkpoint beside the output (resdyn.study_b.lens.train_lens, resdyn.artifacts.LensCheckpoint) —
is requeued with `scontrol requeue` once its first checkpoint is on disk. SLURM restarts it under
the same job id, it resumes from the checkpoint, Snakemake counts no
failed attempt, and the translators equal those of an uninterrupted run bit for bit.
"""

from __future__ import annotations

import re
import subprocess
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
import yaml

from helpers.slurm import SUBMITTED_RE, _env, require_slurm, write_test_profile

REPO = Path(__file__).resolve().parents[1]
#: the lens training of the job and of the reference (small, but ~tens of seconds on a loaded core)
LENS = {
    "steps": 80,
    "tokens_per_step": 256,
    "lr": 1e-3,
    "optimizer": "adam",
    "eval_every": 20,
    "patience": 3,
    "tol": 0.0,
    "seed": 0,
    "warmup_steps": 0,
    "lr_schedule": "constant",
}  # tol 0: never converged early, all 80 steps
CHECKPOINT_EVERY = 5

SNAKEFILE = textwrap.dedent("""
    rule lens:
        output: directory("lens")
        threads: 1
        resources: mem_mb=2000, runtime=30
        script: "lens_job.py"
    """)

JOB = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    import numpy as np, torch, transformers
    from resdyn import artifacts
    from resdyn.study_b import lens

    torch.set_num_threads(1)
    out = Path(snakemake.output[0])
    ckpt = artifacts.LensCheckpoint.path(out)
    with open("runs.txt", "a") as f:  # one line per start of the job: its id, and whether it resumes
        f.write(f"{{os.environ.get('SLURM_JOB_ID')}} {{ckpt.exists()}}\\n")
    model = transformers.AutoModelForCausalLM.from_pretrained("model", attn_implementation="eager").eval()
    for p in model.parameters():
        p.requires_grad_(False)
    ids = torch.as_tensor(np.load("ids.npy"))
    fitted = lens.train_lens(model, lens.token_batches(ids[8:], 8), heldout_batches=lens.token_batches(ids[:8], 8),
                             checkpoint=ckpt,
                             checkpoint_every={every}, **{opts!r})
    fitted.save(out)
    """)


def _start_now(jobid: str, timeout_s: float = 60.0) -> None:
    """Let the requeued job start as soon as it is pending again: slurmctld holds a requeued job
    back (its BeginTime about two minutes on; 125 s on the test cluster), a delay that is cluster policy,
    not what this test is about, and would be most of its run time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # requeued once the job's processes are gone: PENDING
        state = subprocess.run(["squeue", "-h", "-j", jobid, "-o", "%T"], capture_output=True, text=True).stdout
        if state.strip() == "PENDING":
            res = subprocess.run(
                ["scontrol", "update", f"JobId={jobid}", "StartTime=now"], capture_output=True, text=True
            )
            assert res.returncode == 0, res.stderr
            return
        time.sleep(0.2)
    raise AssertionError(f"job {jobid} not pending {timeout_s:.0f} s after its requeue")


def _tiny_model(folder: Path) -> None:
    cfg = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)


def _translators(folder: Path, model_folder: Path) -> dict[str, np.ndarray]:
    from resdyn.study_b import lens

    model = transformers.AutoModelForCausalLM.from_pretrained(model_folder, attn_implementation="eager")
    fitted = lens.Lens.load(folder, model)
    return {"weight": fitted.weight.detach().numpy(), "bias": fitted.bias.detach().numpy()}


@pytest.mark.slurm
@pytest.mark.slow
def test_a_requeued_lens_job_resumes_to_the_uninterrupted_artifact(tmp_path):
    slurm = require_slurm()
    wd = tmp_path / "wf"
    wd.mkdir()
    _tiny_model(wd / "model")
    np.save(wd / "ids.npy", np.random.default_rng(0).integers(0, 512, size=(64, 32)))
    (wd / "Snakefile").write_text(SNAKEFILE)
    (wd / "lens_job.py").write_text(JOB.format(repo=str(REPO), every=CHECKPOINT_EVERY, opts=LENS))
    profile = write_test_profile(tmp_path / "profile", slurm, tmp_path / "slurm-logs")
    prof = yaml.safe_load((profile / "config.yaml").read_text())
    assert prof["slurm-requeue"] is True  # the repository's setting, kept by the test profile

    proc = subprocess.Popen(
        ["snakemake", "--profile", str(profile)],
        cwd=wd,
        env=_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    ckpt = wd / ".lens.partial.pt"
    jobid, requeued, deadline = None, False, time.monotonic() + 900
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if not requeued and ckpt.exists():
                jobs = subprocess.run(["squeue", "-h", "-o", "%i %T %j"], capture_output=True, text=True).stdout
                running = [line.split()[0] for line in jobs.splitlines() if " RUNNING " in f" {line} "]
                if running:
                    jobid = running[0]
                    res = subprocess.run(["scontrol", "requeue", jobid], capture_output=True, text=True)
                    assert res.returncode == 0, res.stderr
                    requeued = True
                    _start_now(jobid)
            time.sleep(0.5)
        out, _ = proc.communicate(timeout=max(1, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-6000:]
    assert requeued, "the job ended before its first checkpoint: raise LENS['steps']\n" + out[-3000:]
    submitted = SUBMITTED_RE.findall(out)
    assert submitted == [jobid], (submitted, jobid)  # one submission: SLURM requeued it, no retry
    runs = [line.split() for line in (wd / "runs.txt").read_text().splitlines()]
    assert runs == [[jobid, "False"], [jobid, "True"]], runs  # started twice, the second time from the checkpoint
    assert not re.search(r"attempt 2|Trying to restart", out), out[-3000:]

    # the reference: the same training, never interrupted
    from resdyn.study_b import lens

    torch.set_num_threads(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(wd / "model", attn_implementation="eager").eval()
    for p in model.parameters():
        p.requires_grad_(False)
    ids = torch.as_tensor(np.load(wd / "ids.npy"))
    reference = lens.train_lens(
        model,
        lens.token_batches(ids[8:], 8),
        heldout_batches=lens.token_batches(ids[:8], 8),
        checkpoint=tmp_path / "ref.partial.pt",
        checkpoint_every=CHECKPOINT_EVERY,
        **LENS,
    )
    reference.save(tmp_path / "lens")
    got, want = _translators(wd / "lens", wd / "model"), _translators(tmp_path / "lens", wd / "model")
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
