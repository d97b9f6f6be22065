"""Trajectory figures are drawn only for models with at least two checkpoints (resdyn.plots.catalogue)."""

from __future__ import annotations

import pytest

from resdyn.pipeline import config as rc
from resdyn.plots import catalogue as figs


def smoke(lens_checkpoints: str) -> dict:
    cfg = rc.load_config("configs/smoke.yaml")
    cfg["lens"] = {**cfg["lens"], "checkpoints": lens_checkpoints}
    return rc.validate_config(cfg)


def test_lens_trajectory_needs_two_lens_checkpoints():
    spec = figs.by_name("trajectory_b")
    final = smoke("final")
    assert "1 checkpoint(s) with a tuned lens" in figs.trajectory_off(final, spec)
    assert not figs.enabled(final, spec)
    with pytest.raises(rc.ConfigError, match="'trajectory_b'.*is not drawn: every model has 1 checkpoint"):
        figs.require_studies(final, "trajectory_b")
    every = smoke("all")
    assert figs.trajectory_off(every, spec) == "" and figs.enabled(every, spec)
    # study A's trajectory counts checkpoints, lens or not
    a = next(f for f in figs.FIGURES if f.scope == "trajectory")
    assert figs.trajectory_off(final, a) == ""


def test_report_says_which_trajectory_figure_is_not_drawn_and_why():
    """The report's front page lists each figure the run leaves out, with the reason; none when
    every trajectory has two checkpoints, and none for a study switched off."""
    assert figs.not_drawn(smoke("final")) == [
        "figure trajectory_b is not drawn: every model has 1 checkpoint(s) with a tuned lens "
        "(config lens.checkpoints: final); a trajectory needs at least 2"
    ]
    assert figs.not_drawn(smoke("all")) == []
    only_a = smoke("final") | {"studies": ["A"]}
    assert figs.not_drawn(only_a) == []
