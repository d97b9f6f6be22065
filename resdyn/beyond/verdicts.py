"""Verdicts of the paper table: does this run's number say what the study's statement says?

Each verdict is a string: ``holds: <numbers>``, ``does not hold: <numbers>`` or
``not testable: <reason>``. The rules that turn a statement without a threshold into a test
are this project's (the studies state none); they are the module constants below and are listed
in docs/claims.md:

- "≈ x" / "about x": within :data:`APPROX_REL` of x (relative);
- a range "a–b" or a bound "≤ b": the value, or its interval where one exists, meets the range
  (an interval that lies wholly outside it does not hold);
- "near-symmetric": symmetry index of J − I below :data:`NEAR_SYMMETRIC_MAX`;
- "roughly orthogonal": mean |cos(Δ_L, h_L)| below :data:`ORTHOGONAL_MAX`;
- "remains high" (effective rank): at least :data:`HIGH_RANK_SHARE` of d; "collapses": below
  :data:`COLLAPSE_FRACTION` of the step-0 value;
- layer classes for the coupling sign: the sublayers whose Henrici departure of J − I is in the
  lowest third (near-symmetric) or the highest third (strongly non-normal) of the checkpoint's
  sublayers; each class is tested with a one-sided Wilcoxon signed-rank test of its boundary
  effects against 0 at level :data:`ALPHA`;
- "partly architectural" communities: the NMI of the step-0 against the final partition is above
  its permutation null (Benjamini–Hochberg over the boundaries at :data:`ALPHA`) in at least
  :data:`ABOVE_NULL_SHARE` of the boundaries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "HOLDS",
    "FAILS",
    "UNTESTABLE",
    "APPROX_REL",
    "NEAR_SYMMETRIC_MAX",
    "ORTHOGONAL_MAX",
    "HIGH_RANK_SHARE",
    "COLLAPSE_FRACTION",
    "ALPHA",
    "ABOVE_NULL_SHARE",
    "fmt",
    "untestable",
    "compare",
    "approx",
    "in_range",
    "phase_extreme",
    "emerges",
    "henrici_classes",
    "class_sign",
    "above_null",
]

HOLDS, FAILS, UNTESTABLE = "holds", "does not hold", "not testable"
APPROX_REL = 0.10
NEAR_SYMMETRIC_MAX = 0.5
ORTHOGONAL_MAX = 0.2
HIGH_RANK_SHARE = 0.5
COLLAPSE_FRACTION = 0.5
ALPHA = 0.05
ABOVE_NULL_SHARE = 0.5


def fmt(x: float | None) -> str:
    """``x`` to 4 significant digits ("nan" for a missing or infinite number)."""
    return "nan" if x is None or not math.isfinite(float(x)) else f"{float(x):.4g}"


def untestable(reason: str) -> str:
    """The verdict ``not testable: <reason>``."""
    return f"{UNTESTABLE}: {reason}"


def _say(ok: bool, text: str) -> str:
    return f"{HOLDS if ok else FAILS}: {text}"


def compare(value: float, op: str, threshold: float, ci: tuple[float, float] | None = None, what: str = "") -> str:
    """Verdict of ``value op threshold`` (op ``>`` or ``<``); with an interval, all of it must.

    Example:
        >>> compare(0.3, ">", 0.0, (0.1, 0.5), "early − late")
        'holds: early − late 0.3 > 0, interval [0.1, 0.5]'
        >>> compare(0.3, ">", 0.0, (-0.1, 0.5))
        'does not hold: 0.3 > 0, but the interval [-0.1, 0.5] reaches 0'
    """
    if op not in (">", "<"):
        raise ValueError(f"op must be '>' or '<', got {op!r}")
    if not math.isfinite(float(value)):
        return untestable(f"{what or 'the value'} is not finite")
    label = f"{what} " if what else ""
    sign = 1.0 if op == ">" else -1.0
    if sign * (value - threshold) <= 0:
        return _say(False, f"{label}{fmt(value)} is not {op} {fmt(threshold)}")
    if ci is not None and all(math.isfinite(c) for c in ci):
        bound = ci[0] if sign > 0 else ci[1]
        if sign * (bound - threshold) <= 0:
            return _say(
                False,
                f"{label}{fmt(value)} {op} {fmt(threshold)}, but the interval "
                f"[{fmt(ci[0])}, {fmt(ci[1])}] reaches {fmt(threshold)}",
            )
        return _say(True, f"{label}{fmt(value)} {op} {fmt(threshold)}, interval [{fmt(ci[0])}, {fmt(ci[1])}]")
    return _say(True, f"{label}{fmt(value)} {op} {fmt(threshold)}")


def approx(value: float, target: float, rel: float = APPROX_REL) -> str:
    """Verdict of "≈ target": ``|value / target − 1| ≤ rel``.

    Example:
        >>> approx(0.53, 0.56), approx(0.4, 0.56)
        ('holds: 0.53 within 10% of 0.56', 'does not hold: 0.4 not within 10% of 0.56')
    """
    if not math.isfinite(float(value)):
        return untestable("the value is not finite")
    ok = abs(value / target - 1.0) <= rel
    return _say(ok, f"{fmt(value)} {'' if ok else 'not '}within {100 * rel:g}% of {fmt(target)}")


def in_range(value: float, low: float, high: float, ci: tuple[float, float] | None = None) -> str:
    """Verdict of "in [low, high]": the value, or with an interval the interval, meets the range.

    Example:
        >>> in_range(0.25, 0.2, 0.33), in_range(0.1, -math.inf, 0.26), in_range(1.2, 0.6, 1.0, (0.9, 1.5))
        ('holds: 0.25 in [0.2, 0.33]', 'holds: 0.1 in [-inf, 0.26]', 'holds: interval [0.9, 1.5] meets [0.6, 1]')
    """
    rng = f"[{'-inf' if low == -math.inf else fmt(low)}, {'inf' if high == math.inf else fmt(high)}]"
    if not math.isfinite(float(value)):
        return untestable("the value is not finite")
    if ci is not None and all(math.isfinite(c) for c in ci):
        ok = ci[0] <= high and ci[1] >= low
        return _say(ok, f"interval [{fmt(ci[0])}, {fmt(ci[1])}] {'meets' if ok else 'lies outside'} {rng}")
    ok = low <= value <= high
    return _say(ok, f"{fmt(value)} {'in' if ok else 'outside'} {rng}")


def phase_extreme(means: Mapping[int, float], phase: int, lowest: bool) -> str:
    """Verdict of "``phase`` has the lowest (``lowest``) / highest mean of the three phases".

    Example:
        >>> phase_extreme({1: 0.2, 2: 0.1, 3: 0.5}, 2, lowest=True)
        'holds: phase 2 mean 0.1 is the lowest (phase 1 0.2, phase 2 0.1, phase 3 0.5)'
    """
    finite = {p: v for p, v in means.items() if math.isfinite(float(v))}
    if phase not in finite or len(finite) < 2:
        listed = ", ".join(f"phase {p} {fmt(v)}" for p, v in sorted(means.items()))
        return untestable(f"phase {phase} or every other phase has no value ({listed})")
    best = min(finite, key=finite.get) if lowest else max(finite, key=finite.get)
    ok = best == phase and list(finite.values()).count(finite[phase]) == 1
    word = "lowest" if lowest else "highest"
    listed = ", ".join(f"phase {p} {fmt(v)}" for p, v in sorted(finite.items()))
    return _say(ok, f"phase {phase} mean {fmt(finite[phase])} is {'' if ok else 'not '}the {word} ({listed})")


def emerges(counts: Sequence[float]) -> str:
    """Verdict of "absent at initialisation, emerges monotonically": first 0, never falling,
    last above the first.

    Example:
        >>> emerges([0, 14, 24])
        'holds: 0 → 14 → 24'
        >>> emerges([2, 3, 4]), emerges([0, 5, 3])
        ('does not hold: 2 → 3 → 4 (not 0 at the first checkpoint)', 'does not hold: 0 → 5 → 3 (falls)')
    """
    if len(counts) < 2:
        return untestable("fewer than two checkpoints")
    if not all(math.isfinite(float(c)) for c in counts):
        return untestable("a checkpoint has no coupling count")
    path = " → ".join(fmt(c) for c in counts)
    if counts[0] != 0:
        return _say(False, f"{path} (not 0 at the first checkpoint)")
    if any(b < a for a, b in zip(counts, counts[1:])):
        return _say(False, f"{path} (falls)")
    if counts[-1] <= counts[0]:
        return _say(False, f"{path} (never rises)")
    return _say(True, path)


def henrici_classes(henrici: Sequence[float]) -> np.ndarray:
    """Class of each sublayer by its Henrici departure of J − I: ``"near-symmetric"`` (lowest
    third, ≤ the 1/3 quantile), ``"strongly non-normal"`` (highest third, ≥ the 2/3 quantile),
    ``"middle"`` otherwise (and for NaN).

    Example:
        >>> henrici_classes([0.1, 0.2, 0.5, 0.6, 0.9, 0.95]).tolist()
        ['near-symmetric', 'near-symmetric', 'middle', 'middle', 'strongly non-normal', 'strongly non-normal']
    """
    h = np.asarray(henrici, dtype=np.float64)
    out = np.full(h.shape, "middle", dtype=object)
    ok = np.isfinite(h)
    if ok.sum() < 3:
        return out
    lo, hi = np.quantile(h[ok], [1 / 3, 2 / 3])
    out[ok & (h <= lo)] = "near-symmetric"
    out[ok & (h >= hi)] = "strongly non-normal"
    return out


def class_sign(effects: Sequence[float], sign: int) -> tuple[str, float, int, float]:
    """Verdict of "the effects of a layer class are > 0 (sign +1) / < 0 (sign −1)".

    One-sided Wilcoxon signed-rank test of the finite effects against 0; holds when the mean has
    the sign and p < :data:`ALPHA`. Returns (verdict, mean effect, count, p).
    """
    e = np.asarray(effects, dtype=np.float64)
    e = e[np.isfinite(e)]
    if e.size < 3:
        return untestable(f"{e.size} tested boundaries in the class (< 3)"), math.nan, int(e.size), math.nan
    from scipy.stats import wilcoxon  # only this verdict needs scipy.stats

    if np.all(e == 0):
        return _say(False, f"all {e.size} effects are 0"), 0.0, int(e.size), 1.0
    p = float(wilcoxon(e, alternative="greater" if sign > 0 else "less").pvalue)
    mean = float(e.mean())
    op = ">" if sign > 0 else "<"
    ok = sign * mean > 0 and p < ALPHA
    return _say(ok, f"mean effect {fmt(mean)} ({op} 0?) over {e.size} boundaries, Wilcoxon p {fmt(p)}"), mean, e.size, p


def above_null(nmi: Sequence[float], null_q95: Sequence[float], p_values: Sequence[float]) -> str:
    """Verdict of "the partitions share structure beyond chance" over boundaries: holds when the
    Benjamini–Hochberg q-values of the per-boundary permutation p-values are ≤ :data:`ALPHA` in at
    least :data:`ABOVE_NULL_SHARE` of the boundaries with a finite p-value.

    Example:
        >>> above_null([0.6, 0.5], [0.1, 0.1], [0.005, 0.005]).split(" (")[0]
        'holds: NMI above its permutation null in 2 of 2 boundaries'
    """
    from resdyn.study_a.topology.coupling import bh_fdr  # only this verdict needs it

    nmi_a, q95, p = (np.asarray(x, dtype=np.float64) for x in (nmi, null_q95, p_values))
    ok = np.isfinite(p) & np.isfinite(nmi_a)
    if not ok.any():
        return untestable("no boundary has an NMI with a permutation null")
    n_above = int(np.sum(bh_fdr(p[ok]) <= ALPHA))
    text = (
        f"NMI above its permutation null in {n_above} of {int(ok.sum())} boundaries (BH q ≤ {ALPHA:g}; "
        f"mean NMI {fmt(float(nmi_a[ok].mean()))}, mean null 95% quantile {fmt(float(np.nanmean(q95[ok])))})"
    )
    return _say(n_above >= ABOVE_NULL_SHARE * ok.sum(), text)
