"""Three phases of an RSS profile, cut by a two-stage Kneedle.

Study B. The RSS profile ``r_0 … r_{m−1}`` (``m = n_layers − 1`` points; point ``L`` compares
the readout subspaces ``S_L`` and ``S_{L+1}``, i.e. it describes layer ``L``'s update, see
:mod:`resdyn.study_b.readout`) typically rises, plateaus and descends. The phases are

- phase 1 (rise)      ``[0, b1]``,
- phase 2 (plateau)   ``(b1, b2]``,
- phase 3 (descent)   ``(b2, m−1]``,

with, on the smoothed profile ``s``:

1. peak ``p = argmax s`` (the first maximum; values within ``flat_tol`` of the maximum count
   as ties, so rounding noise on a flat curve cannot move the peak);
2. ``b1`` = Kneedle knee of ``s[0..p]`` with ``curve="concave", direction="increasing"`` — where
   the rise saturates;
3. ``b2`` = Kneedle knee of ``s[p..m−1]`` with ``curve="concave", direction="decreasing"`` —
   where the plateau ends and the fall steepens.

Kneedle: V. Satopää, J. Albrecht, D. Irwin and B. Raghavan, "Finding a 'Kneedle' in a
Haystack: Detecting Knee Points in System Behavior", ICDCS Workshops 2011; implementation
``kneed.KneeLocator`` (offline mode, sensitivity ``S``).

**Fallback rules** (a stage that finds no knee never raises; the result says why in
``reason`` and flags the stage in ``b1_found`` / ``b2_found``):

- stage 1 without a knee ⇒ ``b1 = p`` (the rise lasts up to the peak);
- stage 2 without a knee ⇒ ``b2 = p`` (the descent starts right after the peak).

A stage finds no knee when its segment has fewer than 3 points (in particular when the peak
sits at that end of the profile, e.g. a monotone profile), when the segment is flat (range
≤ ``flat_tol``), or when Kneedle reports none (e.g. a straight line). A candidate kneed
reports at a point whose normalized difference value is ≤ 0 (not above the chord: a convex or
straight segment, where kneed may return a segment end) is rejected too. Consequences: a
monotone increasing profile has ``p = b2 = m−1`` (empty phase 3); a monotone decreasing one
has ``p = b1 = 0`` (phase 1 is the single point 0); a flat profile has ``p = b1 = b2 = 0``.
The cut points are therefore always integers with ``0 ≤ b1 ≤ p ≤ b2 ≤ m−1``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import pandas as pd

from resdyn.numerics.checks import is_int

__all__ = [
    "SMOOTHING_METHODS",
    "Cutpoints",
    "smooth",
    "cutpoints",
    "phase_spans",
    "phase_of_layer",
    "profile_at",
    "middle_regime",
    "regime_agreement",
]

SMOOTHING_METHODS = ("none", "moving_average", "savgol")
_SAVGOL_POLYORDER = 2
_MIN_DIFFERENCE = 1e-12  # a knee must lie this far above the chord (normalized units)
_OPTIONAL_KEYS = ("k", "k_fraction_requested", "regime")  # phases.json keys left out while unset
REGIME_KEYS = ("k", "k_fraction", "k_center", "how", "cuts", "b1_shift", "b2_shift", "max_shift", "reason")


def _as_profile(profile: object, name: str = "profile", min_len: int = 3) -> np.ndarray:
    arr = np.asarray(profile)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per layer), got shape {arr.shape}")
    if np.iscomplexobj(arr) or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"{name} must be real numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if arr.size < min_len:
        raise ValueError(f"{name} needs at least {min_len} points, got {arr.size}")
    if not np.all(np.isfinite(arr)):
        bad = np.flatnonzero(~np.isfinite(arr)).tolist()
        raise ValueError(f"{name} must be finite; non-finite values (NaN/inf) at indices {bad}")
    return arr


def _check_window(window: object, method: str, n: int) -> int:
    if not is_int(window):
        raise ValueError(f"window must be an odd positive integer, got {window!r}")
    w = int(window)
    if w < 1 or w % 2 == 0:
        raise ValueError(f"window must be an odd positive integer (centered), got {w}")
    if w > n:
        raise ValueError(f"window={w} is longer than the profile ({n} points); use window <= {n}")
    if method == "savgol" and w <= _SAVGOL_POLYORDER:
        raise ValueError(f"savgol needs window > polyorder={_SAVGOL_POLYORDER} (odd, e.g. 3, 5), got window={w}")
    return w


def smooth(profile: np.ndarray, window: int = 3, method: str = "moving_average") -> np.ndarray:
    """Smooth a 1-D profile.

    Methods
    -------
    ``"none"``
        Returns a float64 copy; ``window`` is ignored.
    ``"moving_average"``
        Centered mean with a *symmetric, shrinking* window at the edges: point ``i`` averages
        ``y[i−r … i+r]`` with ``r = min((window−1)/2, i, n−1−i)``. The endpoints are kept
        as they are, and a straight line is reproduced exactly (so a monotone linear profile
        stays monotone and the peak of a ramp stays at its end).
    ``"savgol"``
        ``scipy.signal.savgol_filter(y, window, polyorder=2, mode="interp")``: local quadratic
        least squares; reproduces any quadratic exactly (window 3 is the identity).

    Parameters
    ----------
    profile : (n,) array_like, finite, n ≥ 1
    window : odd int, ``1 ≤ window ≤ n`` (``savgol``: ``window ≥ 3``)
    method : one of ``"none"``, ``"moving_average"``, ``"savgol"``

    Returns
    -------
    (n,) ndarray, float64.

    Examples
    --------
    >>> smooth([0.0, 3.0, 0.0, 3.0, 0.0], 3, "moving_average")
    array([0., 1., 2., 1., 0.])
    >>> smooth([1.0, 2.0, 3.0, 4.0], 3, "moving_average")
    array([1., 2., 3., 4.])
    """
    if method not in SMOOTHING_METHODS:
        raise ValueError(f"method must be one of {SMOOTHING_METHODS}, got {method!r}")
    y = _as_profile(profile, min_len=1)
    n = y.size
    if method == "none":
        return y.copy()
    w = _check_window(window, method, n)
    if method == "savgol":
        from scipy.signal import savgol_filter

        return np.asarray(savgol_filter(y, w, _SAVGOL_POLYORDER, mode="interp"), dtype=np.float64)
    h = (w - 1) // 2
    csum = np.concatenate(([0.0], np.cumsum(y)))
    i = np.arange(n)
    r = np.minimum(h, np.minimum(i, n - 1 - i))
    return (csum[i + r + 1] - csum[i - r]) / (2 * r + 1)


def phase_spans(n: int, b1: int, b2: int) -> list[tuple[int, int]]:
    """Half-open index ranges ``[start, stop)`` of the three phases of an ``n``-point profile.

    Phase 1 = ``[0, b1]`` → ``(0, b1+1)``; phase 2 = ``(b1, b2]`` → ``(b1+1, b2+1)``;
    phase 3 = ``(b2, n−1]`` → ``(b2+1, n)``. Widths ``stop − start`` sum to ``n``; phase 1
    always holds at least point 0, phases 2 and 3 may be empty (``start == stop``).

    The unit is a profile point: for an RSS profile, one layer (point ``L`` = layer ``L``'s
    update, ``S_L`` vs ``S_{L+1}``), so widths are numbers of layers among the first
    ``n_layers − 1``.

    Requires ``0 ≤ b1 ≤ b2 ≤ n−1``.

    Examples
    --------
    >>> phase_spans(10, 2, 6)
    [(0, 3), (3, 7), (7, 10)]
    >>> phase_spans(5, 4, 4)
    [(0, 5), (5, 5), (5, 5)]
    """
    n, b1, b2 = _check_cuts(n, b1, b2)
    return [(0, b1 + 1), (b1 + 1, b2 + 1), (b2 + 1, n)]


def phase_of_layer(n: int, b1: int, b2: int) -> np.ndarray:
    """Phase label (1, 2 or 3) of each of the ``n`` profile points, per :func:`phase_spans`.

    Examples
    --------
    >>> phase_of_layer(8, 1, 4).tolist()
    [1, 1, 2, 2, 2, 3, 3, 3]
    """
    n, b1, b2 = _check_cuts(n, b1, b2)
    idx = np.arange(n)
    return np.where(idx <= b1, 1, np.where(idx <= b2, 2, 3)).astype(int)


def _check_cuts(n: object, b1: object, b2: object) -> tuple[int, int, int]:
    for name, v in (("n", n), ("b1", b1), ("b2", b2)):
        if not is_int(v):
            raise ValueError(f"{name} must be an integer, got {v!r} ({type(v).__name__})")
    n, b1, b2 = int(n), int(b1), int(b2)
    if n < 1:
        raise ValueError(f"n (number of profile points) must be >= 1, got {n}")
    if not 0 <= b1 <= b2 <= n - 1:
        raise ValueError(f"cut points must satisfy 0 <= b1 <= b2 <= n-1 = {n - 1}, got b1={b1}, b2={b2}")
    return n, b1, b2


def _kneedle_stage(
    x: np.ndarray, y: np.ndarray, direction: str, sensitivity: float, flat_tol: float, label: str
) -> dict[str, Any]:
    """Run one Kneedle stage; never raises. Returns the knee (int or None), reason and audit."""
    out: dict[str, Any] = {
        "stage": label,
        "direction": direction,
        "x": [int(v) for v in x],
        "y": [float(v) for v in y],
        "knee": None,
        "reason": "",
        "x_normalized": None,
        "y_normalized": None,
        "x_difference": None,
        "y_difference": None,
        "thresholds": None,
        "maxima_indices": None,
    }
    if x.size < 3:
        where = "start" if direction == "increasing" else "end"
        out["reason"] = f"{label}: segment has {x.size} point(s) (< 3) - peak at or next to the {where} of the profile"
        return out
    scale = max(1.0, float(np.max(np.abs(y))))
    if float(np.ptp(y)) <= flat_tol * scale:
        out["reason"] = f"{label}: segment is flat (range {float(np.ptp(y)):.3g} <= {flat_tol:g})"
        return out
    try:
        from kneed import KneeLocator

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kl = KneeLocator(
                x,
                y,
                S=sensitivity,
                curve="concave",
                direction=direction,
                interp_method="interp1d",
                online=False,
            )
    except Exception as exc:  # noqa: BLE001 - a failing stage is reported, never raised
        out["reason"] = f"{label}: kneed failed ({type(exc).__name__}: {exc})"
        return out

    def _lst(a: Any) -> list[float] | None:
        if a is None:
            return None
        return [float(v) for v in np.asarray(a, dtype=np.float64).ravel()]

    out["x_normalized"] = _lst(getattr(kl, "x_normalized", None))
    out["y_normalized"] = _lst(getattr(kl, "y_normalized", None))
    out["x_difference"] = _lst(getattr(kl, "x_difference", None))
    out["y_difference"] = _lst(getattr(kl, "y_difference", None))
    out["thresholds"] = _lst(getattr(kl, "Tmx", None))
    mi = getattr(kl, "maxima_indices", None)
    out["maxima_indices"] = None if mi is None else [int(v) for v in np.asarray(mi).ravel()]
    knee = kl.knee
    if knee is None or not math.isfinite(float(knee)):
        out["reason"] = f"{label}: Kneedle found no knee (no concave bend, e.g. a straight or convex segment)"
        return out
    knee = int(round(float(knee)))
    # Guard on top of kneed: a genuine concave knee lies above the chord, i.e. its normalized
    # difference value is > 0. kneed can report a segment end whose difference is 0 (the curve
    # is convex or straight there); that is not a bend.
    pos = knee - int(x[0]) if direction == "increasing" else int(x[-1]) - knee
    diff = np.asarray(kl.y_difference, dtype=np.float64)
    if not (0 <= pos < diff.size) or not diff[pos] > _MIN_DIFFERENCE:
        value = float(diff[pos]) if 0 <= pos < diff.size else float("nan")
        out["reason"] = (
            f"{label}: Kneedle's candidate {knee} has difference {value:.3g} <= 0 "
            "(convex or straight segment, no concave bend)"
        )
        return out
    out["knee"] = knee
    return out


@dataclass(frozen=True)
class Cutpoints:
    """The phase cut of one RSS profile (:func:`cutpoints`); :meth:`to_json` is ``phases.json``.

    Attributes (``phases.json`` keys, in file order):

    - ``b1``, ``b2``, ``peak``: int, ``0 ≤ b1 ≤ peak ≤ b2 ≤ n−1`` (never None: fallbacks apply);
    - ``b1_found``, ``b2_found``: bool, False where the fallback was used;
    - ``reason``: ``""`` if both knees were found, else the causes joined by ``"; "``;
    - ``spans``: ``((start, stop), …)`` per phase (:func:`phase_spans`), ``widths``: their sizes
      (sum ``n``);
    - ``n`` (profile points), ``window`` (None for method ``"none"``), ``method``,
      ``sensitivity``, ``notes`` (e.g. a reduced window);
    - ``profile`` and ``smoothed``: the input and the smoothed curve (finite floats);
    - ``stages``: per stage (``"rise"``, ``"descent"``) the audit record of the Kneedle run —
      segment ``x``/``y``, kneed's normalized curves, difference curve, thresholds ``Tmx``,
      local-maxima indices (None when kneed was not run), the local ``knee`` and ``reason``;
    - ``k``, ``k_fraction_requested``: the readout dimension the profile was taken at and the
      configured fraction (:func:`profile_at`; None until set with :meth:`at_k`, and then left
      out of the JSON);
    - ``regime``: the cuts at every k of the middle resolution regime and their agreement
      (:func:`regime_agreement`; None until set with :meth:`with_regime`, then left out).
    """

    b1: int
    b2: int
    peak: int
    b1_found: bool
    b2_found: bool
    reason: str
    spans: tuple[tuple[int, int], ...]
    widths: tuple[int, ...]
    n: int
    window: int | None
    method: str
    sensitivity: float
    notes: tuple[str, ...]
    profile: tuple[float, ...]
    smoothed: tuple[float, ...]
    stages: Mapping[str, Mapping[str, Any]] = field(repr=False)
    k: int | None = None
    k_fraction_requested: float | None = None
    regime: Mapping[str, Any] | None = field(default=None, repr=False)

    def at_k(self, k: int, k_fraction_requested: float) -> Cutpoints:
        """The same cut, labelled with the readout dimension k of its profile."""
        return replace(self, k=int(k), k_fraction_requested=float(k_fraction_requested))

    def with_regime(self, regime: Mapping[str, Any]) -> Cutpoints:
        """The same cut, with the middle regime's cuts and agreement (:func:`regime_agreement`)."""
        return replace(self, regime=dict(regime))

    def to_json(self) -> dict[str, Any]:
        """The ``phases.json`` object: plain ints, floats, strings, lists, None, in field order."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _OPTIONAL_KEYS and v is None:
                continue
            if f.name == "spans":
                v = [list(span) for span in v]
            elif f.name == "stages":
                v = {name: dict(stage) for name, stage in v.items()}
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out

    @classmethod
    def from_json(cls, obj: Any, source: str = "phases.json") -> Cutpoints:
        """Validate a ``phases.json`` object (:meth:`to_json`'s layout) into a :class:`Cutpoints`.

        Raises ValueError naming ``source`` and what is wrong: not an object, a missing key, a
        value of the wrong type, non-finite numbers, or cut points that break
        ``0 ≤ b1 ≤ peak ≤ b2 ≤ n−1`` or disagree with ``spans``/``widths``.
        """
        if not isinstance(obj, Mapping):
            raise ValueError(f"{source}: expected a JSON object of phase cut points, got {type(obj).__name__}")
        required = [f.name for f in fields(cls) if f.name not in _OPTIONAL_KEYS]
        missing = [name for name in required if name not in obj]
        if missing:
            raise ValueError(
                f"{source}: lacks keys {missing} (a phases.json written by resdyn.study_b.phases has {required})"
            )

        n, b1, peak, b2, spans, widths = _json_cuts(obj, source)
        profile, smoothed = _json_numbers(obj, "profile", source), _json_numbers(obj, "smoothed", source)
        if len(profile) != n or len(smoothed) != n:
            raise ValueError(
                f"{source}: profile and smoothed must have n = {n} points, got {len(profile)} and {len(smoothed)}"
            )
        window, sens, stages, k, kf, regime = _json_settings(obj, source)
        return cls(
            b1=b1,
            b2=b2,
            peak=peak,
            b1_found=_json_flag(obj, "b1_found", source),
            b2_found=_json_flag(obj, "b2_found", source),
            reason=obj["reason"],
            spans=spans,
            widths=tuple(widths),
            n=n,
            window=window,
            method=obj["method"],
            sensitivity=sens,
            notes=tuple(obj["notes"]),
            profile=profile,
            smoothed=smoothed,
            stages={name: dict(stage) for name, stage in stages.items()},
            k=k,
            k_fraction_requested=None if kf is None else float(kf),
            regime=regime,
        )


def cutpoints(
    profile: np.ndarray,
    window: int = 3,
    method: str = "moving_average",
    *,
    sensitivity: float = 1.0,
    flat_tol: float = 1e-12,
) -> dict[str, Any]:
    """Cut an RSS profile into rise / plateau / descent with a two-stage Kneedle.

    Algorithm (module docstring): smooth (:func:`smooth`) → peak ``p = argmax`` (first, ties
    within ``flat_tol``) → ``b1`` = concave-increasing knee on ``[0, p]`` → ``b2`` = concave-decreasing knee on
    ``[p, end]``. If a stage has no knee: ``b1 = p`` / ``b2 = p`` (fallback), with the cause in
    ``reason``. Indices refer to the profile (point ``L`` = layer ``L``'s update; see
    :mod:`resdyn.study_b.readout`).

    If ``window`` exceeds the profile length it is reduced to the largest odd value ≤ n (noted
    in ``notes``); everything else about ``window``/``method`` is validated as in
    :func:`smooth`.

    Parameters
    ----------
    profile : (n,) array_like
        Finite, 1-D, ``n ≥ 3``.
    window : odd int
        Smoothing window (``savgol`` needs ≥ 3).
    method : ``"none"``, ``"moving_average"`` or ``"savgol"``
    sensitivity : float > 0
        Kneedle's ``S`` (1.0 as in the paper; larger is more conservative).
    flat_tol : float ≥ 0
        A stage whose segment range is ≤ ``flat_tol · max(1, max|y|)`` counts as flat.

    Returns
    -------
    :class:`Cutpoints` (``k`` unset; :meth:`Cutpoints.at_k` labels it, :meth:`Cutpoints.to_json`
    gives the ``phases.json`` object).

    Raises
    ------
    ValueError
        For a profile that is not 1-D, not finite or shorter than 3 points, an unknown
        method, or a bad window/sensitivity. Never for the shape of the curve.

    Examples
    --------
    >>> y = [0.2, 0.5, 0.8, 0.9, 0.92, 0.93, 0.92, 0.9, 0.8, 0.5, 0.2]
    >>> c = cutpoints(y, method="none")
    >>> c.b1, c.peak, c.b2, c.reason
    (2, 5, 8, '')
    >>> c = cutpoints([0.1, 0.2, 0.3, 0.4, 0.5])  # monotone ramp: both stages fall back
    >>> c.b1, c.peak, c.b2, c.b1_found, c.b2_found
    (4, 4, 4, False, False)
    """
    y, sens = _check_cut_args(profile, method, sensitivity, flat_tol)
    n = y.size
    w, notes = _fit_window(window, method, n)
    s = smooth(y, w if method != "none" else 1, method)

    p, rise, desc = _peak_and_stages(s, sens, flat_tol)

    b1, b2, reasons = _knees_or_peak(rise, desc, p, n)
    spans = phase_spans(n, b1, b2)
    return Cutpoints(
        b1=b1,
        b2=b2,
        peak=p,
        b1_found=rise["knee"] is not None,
        b2_found=desc["knee"] is not None,
        reason="; ".join(reasons),
        spans=tuple((a, b) for a, b in spans),
        widths=tuple(b - a for a, b in spans),
        n=n,
        window=int(w) if method != "none" else None,
        method=method,
        sensitivity=sens,
        notes=tuple(notes),
        profile=tuple(float(v) for v in y),
        smoothed=tuple(float(v) for v in s),
        stages={"rise": rise, "descent": desc},
    )


def _json_int(name: str, v: Any, source: str) -> int:
    """``v`` if it is a JSON integer (not a bool), else ValueError naming ``source`` and ``name``."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{source}: {name} must be an integer, got {v!r}")
    return v


def _json_flag(obj: Mapping[str, Any], name: str, source: str) -> bool:
    """``obj[name]`` if it is true or false, else ValueError."""
    if not isinstance(obj[name], bool):
        raise ValueError(f"{source}: {name} must be true or false, got {obj[name]!r}")
    return obj[name]


def _json_numbers(obj: Mapping[str, Any], name: str, source: str) -> tuple[float, ...]:
    """``obj[name]`` as a tuple of finite floats, else ValueError."""
    v = obj[name]
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        raise ValueError(f"{source}: {name} must be a list of numbers, got {v!r:.120}")
    if not all(math.isfinite(x) for x in v):
        raise ValueError(f"{source}: {name} has non-finite values (null/NaN); the profile must be finite")
    return tuple(float(x) for x in v)


def _json_cuts(obj: Mapping[str, Any], source: str) -> tuple[int, int, int, int, tuple, list]:
    """(n, b1, peak, b2, spans, widths) of a phases.json object, checked against each other."""
    n = _json_int("n", obj["n"], source)
    b1, peak, b2 = (_json_int(name, obj[name], source) for name in ("b1", "peak", "b2"))
    if not (n >= 1 and 0 <= b1 <= peak <= b2 <= n - 1):
        raise ValueError(
            f"{source}: cut points must satisfy 0 <= b1 <= peak <= b2 <= n-1, got b1={b1}, peak={peak}, b2={b2}, n={n}"
        )
    spans = tuple(tuple(span) for span in obj["spans"]) if isinstance(obj["spans"], list) else None
    if spans != tuple(phase_spans(n, b1, b2)):
        raise ValueError(f"{source}: spans {obj['spans']!r} do not match b1={b1}, b2={b2}, n={n}")
    widths = obj["widths"]
    if widths != [stop - start for start, stop in spans]:
        raise ValueError(f"{source}: widths {widths!r} do not match spans {obj['spans']!r}")
    return n, b1, peak, b2, spans, widths


def _json_settings(obj: Mapping[str, Any], source: str) -> tuple[Any, Any, Any, Any, Any, Any]:
    """(window, sensitivity, stages, k, k_fraction_requested, regime) of a phases.json object, checked."""
    window = obj["window"]
    if window is not None:
        _json_int("window", window, source)
    sens = obj["sensitivity"]
    if isinstance(sens, bool) or not isinstance(sens, (int, float)) or not (math.isfinite(sens) and sens > 0):
        raise ValueError(f"{source}: sensitivity must be a positive number, got {sens!r}")
    if obj["method"] not in SMOOTHING_METHODS:
        raise ValueError(f"{source}: method must be one of {SMOOTHING_METHODS}, got {obj['method']!r}")
    if not isinstance(obj["reason"], str) or not isinstance(obj["notes"], list):
        raise ValueError(f"{source}: reason must be a string and notes a list")
    stages = obj["stages"]
    if not isinstance(stages, Mapping) or set(stages) != {"rise", "descent"}:
        raise ValueError(f"{source}: stages must hold 'rise' and 'descent', got {stages!r:.120}")
    k = obj.get("k")
    if k is not None:
        _json_int("k", k, source)
    kf = obj.get("k_fraction_requested")
    if kf is not None and (isinstance(kf, bool) or not isinstance(kf, (int, float)) or not 0 < kf <= 1):
        raise ValueError(f"{source}: k_fraction_requested must be in (0, 1], got {kf!r}")
    regime = obj.get("regime")
    if regime is not None:
        _check_regime(regime, source)
    return window, sens, stages, k, kf, regime


def _check_cut_args(profile: object, method: str, sensitivity: object, flat_tol: object) -> tuple[np.ndarray, float]:
    """The profile as a finite float array (≥ 3 points) and the sensitivity as a float; ValueError otherwise."""
    if method not in SMOOTHING_METHODS:
        raise ValueError(f"method must be one of {SMOOTHING_METHODS}, got {method!r}")
    y = _as_profile(profile, min_len=3)
    try:
        sens = float(sensitivity)
    except (TypeError, ValueError):
        raise ValueError(f"sensitivity must be a positive number, got {sensitivity!r}") from None
    if not (math.isfinite(sens) and sens > 0):
        raise ValueError(f"sensitivity must be a positive number, got {sensitivity!r}")
    if not (isinstance(flat_tol, (int, float)) and math.isfinite(flat_tol) and flat_tol >= 0):
        raise ValueError(f"flat_tol must be a finite number >= 0, got {flat_tol!r}")
    return y, sens


def _fit_window(window: object, method: str, n: int) -> tuple[Any, list[str]]:
    """The smoothing window, reduced to the largest odd value ≤ n when longer (noted), and the notes."""
    notes: list[str] = []
    w = window
    if method != "none":
        if is_int(w) and w > n:
            w_new = n if n % 2 == 1 else n - 1
            notes.append(f"window {int(w)} > profile length {n}: reduced to {w_new}")
            w = w_new
        w = _check_window(w, method, n)
    return w, notes


def _peak_and_stages(s: np.ndarray, sens: float, flat_tol: float) -> tuple[int, dict, dict]:
    """The peak of a smoothed profile and the Kneedle stages before (rise) and after (descent) it.

    The peak is the first maximum, ties within ``flat_tol`` (so rounding noise of a flat curve
    cannot move it).
    """
    p = int(np.flatnonzero(s >= s.max() - flat_tol * max(1.0, float(np.max(np.abs(s)))))[0])
    idx = np.arange(s.size)
    rise = _kneedle_stage(idx[: p + 1], s[: p + 1], "increasing", sens, flat_tol, "rise (b1)")
    desc = _kneedle_stage(idx[p:], s[p:], "decreasing", sens, flat_tol, "descent (b2)")
    return p, rise, desc


def _knees_or_peak(rise: Mapping[str, Any], desc: Mapping[str, Any], p: int, n: int) -> tuple[int, int, list[str]]:
    """b1 and b2 from the two Kneedle stages, the peak ``p`` where a stage has no knee (with the reason)."""
    reasons = []
    if rise["knee"] is None:
        b1 = p
        reasons.append(rise["reason"] + f" -> fallback b1 = peak = {p}")
    else:
        b1 = int(min(max(rise["knee"], 0), p))
    if desc["knee"] is None:
        b2 = p
        reasons.append(desc["reason"] + f" -> fallback b2 = peak = {p}")
    else:
        b2 = int(min(max(desc["knee"], p), n - 1))
    return b1, b2, reasons


def profile_at(rss: pd.DataFrame, k_fraction: float) -> tuple[list[float], int]:
    """The RSS profile at one readout dimension, from a :func:`resdyn.study_b.readout.rss_profile` table.

    The hidden size d is the table's ``d`` column (one value); the target is
    ``k* = k_from_fraction(d, k_fraction)``. If the table has ``k*`` that is used, otherwise
    the tabulated k whose ``k_fraction`` is nearest to the request (the smaller k on ties).

    Returns
    -------
    (profile, k): the ``rss`` values ordered by ``layer`` (0 … m−1, as plain floats) and the k
    used.

    Raises
    ------
    ValueError
        Missing columns, an empty table, a ``d`` that is not one positive integer ≥ every k,
        or layers that are not exactly 0 … m−1 at that k.

    Examples
    --------
    >>> t = pd.DataFrame({"layer": [1, 0, 0, 1], "k": [2, 2, 4, 4], "k_fraction": [0.25, 0.25, 0.5, 0.5],
    ...                   "d": 8, "rss": [0.7, 0.6, 0.9, 0.95]})
    >>> profile_at(t, 0.25), profile_at(t, 0.4)
    (([0.6, 0.7], 2), ([0.9, 0.95], 4))
    """
    from resdyn.numerics.linalg import k_from_fraction

    if not isinstance(rss, pd.DataFrame):
        raise ValueError(f"rss must be a pandas DataFrame (an rss.tsv table), got {type(rss).__name__}")
    need = ["layer", "k", "k_fraction", "d", "rss"]
    missing = [c for c in need if c not in rss.columns]
    if missing:
        raise ValueError(f"rss table lacks columns {missing}; needs {need}, has {list(rss.columns)}")
    if len(rss) == 0:
        raise ValueError("rss table is empty")
    ds = pd.unique(rss["d"])
    if len(ds) != 1 or not float(ds[0]).is_integer() or int(ds[0]) < int(rss["k"].max()):
        raise ValueError(
            f"rss table: column d must hold one hidden size, an integer >= every k "
            f"(max k = {rss['k'].max()}), got {sorted(ds.tolist())}"
        )
    d = int(ds[0])
    ks = rss[["k", "k_fraction"]].drop_duplicates().sort_values("k")
    target = k_from_fraction(d, k_fraction)
    if target in set(ks["k"].astype(int)):
        k = target
    else:
        dist = (ks["k_fraction"].astype(float) - float(k_fraction)).abs().to_numpy()
        k = int(ks["k"].to_numpy()[int(np.argmin(dist))])  # first minimum = smaller k
    return _profile_at_k(rss, k), k


def _profile_at_k(rss: pd.DataFrame, k: int) -> list[float]:
    """The ``rss`` values at readout dimension ``k``, ordered by layer (0 … m−1 required)."""
    sub = rss[rss["k"].astype(int) == int(k)].sort_values("layer")
    layers = sub["layer"].astype(int).tolist()
    if not layers:
        raise ValueError(f"rss table has no rows at k={k} (its k: {sorted(set(rss['k'].astype(int)))})")
    if layers != list(range(len(layers))):
        raise ValueError(f"rss table at k={k}: layers must be exactly 0..{len(layers) - 1}, got {layers}")
    return [float(v) for v in sub["rss"]]


def middle_regime(resolution: pd.DataFrame) -> dict[str, Any]:
    """The middle resolution regime: the compromise k of the Pareto frontier and its neighbours.

    On the frontier rows of a ``resolution.tsv`` table (``pareto`` True; one row per distinct
    k, sorted by k), energy ``e`` and visibility ``v`` are min-max normalised over the frontier
    (an axis with no range counts as 1 everywhere). The compromise point is the frontier point
    nearest the ideal ``(1, 1)``: ``argmin sqrt((1 − ê)² + (1 − v̂)²)`` (smaller k on ties) — the
    point of the trade-off curve where neither is given up much for the other. The regime is
    that point and its immediate frontier neighbours in k (3 values, fewer at an end of the
    frontier or when it holds fewer points).

    The rule is this project's, not study B's: the study names a middle regime
    k ∈ {5%, 10%, 15%} of d that "balances" visibility and energy on the frontier, without
    saying how it is found. When every tabulated k is on the frontier (no k is dominated), the
    frontier selects nothing by itself; the nearest-(1, 1) rule alone then picks the regime,
    and ``frontier_selects`` is False with ``how`` saying so (phases.json ``regime``, the report).

    Returns
    -------
    ``{"k": [...], "k_fraction": [...], "k_center": int, "how": str, "frontier_selects": bool}``:
    the regime's k (ascending), their fractions, the compromise k, a sentence saying how it was
    chosen, and whether the frontier left out any tabulated k.

    Raises
    ------
    ValueError
        Missing columns or no frontier row.

    Examples
    --------
    >>> t = pd.DataFrame({"k": [1, 2, 5, 10, 20], "k_fraction": [.01, .02, .05, .1, .2],
    ...                   "energy": [.1, .2, .7, .9, 1.0], "visibility": [1.0, .95, .8, .3, .1],
    ...                   "pareto": True})
    >>> middle_regime(t)["k"], middle_regime(t)["k_center"]
    ([2, 5, 10], 5)
    """
    need = ["k", "k_fraction", "energy", "visibility", "pareto"]
    if not isinstance(resolution, pd.DataFrame):
        raise ValueError(
            f"resolution must be a pandas DataFrame (a resolution.tsv table), got {type(resolution).__name__}"
        )
    missing = [c for c in need if c not in resolution.columns]
    if missing:
        raise ValueError(f"resolution table lacks columns {missing}; needs {need}, has {list(resolution.columns)}")
    front = resolution[resolution["pareto"].astype(str) == "True"].copy()
    if front.empty:
        raise ValueError("resolution table has no Pareto-frontier row (column pareto all False)")
    front["k"] = front["k"].astype(int)
    front = front.sort_values(["k", "k_fraction"]).drop_duplicates("k").reset_index(drop=True)

    def unit(col: str) -> np.ndarray:
        x = front[col].to_numpy(dtype=np.float64)
        span = float(np.ptp(x))
        return (x - x.min()) / span if span > 0 else np.ones_like(x)

    dist = np.hypot(1.0 - unit("energy"), 1.0 - unit("visibility"))
    i = int(np.argmin(dist))
    sel = front.iloc[max(0, i - 1) : i + 2]
    how = (
        f"frontier point nearest the ideal (normalised energy 1, visibility 1): k = {int(front['k'][i])} "
        f"({float(front['k_fraction'][i]):g} of d), with its frontier neighbours; "
        f"{len(front)} frontier point(s)"
    )
    selects = len(front) < resolution["k"].astype(int).nunique()
    if not selects:
        how += (
            f"; every tabulated k ({len(front)}) is on the frontier, so the frontier selects no k: "
            "the nearest-(1, 1) rule alone chose the regime"
        )
    return {
        "k": sel["k"].astype(int).tolist(),
        "k_fraction": [float(x) for x in sel["k_fraction"]],
        "k_center": int(front["k"][i]),
        "how": how,
        "frontier_selects": bool(selects),
    }


def regime_agreement(
    rss: pd.DataFrame,
    regime: Mapping[str, Any],
    *,
    window: int = 3,
    method: str = "moving_average",
    sensitivity: float = 1.0,
) -> dict[str, Any]:
    """Cut the RSS profile at each k of a regime and measure how far the cut points move.

    ``regime``: :func:`middle_regime`'s result (keys ``k``, ``k_fraction``, ``k_center``,
    ``how``). For every k: :func:`cutpoints` of the profile at k (same smoothing and Kneedle
    settings as the main cut). Agreement, in layers (profile points): ``b1_shift =
    max_k b1 − min_k b1``, ``b2_shift`` likewise, ``max_shift = max(b1_shift, b2_shift)`` —
    0 when every k gives the same phases.

    Returns
    -------
    The ``regime`` object of ``phases.json`` (:data:`REGIME_KEYS`): ``regime``'s keys plus
    ``cuts`` (per k: ``k``, ``b1``, ``peak``, ``b2``, ``b1_found``, ``b2_found``, ``reason``),
    ``b1_shift``, ``b2_shift``, ``max_shift`` (int), ``frontier_selects`` (bool, from
    :func:`middle_regime`; False: every k was on the frontier) and ``reason`` ("" unless fewer
    than two k were cut: then the shifts are 0 and say nothing).
    """
    ks, k_fractions = list(regime.get("k") or []), list(regime.get("k_fraction") or [])
    if not ks or len(ks) != len(k_fractions):
        raise ValueError(
            f"regime_agreement needs at least one k and one fraction per k, got k {ks!r}, fractions {k_fractions!r}"
        )
    cuts = []
    for k in ks:
        c = cutpoints(_profile_at_k(rss, int(k)), window=window, method=method, sensitivity=sensitivity)
        cuts.append(
            {
                "k": int(k),
                "b1": c.b1,
                "peak": c.peak,
                "b2": c.b2,
                "b1_found": c.b1_found,
                "b2_found": c.b2_found,
                "reason": c.reason,
            }
        )
    b1s, b2s = [c["b1"] for c in cuts], [c["b2"] for c in cuts]
    b1_shift, b2_shift = max(b1s) - min(b1s), max(b2s) - min(b2s)
    return {
        "k": [int(k) for k in ks],
        "k_fraction": [float(f) for f in k_fractions],
        "k_center": int(regime.get("k_center", ks[len(ks) // 2])),
        "how": str(regime.get("how", "")),
        "frontier_selects": bool(regime.get("frontier_selects", True)),
        "cuts": cuts,
        "b1_shift": int(b1_shift),
        "b2_shift": int(b2_shift),
        "max_shift": int(max(b1_shift, b2_shift)),
        "reason": "" if len(ks) >= 2 else f"the regime holds one k ({ks[0]}): no agreement to measure",
    }


def _check_regime(regime: Any, source: str) -> None:
    """A phases.json ``regime`` object has :data:`REGIME_KEYS`, integer shifts ≥ 0 and one cut per k."""
    if not isinstance(regime, Mapping):
        raise ValueError(f"{source}: regime must be a JSON object, got {type(regime).__name__}")
    missing = [key for key in REGIME_KEYS if key not in regime]
    if missing:
        raise ValueError(f"{source}: regime lacks keys {missing} (has {sorted(regime)})")
    for key in ("b1_shift", "b2_shift", "max_shift"):
        v = regime[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{source}: regime.{key} must be an integer >= 0, got {v!r}")
    cuts = regime["cuts"]
    if (
        not isinstance(cuts, list)
        or not all(isinstance(c, Mapping) for c in cuts)
        or [c.get("k") for c in cuts] != regime["k"]
    ):
        raise ValueError(f"{source}: regime.cuts must hold one cut per k of regime.k {regime['k']!r}")
