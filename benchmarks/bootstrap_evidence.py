"""Perturbative vs exact bootstrap, per sublayer, on per-sample Jacobian files (docs/bootstrap.md).

    python benchmarks/bootstrap_evidence.py FOLDER [FOLDER ...] [--resamples 50] [--seed 0]

For every sublayer: the pipeline's decision (``perturbative`` or ``exact-fallback`` and why), and
the raw accuracy of the perturbative replicates with the cost cap lifted (oracle: an exact
decomposition of every replicate): max |Δ henrici| over replicates, replicates whose complex
count differs, and the largest CI-endpoint difference as a fraction of the exact interval width.
"""

from __future__ import annotations

import argparse

import numpy as np

from resdyn import artifacts
from resdyn.beyond import bootstrap as bs
from resdyn.study_a import spectral


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--resamples", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--level", type=float, default=0.95)
    ap.add_argument("--tol", type=float, default=1e-6)
    a = ap.parse_args()
    per, _, info = artifacts.JacobianBlocks.read_per_sample(a.folders)
    n = info["n_bootstrap_samples"]
    W = np.stack([np.bincount(r, minlength=n) for r in bs.bootstrap_indices(n, a.resamples, a.seed)]) / n
    print(
        "| sublayer | d | n | pipeline | largest clusters | max abs dh | cf mismatches | CI dh / width |"
        " CI dcf / width |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(per, key=lambda k: spectral.sublayer_index(*k)):
        X = per[key]()
        h_p, _, why = bs.perturbative_rows(X, W, a.tol, a.level)
        decision = "perturbative" if h_p is not None else "exact-fallback: " + why.split(":")[0]
        cap, bs.CLUSTER_FRACTION = bs.CLUSTER_FRACTION, 1.0
        raw = bs.perturbative_spectra(X, W)
        bs.CLUSTER_FRACTION = cap
        if raw["eigvals"] is None:
            print(f"| {key} | {X.shape[1]} | {n} | {decision} | – | – | – | – | – |")
            continue
        ex = [spectral.eigen_henrici(np.einsum("n,nij->ij", w, X)) for w in W]
        he = np.array([min(1.0, nn / fro) if fro > 0 else 0.0 for _, nn, fro in ex])
        ce = np.array([spectral.complex_fraction(lam, a.tol) for lam, _, _ in ex])
        hp = raw["henrici"]
        cp = np.array([spectral.complex_fraction(lam, a.tol) for lam in raw["eigvals"]])

        def rel(p: np.ndarray, e: np.ndarray) -> str:
            lo_p, hi_p = bs.percentile_ci(p, a.level)
            lo_e, hi_e = bs.percentile_ci(e, a.level)
            width = hi_e - lo_e
            diff = max(abs(lo_p - lo_e), abs(hi_p - hi_e))
            return "0" if diff == 0 else (f"{diff / width:.2g}" if width > 0 else "inf")

        print(
            f"| {key[0]}/{key[1]} | {X.shape[1]} | {n} | {decision} | {raw['cluster_sizes'][:3]} | "
            f"{np.abs(hp - he).max():.2g} | {int((np.round(cp * X.shape[1]) != np.round(ce * X.shape[1])).sum())}"
            f"/{len(W)} | {rel(hp, he)} | {rel(cp, ce)} |"
        )


if __name__ == "__main__":
    main()
