"""Argument checks shared by the concept modules: each returns the value as a plain Python number
or raises ValueError in one line naming the argument, the allowed range and the value given."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["check_fraction", "check_int", "check_nonnegative_float", "is_int"]


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (numpy's included) and not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_int(value: Any, name: str, low: int, high: int | None = None, why: str = "") -> int:
    """``value`` as an int in [low, high] (no upper bound when ``high`` is None); else ValueError
    ``"{name} must be an integer ≥ {low} ({why}), got {value!r}"`` (``in [low, high]`` with a
    ``high``; the parenthesis only with a ``why``)."""
    if is_int(value) and int(value) >= low and (high is None or int(value) <= high):
        return int(value)
    allowed = f"≥ {low}" if high is None else f"in [{low}, {high}]"
    because = f" ({why})" if why else ""
    raise ValueError(f"{name} must be an integer {allowed}{because}, got {value!r}")


def check_fraction(value: Any, name: str) -> float:
    """``value`` as a float in (0, 1]; else ValueError ``"{name} must be ... in (0, 1], got {value!r}"``."""
    try:
        f = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}") from err
    if not (0.0 < f <= 1.0):
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return f


def check_nonnegative_float(value: Any, name: str) -> float:
    """``value`` as a finite float ≥ 0; else ValueError ``"{name} must be a finite number ≥ 0, got {value!r}"``."""
    try:
        f = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a finite number ≥ 0, got {value!r}") from err
    if not math.isfinite(f) or f < 0:
        raise ValueError(f"{name} must be a finite number ≥ 0, got {value!r}")
    return f
