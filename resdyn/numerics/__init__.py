"""Numerics shared by the studies: linear algebra (SVD, eigen/Schur, effective rank, Henrici) and
shared argument checks."""
