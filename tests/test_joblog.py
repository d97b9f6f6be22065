"""Rule logs that last (resdyn.pipeline.joblog via provenance.step): progress and INFO lines reach the log
file on success, the traceback on failure, and the process's own stdout/stderr come back after."""

from __future__ import annotations

import logging
import os
import re
import warnings
from types import SimpleNamespace

import h5py
import numpy as np
import pandas as pd
import pytest
from tqdm import tqdm

from resdyn import io
from resdyn.pipeline import joblog
from resdyn.provenance import sidecars


class Named(list):
    """The part of Snakemake's Namedlist that provenance.step uses: a list with named items."""

    def __init__(self, items=(), **named):
        super().__init__([*items, *named.values()])
        self._named = named
        for k, v in named.items():
            setattr(self, k, v)

    def items(self):
        return self._named.items()


def fake_job(tmp_path, rule="demo"):
    table = tmp_path / "in.tsv"
    io.write_tsv(pd.DataFrame({"a": [1, 2, 3], "b": [4, 5, 6]}), table)
    arrays = tmp_path / "in.h5"
    with h5py.File(arrays, "w") as f:
        f["g/x"] = np.zeros((4, 5))
    return SimpleNamespace(
        rule=rule,
        input=Named(table=str(table), arrays=str(arrays)),
        output=Named(out=str(tmp_path / "out.tsv")),
        log=Named([str(tmp_path / "logs" / "job.log")]),
        params=Named(k=1),
        wildcards=Named(model="m"),
        threads=1,
    )


def test_success_log_has_progress_and_info_lines(tmp_path, capfd):
    sm = fake_job(tmp_path)
    with sidecars.step(sm):
        for _ in tqdm(range(5), desc="work"):
            pass
        print("a line on stdout")
        os.write(2, b"a line from C on fd 2\n")
        warnings.warn("a library warning")
        logging.getLogger("resdyn.demo").info("inside the job")
        logging.getLogger("fontTools.subset").info("glyph noise")
        io.write_tsv(pd.DataFrame({"x": range(7)}), sm.output.out)
    os.write(2, b"after the job\n")
    text = (tmp_path / "logs" / "job.log").read_text()
    assert "work: 100%" in text and "5/5" in text  # the tqdm bar
    for line in ("a line on stdout", "a line from C on fd 2", "a library warning", "inside the job"):
        assert line in text, line
    assert "glyph noise" not in text and "after the job" not in text
    assert re.search(
        r"INFO resdyn\.rule\.demo: rule demo, wildcards \{'model': 'm'\}, threads 1, host \S+, pid \d+", text
    )
    assert re.search(r"input \S+in\.tsv: \d+ B, 3 rows x 2 columns", text)
    assert re.search(r"input \S+in\.h5: [\d.]+ KiB, datasets g/x \(4, 5\)", text)
    assert re.search(r"output \S+out\.tsv: \d+ B, 7 rows x 1 columns", text)
    done = re.search(
        r"done in ([\d.]+) s wall, ([\d.]+) s CPU; device (\w+)\b.*; peak memory host ([\d.]+) (MiB|GiB)", text
    )
    assert done and done[3] == "cpu"
    peak_mib = float(done[4]) * (1024 if done[5] == "GiB" else 1)
    assert peak_mib > 1  # a Python process with numpy loaded holds more than 1 MiB
    captured = capfd.readouterr()
    assert "after the job" in captured.err and "inside the job" not in captured.err + captured.out
    assert io.prov_path(sm.output.out).is_file()


def test_failure_log_has_the_traceback_and_restores_the_streams(tmp_path, capfd):
    sm = fake_job(tmp_path, rule="broken")
    with pytest.raises(ZeroDivisionError):
        with sidecars.step(sm):
            1 / 0
    text = (tmp_path / "logs" / "job.log").read_text()
    assert "ERROR resdyn.rule.broken: rule broken failed after" in text and "ZeroDivisionError" in text
    os.write(2, b"back on stderr\n")
    assert "back on stderr" in capfd.readouterr().err
    assert not io.prov_path(sm.output.out).exists()


def test_describe_folders_and_missing_files(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.bin").write_bytes(b"x" * 2048)
    assert joblog.describe(tmp_path / "d") == f"{tmp_path / 'd'}: folder, 1 files, 2.0 KiB"
    assert joblog.describe(tmp_path / "nope") == f"{tmp_path / 'nope'}: missing"
    (tmp_path / "bad.h5").write_text("not hdf5")
    assert "unreadable for the log" in joblog.describe(tmp_path / "bad.h5")


def test_warnings_reach_the_log_after_an_earlier_job_in_the_same_process(tmp_path):
    # an earlier step inside a catch_warnings block (as pytest runs every test) must not stop
    # the next step's warnings from reaching its log
    with warnings.catch_warnings():
        with sidecars.step(fake_job(tmp_path / "first")):
            pass
    sm = fake_job(tmp_path / "second")
    with warnings.catch_warnings(record=True):
        with sidecars.step(sm):
            warnings.warn("the second job's warning")
            io.write_tsv(pd.DataFrame({"x": [1]}), sm.output.out)
    assert "the second job's warning" in (tmp_path / "second" / "logs" / "job.log").read_text()
