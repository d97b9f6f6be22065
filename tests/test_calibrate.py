"""`resdyn calibrate RUN`: the cost model fitted to a finished run's benchmark files, the rates
file `resdyn plan` then reads, and bad input (no benchmark files, another GPU kind)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from resdyn import cli
from resdyn.cluster import cost as rcost
from resdyn.cluster import gpu_kinds
from resdyn.pipeline import calibrate, dag
from resdyn.pipeline import config as rc

ROOT = Path(__file__).resolve().parents[1]
#: The planted truth: start-up 0.6 x the table's, every op class 3 x slower.
STARTUP, SLOWER = 0.6, 3.0


def _true_seconds(rule: str, c: rcost.Cost, threads: int, slow: set[str], jac: float) -> float:
    """Seconds of a job under the planted truth: the op classes ``slow`` SLOWER x the table's,
    start-up STARTUP x; jacobians ``jac`` x more on top (what no rate explains)."""
    work = 0.0
    for op, v in c.work.items():
        speedup = 1 + (threads - 1) * gpu_kinds.THREAD_EFFICIENCY[op]
        work += v / gpu_kinds.CPU_CALIBRATION[op] / speedup * (SLOWER if op in slow else 1)
    return (STARTUP * c.fixed_s + work) * (jac if rule == "jacobians" else 1.0)


def _plant_run(run: Path, cfg: dict, device: str = "cpu", jac: float = 1.0) -> dict:
    """Benchmark files and logs of every priced job with the planted times; Σ seconds per rule.
    The slowed op classes are those a run measures (:func:`resdyn.pipeline.calibrate.fitted_ops`)."""
    import pandas as pd

    jobs = [
        (rule, w, dag.job_cost(cfg, rule, w, "h100"), dag.threads_for(cfg, rule, w, "h100"))
        for rule, w in dag.unique_jobs(cfg)
    ]
    slow = set(calibrate.fitted_ops(pd.DataFrame([{"cost": c, "threads": t} for _, _, c, t in jobs]), "cpu"))
    truth = {}
    for rule, w, c, threads in jobs:
        secs = _true_seconds(rule, c, threads, slow, jac)
        bench, log = (run / p for p in calibrate.job_files(rule, w))
        bench.parent.mkdir(parents=True, exist_ok=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        bench.write_text(f"s\th:m:s\tmax_rss\tcpu_time\n{secs:.4f}\t0:00:01\t{0.8 * c.host_bytes / 1e6:.2f}\t1.0\n")
        log.write_text(f"INFO resdyn.rule.{rule}: done in {secs:.1f} s wall; device {device}, torch threads 1\n")
        truth[rule] = truth.get(rule, 0.0) + secs
    return truth


@pytest.fixture
def smoke(tmp_path) -> tuple[dict, Path]:
    path = tmp_path / "smoke.yaml"
    path.write_text((ROOT / "configs" / "smoke.yaml").read_text())
    return rc.load_config(str(path)), path


def _calibrate(run: Path, path: Path, rates: Path, capsys) -> dict:
    args = ["calibrate", str(run), "--configfile", str(path), "--write", str(rates)]
    assert cli.main(args) == 0
    out = capsys.readouterr()[0]
    assert "no SLURM efficiency report" in out and f"wrote {rates}" in out
    return yaml.safe_load(rates.read_text())["kinds"]


def test_the_fit_recovers_planted_rates(smoke, tmp_path, capsys):
    cfg, path = smoke
    _plant_run(tmp_path / "run", cfg)
    kinds = _calibrate(tmp_path / "run", path, tmp_path / "rates.yaml", capsys)
    assert set(kinds) == {"cpu"}
    entry = kinds["cpu"]
    assert entry["startup_factor"] == pytest.approx(STARTUP, rel=0.02)
    assert entry["rates"], "no op class fitted"
    for op, rate in entry["rates"].items():  # the fitted op classes: the table's rate / SLOWER
        assert rate == pytest.approx(gpu_kinds.CPU_CALIBRATION[op] / SLOWER, rel=0.05), op
    for rule, f in entry["rules"].items():  # the op model is exact here: nothing left per rule
        assert f["time_factor"] == pytest.approx(1.0, rel=0.05), rule
        assert f["mem_factor"] == pytest.approx(0.8, rel=0.01), rule


def test_the_plan_moves_to_within_25_percent_of_the_measured_times(smoke, tmp_path, capsys):
    cfg, path = smoke
    truth = _plant_run(tmp_path / "run", cfg, jac=1.5)
    rates = tmp_path / "rates.yaml"
    _calibrate(tmp_path / "run", path, rates, capsys)
    # before: the table's rates are off by the planted factors; after: every rule within 25 %
    before = _plan_seconds(path, "none")
    after = _plan_seconds(path, str(rates))
    assert max(abs(before[r] / truth[r] - 1) for r in truth) > 0.25
    ratios = {r: round(after[r] / truth[r], 3) for r in truth}
    assert all(abs(x - 1) <= 0.25 for x in ratios.values()), str(ratios)
    header = _plan_header(path, str(rates))
    assert header.startswith("rates: MEASURED for cpu") and str(rates) in header
    assert _plan_header(path, "none").startswith("rates: resdyn/data/gpus.yaml")


def _env(rates: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "RESDYN_GPU_RATES": rates}


def _plan_seconds(path: Path, rates: str) -> dict[str, float]:
    code = (
        "import sys; from resdyn.pipeline import plan, config as rc; "
        "j = plan.job_table(rc.load_config(sys.argv[1])); print(j.groupby('rule').seconds.sum().to_json())"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(path)], env=_env(rates), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _plan_header(path: Path, rates: str) -> str:
    code = "import sys; from resdyn import cli; sys.exit(cli.main(['plan', sys.argv[1]]))"
    proc = subprocess.run([sys.executable, "-c", code, str(path)], env=_env(rates), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return next(ln for ln in proc.stdout.splitlines() if ln.startswith("rates:"))


def test_a_run_without_benchmark_files_is_one_line(smoke, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    args = ["calibrate", str(tmp_path / "empty"), "--configfile", str(smoke[1]), "--write", str(tmp_path / "r.yaml")]
    assert cli.main(args) == 2
    err = capsys.readouterr()[1].strip()
    assert len(err.splitlines()) == 1 and "no Snakemake benchmark files" in err, err
    assert not (tmp_path / "r.yaml").exists()


def test_gpu_jobs_of_another_kind_are_one_line(tmp_path, capsys):
    cfg = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    cfg["device"] = "auto"  # the GPU rules become GPU jobs
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(cfg))
    _plant_run(tmp_path / "run", rc.load_config(str(path)), device="cuda:NVIDIA A100-SXM4-80GB")
    args = ["calibrate", str(tmp_path / "run"), "--configfile", str(path), "--gpu", "h100"]
    assert cli.main([*args, "--write", str(tmp_path / "r.yaml")]) == 2
    err = capsys.readouterr()[1].strip()
    assert len(err.splitlines()) == 1 and "ran on cuda:NVIDIA A100-SXM4-80GB, not GPU kind 'h100'" in err, err


@pytest.mark.parametrize(
    "device, kind",
    [("cuda:NVIDIA H100 80GB HBM3", "h100"), ("cpu", "cpu"), (None, "h100"), ("cuda:Some Future GPU", None)],
)
def test_device_kinds_from_the_logs(device, kind):
    assert calibrate.device_kind(device, gpu=True, kind="h100") == kind
    assert calibrate.device_kind(device, gpu=False, kind="h100") == "cpu"


def test_log_device_reads_the_closing_line(tmp_path):
    log = tmp_path / "x.log"
    log.write_text(
        "INFO a: start\nINFO a: done in 2 s wall; device cuda:NVIDIA H100 80GB HBM3, torch threads 8; peak\n"
    )
    assert calibrate.log_device(log) == "cuda:NVIDIA H100 80GB HBM3"
    assert calibrate.log_device(tmp_path / "missing.log") is None


def test_the_efficiency_report_is_summarised_per_rule(tmp_path):
    report = tmp_path / "logs" / "slurm" / "efficiency_report_abc.csv"
    report.parent.mkdir(parents=True)
    report.write_text(
        ",JobID,RuleName,CPU Efficiency (%),Memory Usage (%)\n"
        "0,1.0,jacobians,20.0,40.0\n1,2.0,jacobians,40.0,70.0\n2,3.0,spectra,90.0,10.0\n3,4.0,,0,0\n"
    )
    assert calibrate.efficiency_reports(tmp_path) == [report]
    lines = calibrate.efficiency_lines(report)
    assert lines[1:] == ["  jacobians\t2\t30\t70", "  spectra\t1\t90\t10"]


def test_a_run_whose_gpu_rules_ran_on_cpus_calibrates_the_cpu_row(tmp_path, capsys):
    """--gpu cpu: a config whose GPU rules are GPU jobs, run on CPUs (every log says cpu), is priced
    as a CPU run and fitted to the cpu row; the plan of that run's config moves to within 25 %."""
    cfg = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    cfg["device"] = "auto"
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(cfg))
    as_run = calibrate.cpu_config(rc.load_config(str(path)))
    assert not any(dag.job_cost(as_run, r, w).gpu for r, w in dag.unique_jobs(as_run))
    truth = _plant_run(tmp_path / "run", as_run, device="cpu", jac=1.5)
    rates = tmp_path / "rates.yaml"
    args = ["calibrate", str(tmp_path / "run"), "--configfile", str(path), "--gpu", "cpu", "--write", str(rates)]
    assert cli.main(args) == 0
    out = capsys.readouterr()[0]
    assert out.startswith("source of the fit: the benchmark files") and "sacct: no SLURM job ids" in out
    assert set(yaml.safe_load(rates.read_text())["kinds"]) == {"cpu"}
    cpu_path = tmp_path / "cpu.yaml"
    cpu_path.write_text(yaml.safe_dump({**cfg, "device": "cpu"}))
    before, after = _plan_seconds(cpu_path, "none"), _plan_seconds(cpu_path, str(rates))
    assert max(abs(before[r] / truth[r] - 1) for r in truth) > 0.25
    assert all(abs(after[r] / truth[r] - 1) <= 0.25 for r in truth), {r: after[r] / truth[r] for r in truth}


def test_cpu_mode_refuses_a_job_that_ran_on_a_gpu(tmp_path, capsys):
    cfg = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    _plant_run(tmp_path / "run", rc.load_config(str(path)), device="cuda:NVIDIA H100 80GB HBM3")
    args = ["calibrate", str(tmp_path / "run"), "--configfile", str(path), "--gpu", "cpu"]
    assert cli.main([*args, "--write", str(tmp_path / "r.yaml")]) == 2
    err = capsys.readouterr()[1].strip()
    assert len(err.splitlines()) == 1 and "ran on cuda:NVIDIA H100 80GB HBM3, not a CPU" in err, err
    assert not (tmp_path / "r.yaml").exists()


def test_sacct_output_is_summarised_per_rule(tmp_path):
    """Allocation lines give rule, elapsed and CPU seconds; the steps' MaxRSS gives the job's peak."""
    text = (
        "101|rule_jacobians_wildcards_m_c_layers000-003|COMPLETED|00:01:30|00:02:00.500|\n"
        "101.batch||COMPLETED|00:01:30|00:00:01|2048K\n"
        "101.0||COMPLETED|00:01:29|00:01:59|1536M\n"
        "102|rule_spectra_wildcards_m_c|COMPLETED|1-00:00:02|00:00:03|\n"
        "102.0||COMPLETED|00:00:02|00:00:03|1.5G\n"
        "103|rule_jacobians_wildcards_m_d_layers000-003|COMPLETED|01:00|00:50|\n"
    )
    table = calibrate.sacct_table(text)
    assert table.loc["jacobians"].tolist() == [2, 150.0, 170.5, 1536.0]
    assert table.loc["spectra"].tolist() == [1, 86402.0, 3.0, 1536.0]
    (tmp_path / ".snakemake" / "log").mkdir(parents=True)
    assert calibrate.sacct_lines(tmp_path) == ["sacct: no SLURM job ids in the run's .snakemake/log/ (not a SLURM run)"]
    (tmp_path / ".snakemake" / "log" / "x.snakemake.log").write_text(
        "Job 0 has been submitted with SLURM jobid 7 (log: a).\n"
    )
    assert calibrate.submitted_job_ids(tmp_path) == ["7"]
