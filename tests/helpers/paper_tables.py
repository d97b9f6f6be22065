"""Planted tables of one model for the paper table (tests/test_paper.py) and the sensitivity table
(tests/test_sensitivity.py): in ``planted(True)`` every testable statement holds, in
``planted(False)`` every one does not."""

from __future__ import annotations

import numpy as np
import pandas as pd

from resdyn.beyond.paper import ModelTables

FINAL = "step1000"


#: The checkpoints.tsv column and bootstrap metric of the complex share each ``spectra.complex_rule`` reads.
COMPLEX = {
    "tolerance": ("complex_frac_J_tol1e-06", "complex_fraction_early_minus_late"),
    "beyond_noise": ("complex_frac_beyond_noise", "complex_fraction_beyond_noise_early_minus_late"),
}


def checkpoints(ok: bool, d: int = 8, rule: str = "tolerance") -> pd.DataFrame:
    # 6 sublayers: early third s 0-1, late third s 4-5, early and middle s 0-3
    final = {
        "symmetry_minus_identity": [1.2, 1.0, 0.8, 0.6, 0.3, 0.2],
        "henrici_JmI": [0.9, 0.8, 0.6, 0.4, 0.2, 0.1],
        COMPLEX[rule][0]: [0.99, 0.97, 0.5, 0.3, 0.1, 0.1],
        "cum_erank": [7.0, 6.0, 4.0, 3.0, 2.0, 1.0],
    }
    step0 = {"symmetry_minus_identity": [0.1] * 6, COMPLEX[rule][0]: [0.1] * 6, "cum_erank": [8.0] * 5 + [6.0]}
    if not ok:
        final = {k: v[::-1] for k, v in final.items() if k != "cum_erank"} | {"cum_erank": [7.0] * 5 + [1.8]}
        step0 = {
            "symmetry_minus_identity": [2.0] * 6,
            COMPLEX[rule][0]: [0.9] * 6,
            "cum_erank": [8.0] * 5 + [2.0],
        }
    parts = []
    for ck, cols in (("step0", step0), ("step500", step0), (FINAL, final)):
        part = pd.DataFrame({"ckpt": ck, "s": range(6), "d": d, "henrici_JmI": final["henrici_JmI"], **cols})
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def coupling(ok: bool) -> pd.DataFrame:
    # near-symmetric sublayers: s 4-5 when ok (Henrici falls with depth), s 0-1 otherwise
    sym, nonnormal = ((4, 5), (0, 1)) if ok else ((0, 1), (4, 5))
    effect = {s: (0.5 if ok else -0.5) for s in sym} | {s: (-0.5 if ok else 0.5) for s in nonnormal}
    rows = [{"s": s, "effect_log_median_ratio": e + 0.01 * i * np.sign(e)} for s, e in effect.items() for i in range(4)]
    rows += [{"s": 2, "effect_log_median_ratio": np.nan}, {"s": 3, "effect_log_median_ratio": 0.3}]
    return pd.DataFrame(rows)


def schur(ok: bool) -> pd.DataFrame:
    a1, a0 = [10.0, 5.0, 1.0], ([10.0, 9.0, 8.0] if ok else [10.0, 2.0, 1.5])
    return pd.DataFrame({"alpha": [1.0] * 3 + [0.0] * 3, "s": [0, 1, 2] * 2, "erank": a1 + a0})


def phases(ok: bool) -> dict:
    smoothed = [0.2, 0.5, 0.8, 0.85, 0.86, 0.85, 0.5, 0.2] if ok else [0.8, 0.8, 0.8, 0.2, 0.9, 0.1, 0.1, 0.9]
    k = [0.05, 0.1, 0.15] if ok else [0.25, 0.3, 0.5]
    regime = {"k": [1, 2, 3], "k_fraction": k, "k_center": 2, "b1_shift": 1, "b2_shift": 0, "max_shift": 1}
    return {
        "n": 8,
        "b1": 2,
        "b2": 5,
        "peak": 4,
        "b1_found": True,
        "b2_found": True,
        "smoothed": smoothed,
        "profile": smoothed,
        "regime": regime,
    }


def geometry(ok: bool) -> pd.DataFrame:
    # layers 0-2 phase 1, 3-5 phase 2, 6-8 phase 3 (b1 = 2, b2 = 5), then the output row
    if ok:
        hidden, upd_erank = [3, 5, 9, 8.8, 8.9, 8.7, 5, 4, 3], [2, 3, 4, 9, 6, 5, 3, 2, 1]
        norm = [1, 1, 1, 2, 2, 2, 3, 10, 20]
    else:
        hidden, upd_erank = [3, 3.1, 3.2, 1, 9, 2, 4, 10, 3], [9, 3, 4, 2, 1, 1, 3, 2, 1]
        norm = [1, 1, 1, 2, 2, 2, 3, 10, 40]
    return pd.DataFrame(
        {
            "layer": range(10),
            "state": ["h_L"] * 9 + ["output"],
            "hidden_erank": [*hidden, 1.0],
            "update_erank": [*upd_erank, np.nan],
            "update_norm": [*norm, np.nan],
        }
    )


def phase_metrics(ok: bool) -> pd.DataFrame:
    values = {
        "update_orthogonality": (0.1, 0.05, 0.5) if ok else (0.5, 0.6, 0.1),
        "norm_ratio": (2.0, 1.0, 3.0) if ok else (0.5, 1.0, 0.5),
        "tuned_hit1": (0.25, 0.55, 0.8) if ok else (0.1, 0.2, 0.3),
        "logit_hit1": (0.01, 0.05, 0.4) if ok else (0.5, 0.6, 0.1),
        "tuned_hit5_over_hit1": (3.0, 2.0, 1.2) if ok else (2.0, 3.0, 1.0),
        "update_erank": (5.0, 8.0, 2.0) if ok else (5.0, 2.0, 8.0),
    }
    return pd.DataFrame(
        [{"phase": p, "metric": m, "mean": v[p - 1], "reason": ""} for m, v in values.items() for p in (1, 2, 3)]
    )


def lens_metrics(ok: bool) -> pd.DataFrame:
    rows = [{"lens": "tuned", "layer": L, "kl": 1.0, "hit1": 0.3} for L in range(10)]
    rows += [{"lens": "logit", "layer": L, "kl": 5.0 if ok else 1.5, "hit1": 0.01} for L in range(10)]
    return pd.DataFrame(rows)


def widths(ok: bool) -> pd.DataFrame:
    slopes = {1: 0.2, 2: 0.8, 3: 0.05} if ok else {1: 0.5, 2: 0.3, 3: 0.5}
    return pd.DataFrame(
        [
            {"group": "g", "phase": p, "status": "ok", "slope": s, "slope_ci_low": s - 0.1, "slope_ci_high": s + 0.1}
            for p, s in slopes.items()
        ]
    )


def partitions(ok: bool) -> pd.DataFrame:
    # 4 boundaries of step 0 against the final: above the null in all (ok) or in 1 of 4
    p = [0.005] * 4 if ok else [0.005, 0.3, 0.6, 1.0]
    return pd.DataFrame(
        {"ckpt": "step0", "reference": "final", "nmi": [0.4, 0.5, 0.45, 0.5], "nmi_null_q95": 0.1, "nmi_p": p}
    )


def planted(ok: bool, d: int = 8, rule: str = "tolerance") -> ModelTables:
    boot = pd.DataFrame(
        {
            "metric": ["cum_erank_full_depth", COMPLEX[rule][1]],
            "bootstrapped": True,
            "ci_low": [0.5, 0.5 if ok else -1.0],
            "ci_high": [1.5, 1.0 if ok else -0.5],
            "n_bootstrap_samples": 20,
            "n_samples_total": 50,
        }
    )
    counts = [0, 3, 6] if ok else [1, 3, 2]
    return ModelTables(
        model="qwen2.5-tiny",
        ckpts=["step0", "step500", FINAL],
        lens_ckpt=FINAL,
        checkpoints=checkpoints(ok, d, rule),
        coupling_counts=pd.DataFrame(
            {"ckpt": ["step0", "step500", FINAL], "n_significant_layers": counts, "n_layers": 8}
        ),
        bottleneck={FINAL: pd.DataFrame({"s": range(4), "erank": [40.0, 30.0, 12.0, 5.0]})},
        bootstrap={FINAL: boot},
        phases=phases(ok),
        geometry=geometry(ok),
        phase_metrics=phase_metrics(ok),
        coupling=coupling(ok),
        schur=schur(ok),
        partitions=partitions(ok),
        lens_metrics=lens_metrics(ok),
        n_samples=6,
        complex_rule=rule,
    )
