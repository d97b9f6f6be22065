"""Numerics shared by the studies: linear algebra (SVD, eigen/Schur, effective rank, Henrici),
shared argument checks, and a GPU job's fp32 precision pinned and recorded (:mod:`.precision`)."""
