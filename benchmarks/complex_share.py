"""The complex-eigenvalue share under the tolerance rule and the noise-aware rule, on planted operators
(prints a table; asserts nothing: tests/test_rotation.py holds the oracles).

    .venv/bin/python benchmarks/complex_share.py            # d = 64, 256, 1024; N = 16, 128, 1000
    .venv/bin/python benchmarks/complex_share.py --quick    # d = 64, 256

Null: an exactly symmetric operator A (eigenvalues uniform in [0.5, 1.5]) plus sampling noise, as the
mean of N per-sample Jacobians A + Z_i seen through B group means (B = 16, or 20 for N = 1000), with
the per-sample noise set so that the mean of 16 samples has symmetry index ``--symmetry``. Planted:
the same with 8 rotation pairs 1 ± 0.4i in a random basis (true share 16/d). Columns: the tolerance
rule (|Im λ| > 1e-6·max(1, |λ|)), the noise-aware rule (|Im λ| > τ, τ from the group means), the
rotation share Σ|Im λ|/Σ|λ|, the symmetry index of the mean, and τ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from resdyn.study_a import rotation, spectral  # noqa: E402


def operator(d: int, pairs: int, rng: np.random.Generator) -> np.ndarray:
    """Symmetric with eigenvalues in [0.5, 1.5], with ``pairs`` rotation blocks 1 ± 0.4i, in a random basis."""
    a = np.diag(rng.uniform(0.5, 1.5, d))
    for p in range(pairs):
        i = d - 2 * (p + 1)
        a[i : i + 2, i : i + 2] = [[1.0, 0.4], [-0.4, 1.0]]
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return q @ a @ q.T


def row(d: int, n_total: int, pairs: int, symmetry: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    a = operator(d, pairs, rng)
    B = 16 if n_total < 1000 else 20
    sigma = symmetry * np.linalg.norm(a) / (np.sqrt(2) * d) * np.sqrt(16)
    groups = a + sigma / np.sqrt(n_total / B) * rng.standard_normal((B, d, d))
    mean = groups.mean(axis=0)
    lam = np.linalg.eigvals(mean)
    tau = rotation.imag_noise_bound(groups)
    return {
        "d": d,
        "N": n_total,
        "truth": 2 * pairs / d,
        "tolerance rule": spectral.complex_fraction(lam, 1e-6),
        "noise-aware": rotation.complex_fraction_beyond_noise(lam, tau),
        "rotation share": rotation.rotation_share(lam),
        "symmetry": spectral.symmetry_index(mean),
        "tau": tau,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="d = 64, 256 only")
    ap.add_argument("--symmetry", type=float, nargs="+", default=[0.025, 0.12])
    args = ap.parse_args()
    dims = (64, 256) if args.quick else (64, 256, 1024)
    header = f"{'case':>8} {'sym16':>6} {'d':>5} {'N':>5} {'truth':>6} {'tol rule':>9} {'noise-aware':>11}"
    print(header + f" {'rot share':>9} {'sym(mean)':>9} {'tau':>8}")
    for pairs, case in ((0, "null"), (8, "planted")):
        for sym in args.symmetry:
            for d in dims:
                for n in (16, 128, 1000):
                    r = row(d, n, pairs, sym, seed=d + n)
                    print(
                        f"{case:>8} {sym:>6} {d:>5} {n:>5} {r['truth']:>6.3f} {r['tolerance rule']:>9.3f} "
                        f"{r['noise-aware']:>11.3f} {r['rotation share']:>9.4f} {r['symmetry']:>9.4f} {r['tau']:>8.4f}"
                    )


if __name__ == "__main__":
    main()
