"""Figures across checkpoints and models: the catalogue's trajectory scopes, the
concatenated input tables, and what the plot functions draw (checked against the tables)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from resdyn import artifacts as A
from resdyn.plots import catalogue, render, trajectory


def data_lines(ax) -> list:
    """The plotted lines (errorbar caps are unlabelled lines too)."""
    return [line for line in ax.lines if not line.get_label().startswith("_")]


PAIRS = [("m1", "step0"), ("m1", "step30"), ("m2", "stage1-step10-tokens1B"), ("m2", "main")]


def boot(shift: float) -> pd.DataFrame:
    rows = [
        dict(metric="henrici", layer=0, kind="attn", s=0, estimate=0.1, ci_low=0.05, ci_high=0.2),
        dict(
            metric="cum_erank_full_depth",
            layer=np.nan,
            kind="all",
            s=np.nan,
            estimate=3.0 + shift,
            ci_low=2.5 + shift,
            ci_high=3.5 + shift,
        ),
    ]
    t = pd.DataFrame(rows)
    for col, v in dict(
        level=0.95,
        n_resamples=10,
        n_bootstrap_samples=4,
        n_samples_total=4,
        estimate_all_samples=1.0,
        seed=0,
        bootstrapped=True,
        note="",
        reason="",
        method="percentile",
        interval="percentile",
    ).items():
        t[col] = v
    return t


def test_catalogue_trajectory_figures_and_inputs():
    specs = {f.name: f for f in catalogue.FIGURES if f.scope in catalogue.TRAJECTORY_SCOPES}
    assert {n: (f.scope, f.category) for n, f in specs.items()} == {
        "trajectory_a": ("trajectory", "Study A"),
        "trajectory_b": ("lens_trajectory", "Study B"),
    }
    spec = specs["trajectory_a"]
    assert catalogue.output_path(spec) == "results/figures/trajectory/trajectory_a.png"
    assert catalogue.trajectory_inputs(spec, PAIRS[:2]) == [
        "results/m1/step0/bootstrap.tsv",
        "results/m1/step30/bootstrap.tsv",
        "models/m1/step0/integrity.json",
        "models/m1/step30/integrity.json",
    ]
    for f in specs.values():  # every input is a table the artifacts layer reads, and the integrity records
        assert all(issubclass(A.by_relpath(t), A.TsvArtifact) for t in f.inputs[:-1])
        assert f.inputs[-1] == A.CheckpointIntegrity.relpath


def test_trajectory_table_adds_model_checkpoint_and_step():
    t = render.trajectory_table([boot(i) for i in range(4)], PAIRS)
    assert list(t.columns[:4]) == ["model", "ckpt", "ckpt_index", "step"]
    per = t.drop_duplicates("ckpt")
    assert per["ckpt_index"].tolist() == [0, 1, 0, 1]
    np.testing.assert_array_equal(per["step"], [0.0, 30.0, 10.0, np.nan])
    np.testing.assert_array_equal(t.loc[t["metric"] == "cum_erank_full_depth", "estimate"], [3.0, 4.0, 5.0, 6.0])
    with pytest.raises(ValueError, match="3 tables for 4"):
        render.trajectory_table([boot(0)] * 3, PAIRS)


def test_study_a_trajectory_draws_each_models_whole_model_statistics():
    fig = trajectory.study_a_trajectory(render.trajectory_table([boot(i) for i in range(2)], PAIRS[:2]))
    (ax,) = fig.axes  # one whole-model statistic; the per-sublayer row is not drawn
    assert ax.get_title() == "cum_erank_full_depth" and ax.get_xlabel() == "training step"
    (line,) = data_lines(ax)
    np.testing.assert_array_equal(line.get_xdata(), [0.0, 30.0])
    np.testing.assert_array_equal(line.get_ydata(), [3.0, 4.0])
    segments = [seg for c in ax.collections for seg in c.get_segments()]  # the intervals
    np.testing.assert_allclose(sorted((s[0][1], s[1][1]) for s in segments), [(2.5, 3.5), (3.5, 4.5)])


def test_a_checkpoint_without_step_uses_training_order():
    fig = trajectory.study_a_trajectory(render.trajectory_table([boot(i) for i in range(4)], PAIRS))
    (ax,) = fig.axes
    assert ax.get_xlabel() == "checkpoint (training order)"
    assert [line.get_label() for line in data_lines(ax)] == ["m1", "m2"]
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["step0", "step30"]  # first of each index


def test_study_b_trajectory_mean_and_sd_per_phase():
    pm = pd.DataFrame(
        {
            "phase": [1, 2],
            "phase_name": ["rise", "plateau"],
            "metric": "hidden_erank",
            "mean": [2.0, 3.0],
            "sd": [np.nan, 0.5],
            "n_layers": [1, 3],
            "reason": ["one layer", ""],
        }
    )
    fig = trajectory.study_b_trajectory(render.trajectory_table([pm, pm.assign(mean=[4.0, 5.0])], PAIRS[:2]))
    (ax,) = fig.axes
    assert {line.get_label(): line.get_ydata().tolist() for line in data_lines(ax)} == {
        "m1 · rise": [2.0, 4.0],
        "m1 · plateau": [3.0, 5.0],
    }


def test_render_a_trajectory_figure(tmp_path):
    paths = []
    for i, (m, c) in enumerate(PAIRS[:2]):
        path = A.BootstrapTable.path(tmp_path, model=m, ckpt=c)
        path.parent.mkdir(parents=True)
        A.BootstrapTable.write(boot(i), path)
        paths.append(str(path))
    for m, c in PAIRS[:2]:  # the integrity records every trajectory figure reads after the tables
        path = A.CheckpointIntegrity.path(tmp_path, model=m, ckpt=c)
        path.parent.mkdir(parents=True)
        arch = {"model_type": "llama"}
        record = {"ckpt": c, "weights_sha256": c, "architecture": arch, "duplicate_of": [], "allowed": False}
        A.CheckpointIntegrity.write({**record, "architecture_differs_from": []}, path)
        paths.append(str(path))
    png, pdf = tmp_path / "t.png", tmp_path / "t.pdf"
    spec = catalogue.by_name("trajectory_a")
    inputs = {p: None for p in paths}
    assert render.render(
        spec.name, spec.plot, inputs, str(png), str(pdf), "all", spec.caption, 50, "code", {}, None, pairs=PAIRS[:2]
    )
    assert png.stat().st_size > 0 and pdf.stat().st_size > 0
    with pytest.raises(ValueError, match=r"2 templates × 3 checkpoints"):
        render.render(
            spec.name, spec.plot, inputs, str(png), str(pdf), "all", spec.caption, 50, "code", {}, None, pairs=PAIRS[:3]
        )
