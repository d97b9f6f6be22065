"""Speed of the spectral core on one random non-symmetric float64 matrix (prints; asserts nothing).

    .venv/bin/python benchmarks/spectral.py            # d = 4096 (minutes on 2 cores)
    .venv/bin/python benchmarks/spectral.py --quick    # d = 1024
    .venv/bin/python benchmarks/spectral.py --d 2048 --skip complex_schur

Each step is timed once (wall clock, time.perf_counter). The matrix mimics a residual
sublayer Jacobian, J = I + G/sqrt(d) with G standard normal.

On a shared, loaded machine multi-threaded OpenBLAS can be many times slower than one thread
(busy-waiting threads fight for cores; measured 40× for eigvals at d = 256 under load 5 on 2
cores): compare with ``OPENBLAS_NUM_THREADS=1`` set before starting Python.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import scipy
import scipy.linalg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from resdyn.numerics import linalg
from resdyn.study_a import schur, spectral  # noqa: E402

STEPS = {
    "eigvals": "eigenvalues only (LAPACK geev, no vectors)",
    "svd": "SVD with U, V (gesdd)",
    "svdvals": "singular values only (gesdd)",
    "real_schur_T": "real Schur factor, no basis (dgees) - used for Henrici",
    "real_schur": "real Schur with basis Z (dgees)",
    "complex_schur": "complex Schur with basis Q (scipy.linalg.schur output='complex')",
    "scale_nonnormal_at": "J(alpha=0.5) from a real split: two d×d products",
    "sublayer_metrics": "all per-sublayer metrics (Schur T + SVD + svdvals of J - I)",
}


def blas_threads() -> str:
    try:
        from threadpoolctl import threadpool_info

        return ", ".join(f"{i['internal_api']}:{i['num_threads']}" for i in threadpool_info())
    except Exception:
        env = {k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS") if k in os.environ}
        return ", ".join(f"{k}={v}" for k, v in env.items()) or "BLAS default"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=4096, help="matrix size (default 4096)")
    ap.add_argument("--quick", action="store_true", help="d = 1024")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", nargs="*", default=[], choices=sorted(STEPS), help="steps to leave out")
    args = ap.parse_args(argv)
    d = 1024 if args.quick else args.d
    if d < 2:
        ap.error(f"--d must be ≥ 2, got {d}")

    g = np.random.default_rng(args.seed)
    J = np.eye(d) + g.standard_normal((d, d)) / np.sqrt(d)
    print(f"# resdyn spectral benchmark: d={d}, float64, seed={args.seed}")
    print(
        f"# numpy {np.__version__}, scipy {scipy.__version__}, python {platform.python_version()}, "
        f"cpus {os.cpu_count()}, blas threads {blas_threads()}, load {os.getloadavg()[0]:.1f}"
    )

    split = None

    def run(name):
        nonlocal split
        if name == "eigvals":
            return scipy.linalg.eigvals(J, check_finite=False)
        if name == "svd":
            return scipy.linalg.svd(J, full_matrices=False, check_finite=False)
        if name == "svdvals":
            return scipy.linalg.svd(J, compute_uv=False, check_finite=False)
        if name == "real_schur_T":
            return linalg.schur_factor(J, "real", vectors=False)
        if name == "real_schur":
            split = schur.schur_split(J, "real")
            return split
        if name == "complex_schur":
            return scipy.linalg.schur(J, output="complex")
        if name == "scale_nonnormal_at":
            if split is None:
                split = schur.schur_split(J, "real")
            return split.at(0.5)
        if name == "sublayer_metrics":
            return spectral.sublayer_metrics(J)
        raise KeyError(name)

    print(f"{'step':<20} {'seconds':>9}  what")
    total = 0.0
    for name, what in STEPS.items():
        if name in args.skip:
            continue
        t0 = time.perf_counter()
        run(name)
        dt = time.perf_counter() - t0
        total += dt
        print(f"{name:<20} {dt:9.2f}  {what}", flush=True)
    print(f"{'total':<20} {total:9.2f}")


if __name__ == "__main__":
    main()
