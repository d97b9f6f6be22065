"""resdyn.io.write_json: JSON has no NaN/Inf, so a non-finite number is refused unless declared."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from resdyn import io


def test_plain_and_numpy_values_round_trip(tmp_path):
    obj = {"a": np.int64(3), "b": np.float32(0.5), "c": np.arange(3.0), "d": [np.bool_(True), Path("x/y")], "e": None}
    io.write_json(obj, tmp_path / "o.json")
    assert json.loads((tmp_path / "o.json").read_text()) == {"a": 3, "b": 0.5, "c": [0.0, 1.0, 2.0], "d": [True, "x/y"],
                                                             "e": None}  # fmt: skip


@pytest.mark.parametrize(
    "obj, where",
    [
        ({"b1": 2, "profile": [0.1, float("nan")]}, r"nan at profile\[1\]"),
        ({"stages": {"rise": {"y": np.array([0.0, np.inf])}}}, r"inf at stages.rise.y\[1\]"),
        (
            {"x": np.float64("nan")},
            "nan at x",
        ),  # a numpy scalar is checked too (json would write it as the literal NaN)
        ([1.0, -math.inf], r"-inf at \[1\]"),
    ],
)
def test_non_finite_numbers_are_refused_with_file_and_place(tmp_path, obj, where):
    path = tmp_path / "phases.json"
    with pytest.raises(ValueError, match=rf"^{path}: refusing to write a non-finite number \({where}\)"):
        io.write_json(obj, path)
    assert not path.exists() and not list(tmp_path.iterdir())  # nothing half-written


def test_declared_keys_write_null_for_nan(tmp_path):
    path = tmp_path / "o.json"
    io.write_json({"ci": [0.1, np.nan], "n": 3}, path, nan_as_null=("ci",))
    assert json.loads(path.read_text()) == {"ci": [0.1, None], "n": 3}
    with pytest.raises(ValueError, match=r"nan at other\[0\]"):
        io.write_json({"ci": [np.nan], "other": [np.nan]}, path, nan_as_null=("ci",))
    with pytest.raises(ValueError, match="nan_as_null names top-level keys, but the object is a list"):
        io.write_json([np.nan], path, nan_as_null=("ci",))
