"""Schur surgery: bottleneck curves of J(alpha) = Q (Lambda + alpha N) Q* for each alpha."""

from resdyn import artifacts
from resdyn.provenance import sidecars
from resdyn.study_a import schur

with sidecars.step(snakemake) as step:
    jacobians, _ = artifacts.JacobianBlocks.read_means(snakemake.input.blocks)
    artifacts.SchurCurves.write(schur.schur_bottleneck(jacobians, snakemake.params.alphas), snakemake.output[0])
