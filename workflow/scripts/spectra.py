"""Spectra and operator-type metrics of every sublayer's mean Jacobian, and the bottleneck."""

from resdyn import artifacts
from resdyn.lm import models
from resdyn.provenance import sidecars
from resdyn.study_a import spectral

with sidecars.step(snakemake) as step:
    p = snakemake.params
    files = artifacts.JacobianBlocks.read(snakemake.input.blocks)
    jacobians, attrs = files.means, files.attrs
    noise = spectral.noise_samples(files, p.noise_draws, p.noise_level)
    table, arrays = spectral.spectra_table(
        jacobians, k_fraction=p.k_fraction, tolerances=p.tolerances, device=models.device_name(p.device), noise=noise
    )
    artifacts.SpectraArrays.write(arrays, snakemake.output.arrays, attrs)
    artifacts.SpectraTable.write(table, snakemake.output.table)
    artifacts.BottleneckTable.write(spectral.bottleneck_table(jacobians, spectra=arrays), snakemake.output.bottleneck)
