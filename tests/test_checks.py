"""resdyn.numerics.checks: the shared argument checks and their one-line messages."""

from __future__ import annotations

import numpy as np
import pytest

from resdyn.numerics.checks import check_fraction, check_int, check_nonnegative_float, is_int


def test_is_int_takes_numpy_integers_and_refuses_bools_and_floats():
    assert is_int(3) and is_int(np.int64(3)) and is_int(np.uint8(0))
    assert not any(is_int(v) for v in (True, False, 3.0, "3", None, np.float64(3)))


def test_check_int_returns_a_plain_int_within_bounds():
    value = check_int(np.int32(4), "n", 1, 4)
    assert value == 4 and type(value) is int
    assert check_int(0, "seed", 0) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, "n_samples", 1), "n_samples must be an integer ≥ 1, got 0"),
        ((True, "seed", 0), "seed must be an integer ≥ 0, got True"),
        ((2.0, "n", 1), "n must be an integer ≥ 1, got 2.0"),
        ((33, "k", 1, 32), "k must be an integer in [1, 32], got 33"),
    ],
)
def test_check_int_message(args, message):
    with pytest.raises(ValueError) as err:
        check_int(*args)
    assert str(err.value) == message


def test_check_int_says_why():
    with pytest.raises(ValueError, match=r"^n_random must be an integer ≥ 2 \(for a mean and sd\), got 1$"):
        check_int(1, "n_random", 2, why="for a mean and sd")


def test_check_fraction():
    assert check_fraction(1, "k_fraction") == 1.0 and check_fraction("0.25", "f") == 0.25
    for bad, text in (
        (0.0, "f must be in (0, 1], got 0.0"),
        (float("nan"), "f must be in (0, 1], got nan"),
        ("x", "f must be a number in (0, 1], got 'x'"),
    ):
        with pytest.raises(ValueError) as err:
            check_fraction(bad, "f")
        assert str(err.value) == text


def test_check_nonnegative_float():
    assert check_nonnegative_float(0, "tol") == 0.0
    for bad in (-1e-9, float("inf"), None):
        with pytest.raises(ValueError) as err:
            check_nonnegative_float(bad, "tol")
        assert str(err.value) == f"tol must be a finite number ≥ 0, got {bad!r}"
