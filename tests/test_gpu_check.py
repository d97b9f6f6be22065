"""benchmarks/gpu_check.sh, the one script a lent GPU runs: its dry run on a CPU at tiny shapes, the
refusal of a CPU torch in its real modes, the autograd check on a planted wrong Jacobian, and the run
folder it writes as `resdyn calibrate` reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from resdyn import cli
from resdyn.numerics import precision
from resdyn.pipeline import calibrate
from resdyn.pipeline import config as rc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_check  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory, single_thread) -> tuple[int, str, Path]:
    """(exit status, stdout, run folder) of one ``--dry`` run in this process (fp32 precision restored)."""
    import contextlib
    import io

    run = tmp_path_factory.mktemp("gpu_check") / "run"
    before = precision.fp32_precision()
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            status = gpu_check.main(["--dry", "--out", str(run)])
    finally:
        precision.set_fp32_precision(before)
    return status, out.getvalue(), run


def _rows(stdout: str) -> dict[str, list[str]]:
    """The printed table's rows: first column -> the other columns (split at runs of 2+ spaces)."""
    import re

    rows = {}
    for line in stdout.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 2:
            rows[cells[0]] = cells[1:]
    return rows


def test_the_dry_run_times_each_priced_rule_and_passes_its_checks(dry_run):
    status, stdout, _ = dry_run
    assert status == 0, stdout
    assert stdout.startswith("numerics: TF32 off (fp32_precision {'global': 'ieee'"), stdout[:300]
    rows = _rows(stdout)
    for rule, unit in (("jacobians", "samples/s"), ("lens", "tokens/s"), ("spectra", "sublayers/s")):
        measured, got_unit, planned, ratio = rows[f"{rule} job: {unit} (work only)"]
        assert got_unit == unit and float(measured) > 0 and float(planned) > 0 and float(ratio) > 0, rule
    autograd = [v for k, v in rows.items() if k.startswith("autograd: ")]
    assert len(autograd) == 2 and all(float(v[0]) <= gpu_check.AUTOGRAD_RTOL for v in autograd), autograd
    assert any(k.startswith("determinism: one Jacobian twice, bit-identical yes") for k in rows), stdout
    assert "FAILED" not in stdout
    assert stdout.rstrip().endswith("}") and '"gemm32"' in stdout.split("MEASURED_RATES = {")[1]


def test_the_real_mode_refuses_a_cpu_torch_with_one_line():
    assert not torch.cuda.is_available()  # this suite runs on a CPU torch
    env = {**os.environ, "PYTHON": sys.executable}
    for args in ([], ["--two-gpu"], ["--kind", "h100"]):
        res = subprocess.run(
            ["bash", "benchmarks/gpu_check.sh", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 2 and res.stdout == "", (args, res.stdout[-500:])
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        assert f"torch.version.cuda = {torch.version.cuda}" in lines[0] and "CUDA build of torch" in lines[0], lines


def test_the_autograd_check_fails_on_a_planted_wrong_jacobian(monkeypatch):
    """The Jacobians pass against the VJP rows through HF's layer; one off by 1e-3 of its size in one
    entry, or the MLP half transposed, fails, and ``main`` then exits 1."""
    from resdyn.study_a import jacobian

    model = gpu_check.build_model(gpu_check.DRY, 1, torch.bfloat16, torch.device("cpu"))
    ids = torch.randint(0, gpu_check.DRY.vocab, (gpu_check.DRY.length,), generator=torch.Generator().manual_seed(5))
    t = gpu_check.DRY.length - 1
    jacs = jacobian.JacobianEngine(model, [0]).compute(ids, "last")
    assert max(gpu_check.autograd_errors(model, ids, jacs, t).values()) <= gpu_check.AUTOGRAD_RTOL
    off = {k: v.clone() for k, v in jacs.items()}
    off[(0, "attn")][0, 3, 5] += 1e-3 * off[(0, "attn")].abs().max()
    assert gpu_check.autograd_errors(model, ids, off, t)["attention"] > gpu_check.AUTOGRAD_RTOL
    swapped = {**jacs, (0, "mlp"): jacs[(0, "mlp")].transpose(1, 2)}
    assert gpu_check.autograd_errors(model, ids, swapped, t)["mlp"] > gpu_check.AUTOGRAD_RTOL

    compute = jacobian.JacobianEngine.compute

    def planted(self, *args, **kwargs):
        out = compute(self, *args, **kwargs)
        out[(0, "attn")][0, 3, 5] += 1e-3 * out[(0, "attn")].abs().max()
        return out

    monkeypatch.setattr(jacobian.JacobianEngine, "compute", planted)
    report = gpu_check.Report()
    big = gpu_check.build_model(gpu_check.DRY, 4, torch.bfloat16, torch.device("cpu"))
    gpu_check.check_jacobians(big, gpu_check.DRY.length, torch.device("cpu"), report)
    assert len(report.failures) == 1 and "layer 0 attention Jacobian" in report.failures[0], report.failures
    monkeypatch.setattr(gpu_check, "single_gpu_check", lambda args, dev, rep: rep.fail("planted"))
    before = precision.fp32_precision()
    try:
        assert gpu_check.main(["--dry"]) == 1
    finally:
        precision.set_fp32_precision(before)


def test_the_run_folder_is_what_resdyn_calibrate_reads(dry_run, monkeypatch, tmp_path, capsys):
    status, _, run = dry_run
    assert status == 0
    monkeypatch.chdir(run)  # the config's model folders are relative to the run folder
    config = rc.load_config("config.yaml")
    jobs = calibrate.measured_jobs(Path("."), calibrate.cpu_config(config), None)
    assert sorted(jobs.rule) == ["jacobians", "lens", "spectra"]
    assert set(jobs.device) == {"cpu"} and set(jobs.log_device) == {"cpu"}
    for job in jobs.itertuples():
        assert job.seconds > job.cost.fixed_s > 0, job  # the measured work plus the plan's start-up
    rates = tmp_path / "rates.yaml"
    assert cli.main(["calibrate", ".", "--configfile", "config.yaml", "--gpu", "cpu", "--write", str(rates)]) == 0
    assert "source of the fit: the benchmark files under benchmarks/out (3 jobs)" in capsys.readouterr()[0]
    assert rates.is_file()
