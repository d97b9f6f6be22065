"""A requeued job resumes from its checkpoint (marker `slurm`; .ci/slurm-up starts a local SLURM).

Through the SLURM executor with the repository's profile (`slurm-requeue: true`, so every job is
submitted with `sbatch --requeue`), one lens job — the workflow's training function with its
checkpoint beside the output (resdyn.study_b.lens.train_lens, resdyn.artifacts.LensCheckpoint) —
is requeued with `scontrol requeue` while it is held at its first checkpoint (tests/helpers/hold.py:
the job writes a marker after its first save and waits for the test's release file), so the test
acts on an event, not on the job being slow enough. SLURM restarts it under the same job id, it
resumes from the checkpoint, Snakemake counts no failed attempt, and the translators equal those of
an uninterrupted run bit for bit.

Knobs for checking that the test holds on a CPU of any speed: RESDYN_TEST_LENS_STEPS (default 80;
6 is the fewest that still leave a step after the first checkpoint) makes the job fast,
RESDYN_TEST_SAVE_DELAY_S (tests/helpers/hold.py) makes every checkpoint save of the job slow.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
import yaml

from helpers import hold
from helpers.slurm import SUBMITTED_RE, _env, require_slurm, write_test_profile

REPO = Path(__file__).resolve().parents[1]
#: the lens training of the job and of the reference (small: ~1 s on a fast core, tens on a loaded one)
LENS = {
    "steps": int(os.environ.get("RESDYN_TEST_LENS_STEPS", "80")),
    "tokens_per_step": 256,
    "lr": 1e-3,
    "optimizer": "adam",
    "eval_every": 20,
    "patience": 3,
    "tol": 0.0,
    "seed": 0,
    "warmup_steps": 0,
    "lr_schedule": "constant",
}  # tol 0: never converged early, all steps
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
    sys.path.insert(0, {tests!r})
    import numpy as np, torch, transformers
    from resdyn import artifacts
    from resdyn.study_b import lens

    torch.set_num_threads(1)
    out = Path(snakemake.output[0])
    ckpt = artifacts.LensCheckpoint.path(out)
    with open("runs.txt", "a") as f:  # one line per start of the job: its id, and whether it resumes
        f.write(f"{{os.environ.get('SLURM_JOB_ID')}} {{ckpt.exists()}}\\n")
    from helpers import hold  # the first start waits at its first checkpoint for the test's release
    hold.hold_at_first_save(artifacts.LensCheckpoint, "save", ".", hold=not ckpt.exists())
    model = transformers.AutoModelForCausalLM.from_pretrained("model", attn_implementation="eager").eval()
    for p in model.parameters():
        p.requires_grad_(False)
    ids = torch.as_tensor(np.load("ids.npy"))
    fitted = lens.train_lens(model, lens.token_batches(ids[8:], 8), heldout_batches=lens.token_batches(ids[:8], 8),
                             checkpoint=ckpt,
                             checkpoint_every={every}, **{opts!r})
    fitted.save(out)
    """)


def _wait_pending(jobid: str, timeout_s: float = 300.0) -> None:
    """Wait until the requeued job is pending again, i.e. its first run's processes are gone (an
    event of slurmctld's; the timeout is a guard against a stuck cluster, not a speed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = subprocess.run(["squeue", "-h", "-j", jobid, "-o", "%T"], capture_output=True, text=True).stdout
        if state.strip() == "PENDING":
            return
        time.sleep(0.2)
    raise AssertionError(f"job {jobid} not pending {timeout_s:.0f} s after its requeue")


def _start_now(jobid: str) -> None:
    """Let the pending requeued job start at once: slurmctld holds a requeued job back (its
    BeginTime about two minutes on; 125 s on the test cluster), a delay that is cluster policy, not
    what this test is about, and would be most of its run time."""
    res = subprocess.run(["scontrol", "update", f"JobId={jobid}", "StartTime=now"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


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
    (wd / "lens_job.py").write_text(
        JOB.format(repo=str(REPO), tests=str(REPO / "tests"), every=CHECKPOINT_EVERY, opts=LENS)
    )
    profile = write_test_profile(tmp_path / "profile", slurm, tmp_path / "slurm-logs")
    prof = yaml.safe_load((profile / "config.yaml").read_text())
    assert prof["slurm-requeue"] is True  # the repository's setting, kept by the test profile

    log = tmp_path / "snakemake.log"  # a file, not a pipe: nothing blocks while the test waits
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            ["snakemake", "--profile", str(profile)],
            cwd=wd,
            env=_env(),
            text=True,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    ckpt = wd / ".lens.partial.pt"
    jobid = None
    try:
        hold.wait_for(wd / hold.MARKER, proc, "snakemake", log)  # the job is held at its first checkpoint
        assert ckpt.exists(), ckpt
        jobs = subprocess.run(["squeue", "-h", "-o", "%i %T %j"], capture_output=True, text=True).stdout
        running = [line.split()[0] for line in jobs.splitlines() if " RUNNING " in f" {line} "]
        assert len(running) == 1, jobs
        jobid = running[0]
        res = subprocess.run(["scontrol", "requeue", jobid], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        _wait_pending(jobid)  # the held first run is gone: it never went past its first checkpoint
        hold.release(wd)  # not needed by the restart (it resumes, so it is not held), only hygiene
        _start_now(jobid)
        proc.wait(timeout=hold.GUARD_S)
    finally:
        hold.release(wd)  # a job still held after a failure ends instead of waiting out its time limit
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # Snakemake cancels its SLURM jobs
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    out = log.read_text()
    assert proc.returncode == 0, out[-6000:]
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
