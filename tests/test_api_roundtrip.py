"""The Python API holds together: each public table-making function, called with its
optional inputs left at their defaults (and at the edge cases they allow: a flat profile, one
depth, no bootstrap), gives a result its own artifact writer accepts and its reader returns
unchanged. The lens (train_lens without held-out batches) is in tests/test_lens.py; resdyn.load
and collect in tests/test_results.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from resdyn import artifacts as A
from resdyn.beyond import bootstrap
from resdyn.study_a import schur, spectral
from resdyn.study_b import geometry, phases, readout

D, LAYERS = 6, 3


@pytest.fixture(scope="module")
def jacobians() -> dict[tuple[int, str], np.ndarray]:
    rng = np.random.default_rng(0)
    return {(L, kind): np.eye(D) + 0.3 * rng.standard_normal((D, D)) for L in range(LAYERS) for kind in ("attn", "mlp")}


@pytest.fixture(scope="module")
def translators() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [np.eye(D) + 0.2 * (L + 1) * rng.standard_normal((D, D)) for L in range(5)]


def cells(table: pd.DataFrame, cls: type[A.TsvArtifact]) -> pd.DataFrame:
    """Values as a TSV holds them: numbers as float (missing: NaN), labels ("" and missing: None)
    for the columns the class declares ``str`` (a column of empty labels reads back as NaN)."""
    out = {}
    for col in table.columns:
        c = table[col]
        if cls.columns.get(col) != "str" and pd.api.types.is_numeric_dtype(c) and not pd.api.types.is_bool_dtype(c):
            out[col] = c.to_numpy(dtype=float, na_value=np.nan)
        else:
            out[col] = [
                None if (v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) or v == "") else v
                for v in c.astype(object).tolist()
            ]
    return pd.DataFrame(out)


def roundtrip(cls: type[A.TsvArtifact], table: pd.DataFrame, path) -> None:
    """Write through the class, read back: the same cells (floats to 10 significant digits, the writer's format)."""
    cls.write(table, path)
    pd.testing.assert_frame_equal(cells(cls.read(path), cls), cells(table, cls), check_dtype=False, rtol=1e-9)


def test_spectra_and_bottleneck_with_defaults(jacobians, tmp_path):
    table, arrays = spectral.spectra_table(jacobians)
    roundtrip(A.SpectraTable, table, tmp_path / "spectra.tsv")
    A.SpectraArrays.write(arrays, tmp_path / "spectra.h5")
    back, _ = A.SpectraArrays.read(tmp_path / "spectra.h5")
    assert set(back) == set(arrays)
    for group, ds in arrays.items():
        for name, values in ds.items():
            np.testing.assert_array_equal(back[group][name], values)
    roundtrip(A.BottleneckTable, spectral.bottleneck_table(jacobians), tmp_path / "bottleneck.tsv")


def test_schur_curves_with_defaults(jacobians, tmp_path):
    roundtrip(A.SchurCurves, schur.schur_bottleneck(jacobians), tmp_path / "schur.tsv")


def test_rss_resolution_and_phase_cuts_with_defaults(translators, tmp_path):
    rss = readout.rss_profile(translators, [1, 2, 3])
    roundtrip(A.RssProfile, rss, tmp_path / "rss.tsv")
    roundtrip(A.ResolutionTable, readout.resolution_table(translators, [0.2, 0.5]), tmp_path / "resolution.tsv")
    for profile in (phases.profile_at(rss, 0.5)[0], [0.5] * 6):  # a real profile, a flat one (no knee)
        cuts = phases.cutpoints(np.asarray(profile))
        A.PhaseCuts.write(cuts, tmp_path / "phases.json")
        back = phases.Cutpoints.from_json(A.PhaseCuts.read(tmp_path / "phases.json"))
        assert (back.b1, back.b2, back.peak) == (cuts.b1, cuts.b2, cuts.peak)


def test_phase_table_with_default_metrics(tmp_path):
    per_layer = pd.DataFrame(
        {"layer": range(6), "hidden_erank": np.linspace(1, 3, 6), "update_orthogonality": np.linspace(0.1, 0.6, 6)}
    )
    for b1, b2 in ((1, 3), (0, 5)):  # phases of one layer leave sd empty, with a reason
        table = geometry.phase_table(per_layer, {"b1": b1, "b2": b2})
        roundtrip(A.PhaseMetrics, table, tmp_path / "phase_metrics.tsv")


def test_depth_scaling_with_defaults_and_one_depth(tmp_path):
    widths = pd.DataFrame({"model": ["a", "b"], "n_layers": [8, 8], "phase": [1, 1], "width": [2, 3]})
    fits = geometry.depth_scaling(widths).assign(group="g")
    roundtrip(A.ScalingFits, fits, tmp_path / "phase_widths.tsv")
    assert set(fits["status"]) == {"too_few_depths"}


def test_not_bootstrapped_rows_with_defaults(tmp_path):
    roundtrip(A.BootstrapTable, bootstrap.not_bootstrapped_rows(), tmp_path / "bootstrap.tsv")
