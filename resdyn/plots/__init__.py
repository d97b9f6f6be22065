"""Figures of the pipeline: pandas tables in, ``matplotlib.figure.Figure`` out.

Only this package imports matplotlib; the numerical modules never do, so tables can be computed
on machines without a plotting stack. The package itself imports nothing: the Snakefile reads
:mod:`resdyn.plots.catalogue` at parse time without paying for matplotlib.

Layout (imports go one way: figure modules → common → style; none of them back):

* :mod:`~resdyn.plots.catalogue` — every figure declared once (inputs, plot function, caption,
  report category, studies); rules, report and dispatch are derived from it;
* :mod:`~resdyn.plots.style` — palette, rcParams, axis labels, :func:`~resdyn.plots.style.styled`;
* :mod:`~resdyn.plots.common` — column helpers, legends, phase shading,
  :func:`~resdyn.plots.common.save_figure` (PNG + PDF with the provenance embedded);
* :mod:`~resdyn.plots.zoo`, :mod:`~resdyn.plots.study_a_spectra`,
  :mod:`~resdyn.plots.study_a_topology`, :mod:`~resdyn.plots.study_b`, :mod:`~resdyn.plots.bridge`
  — the figures, next to their study;
* :mod:`~resdyn.plots.render` — draws a figure job's figures, restoring unchanged ones from a
  content-addressed cache.

Conventions
-----------
* Every figure function takes the pipeline's tables (as read from TSV with
  :func:`resdyn.io.read_tsv`) and a title naming the model/checkpoint, and returns a new
  :class:`~matplotlib.figure.Figure` drawn on an Agg canvas. Figures are created without
  ``pyplot`` (no global figure registry, no interactive backend, nothing to leak).
* Style: seaborn's ``whitegrid`` / context ``paper`` and colour-blind-safe ``colorblind``
  palette (their values, without importing seaborn) (sequential ``viridis`` where the hue encodes
  an ordered value such as α or k), applied through ``matplotlib.rc_context`` while the figure is
  built — importing a figure module does not change the caller's rcParams. Categories carry a
  second cue besides colour (marker shape or line style).
* Columns are selected by name; a missing column raises ``ValueError`` naming it and the
  columns the table has. NaN values become gaps/omitted points; an empty table gives a figure
  that says so (for example the coupling table of a model without boundary units).

Depth axes: sublayer index ``s = 2L`` (attention half of layer L), ``2L + 1`` (MLP half);
boundary index ``b = 2L`` (pre-attention ``h_L``), ``2L + 1`` (pre-MLP ``m_L``).
"""
