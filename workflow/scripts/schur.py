"""Schur surgery: bottleneck curves of J(alpha) = Q (Lambda + alpha N) Q* for each alpha."""

from resdyn import artifacts, jacobian, provenance, schur

with provenance.step(snakemake) as step:
    jacobians, _ = jacobian.mean_jacobians(snakemake.input.blocks)
    artifacts.SchurCurves.write(schur.schur_bottleneck(jacobians, snakemake.params.alphas), snakemake.output[0])
