"""Draw one figure from its input tables with resdyn.plots; PNG + PDF with provenance embedded."""

from pathlib import Path

from resdyn import io, plots, provenance


def load(path):
    suffix = Path(path).suffix
    if suffix == ".tsv":
        return io.read_tsv(path)
    if suffix == ".json":
        return io.read_json(path)
    if suffix == ".h5":
        from resdyn import spectral  # only the eigenvalue figure reads HDF5: scipy stays unimported

        return spectral.read_spectra_h5(path)[0]
    raise ValueError(f"figure input {path}: unsupported type {suffix}")


with provenance.step(snakemake) as step:
    p = snakemake.params
    fig = getattr(plots, p.plot)(*[load(f) for f in snakemake.input], title=p.title)
    plots.save_figure(fig, snakemake.output.png, snakemake.output.pdf, step.provenance(), dpi=p.dpi)
