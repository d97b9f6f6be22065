"""resdyn.plots: figures from small synthetic tables, and the provenance-embedding saver."""

from __future__ import annotations

import io as _io
import json
import re
import subprocess
import sys
import warnings
import zlib
from pathlib import Path
from types import SimpleNamespace

import matplotlib as mpl
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from PIL import Image

from resdyn.plots import (
    bridge,
    catalogue,
    common,
    render,
    study_a_spectra,
    study_a_topology,
    study_b,
    style,
    trajectory,
    zoo,
)
from resdyn.provenance import sidecars

# One namespace over the figure modules (the tests below predate the split of resdyn/plots.py).
plots = SimpleNamespace(
    **{
        k: v
        for m in (style, common, zoo, study_a_spectra, study_a_topology, study_b, bridge, trajectory)
        for k, v in vars(m).items()
        if not k.startswith("__")
    }
)

# ------------------------------------------------------------------------------- helpers


def _render(fig: Figure) -> None:
    """Draw the figure for real (layout, ticks, log scales): crashes hide here, not at creation."""
    fig.savefig(_io.BytesIO(), format="png", dpi=30)


def _check(fig: Figure, n_axes: int, title: str | None = None, render: bool = False) -> list:
    assert isinstance(fig, Figure)
    axes = fig.get_axes()
    assert len(axes) == n_axes
    for ax in axes:
        assert ax.get_xlabel().strip(), "every axes needs an x label"
        assert ax.get_ylabel().strip(), "every axes needs a y label"
    if title is not None:
        assert title in fig.get_suptitle()
    if render:  # the one-row and NaN tests below render every function; keep the rest fast
        _render(fig)
    return axes


def _line(ax, label: str):
    found = [ln for ln in ax.get_lines() if ln.get_label() == label]
    assert found, f"no line labelled {label!r}; have {[ln.get_label() for ln in ax.get_lines()]}"
    return found[0]


def _legend_texts(ax) -> list[str]:
    leg = ax.get_legend()
    return [t.get_text() for t in leg.get_texts()] if leg else []


def _eq(a, b) -> None:
    np.testing.assert_array_equal(np.asarray(a, dtype=float), np.asarray(b, dtype=float))


# ------------------------------------------------------------------------------- synthetic tables


def training_df(n: int = 4) -> pd.DataFrame:
    step = np.arange(n) * 100
    return pd.DataFrame(
        {
            "step": step,
            "lr": np.linspace(0, 1e-3, n),
            "train_loss": np.r_[np.nan, np.linspace(5, 3, n - 1)] if n > 1 else [np.nan],
            "heldout_loss": np.linspace(6, 3.2, n),
            "unigram_loss": np.full(n, 4.5),
        }
    )


def spectra_df(n_layers: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    rows = []
    for L in range(n_layers):
        for kind in ("attn", "mlp"):
            rows.append(
                {
                    "layer": L,
                    "kind": kind,
                    "s": 2 * L + (kind == "mlp"),
                    "henrici": rng.uniform(),
                    "henrici_JmI": rng.uniform(),
                    "complex_frac_J_tol1e-09": rng.uniform(),
                    "complex_frac_J_tol1e-06": rng.uniform(),
                    "complex_frac_J_tol1e-03": rng.uniform(),
                    "complex_frac_JmI_tol1e-06": rng.uniform(),
                    "self_alignment_kfrac": rng.uniform(),
                    "self_alignment_k1": rng.uniform(),
                    "self_alignment_kerank": rng.uniform(),
                    "erank_J": rng.uniform(1, 8),
                }
            )
    return pd.DataFrame(rows)


def spectra_arrays(n_layers: int = 3, d: int = 6) -> dict:
    rng = np.random.default_rng(2)
    out = {}
    for L in range(n_layers):
        for kind in ("attn", "mlp"):
            lam = np.linalg.eigvals(rng.standard_normal((d, d)) / np.sqrt(d) + np.eye(d))
            out[f"L{L:03d}_{kind}"] = {
                "eigenvalues": lam.astype(np.complex128),
                "singular_values": np.sort(rng.uniform(0, 2, d))[::-1],
                "singular_values_JmI": np.sort(rng.uniform(0, 2, d))[::-1],
            }
    return out


def bottleneck_df(n: int = 6) -> pd.DataFrame:
    s = np.arange(n)
    return pd.DataFrame(
        {
            "s": s,
            "layer": s // 2,
            "kind": np.where(s % 2, "mlp", "attn"),
            "d": 16,
            "erank": 16 * 0.6**s,
            "erank_energy": 14 * 0.55**s,
            "participation_ratio": 10 * 0.5**s,
            "log10_fro": np.linspace(0, 3, n),
            "erank_single": np.full(n, 12.0),
            "pr_single": np.full(n, 8.0),
        }
    )


def schur_df(alphas=(0.0, 0.5, 1.0), n: int = 5) -> pd.DataFrame:
    rows = [
        {
            "alpha": a,
            "s": s,
            "layer": s // 2,
            "kind": ("attn", "mlp")[s % 2],
            "erank": 16 * (0.9 - 0.3 * a) ** s,
            "pr": 3.0,
            "log10_fro": 0.0,
            "henrici_single": a / 2,
        }
        for a in alphas
        for s in range(n)
    ]
    return pd.DataFrame(rows)


def ckpt_df(ckpts=("step0", "mid", "final")) -> pd.DataFrame:
    parts = []
    for i, c in enumerate(ckpts):
        df = spectra_df()[["layer", "kind", "s", "complex_frac_J_tol1e-06", "henrici", "self_alignment_kfrac"]].copy()
        df["henrici"] = df["henrici"] + i
        df["cum_erank"] = 16 * 0.7 ** (df["s"] + i)
        df.insert(0, "ckpt", c)
        parts.append(df)
    return pd.concat(parts, ignore_index=True)


def summary_df() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "layer": [0, 0, 1, 1],
            "boundary": ["pre_attn", "pre_mlp", "pre_attn", "pre_mlp"],
            "n_communities": [3, 2, 4, 1],
            "sizes": ["[5, 2, 1]", "[6, 2]", [3, 2, 2, 1], "[8]"],
            "quality": [0.4, 0.3, 0.5, 0.0],
        }
    )


def coupling_df() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "layer": [0, 0, 1, 1, 2, 2],
            "boundary": ["pre_attn", "pre_mlp"] * 3,
            "effect_log_median_ratio": [0.2, -0.1, 0.5, 0.05, 0.3, -0.4],
            "p_value": [0.01, 0.5, 0.001, 0.9, 0.02, 0.03],
            "q_value": [0.03, 0.6, 0.006, 0.9, 0.04, 0.045],
            "significant": [True, False, True, False, True, True],
            "henrici": [0.1, 0.3, 0.2, 0.6, 0.5, 0.4],
        }
    )


def counts_df() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "model": ["a", "a", "a", "b", "b", "b"],
            "ckpt": ["step0", "mid", "final"] * 2,
            "n_significant_layers": [0, 3, 5, 1, 2, 4],
            "n_layers": [8] * 6,
            "n_significant_boundaries": [0, 4, 9, 2, 2, 7],
            "n_boundaries": [16] * 6,
        }
    )


def similarity_df(ckpts=("step0", "mid", "final"), n_layers: int = 3) -> pd.DataFrame:
    rows = []
    for i, c in enumerate(ckpts):
        for L in range(n_layers):
            for b in ("pre_attn", "pre_mlp"):
                for ref, rc in (("final", ckpts[-1]), ("first", ckpts[0])):
                    same = c == rc
                    rows.append(
                        {
                            "ckpt": c,
                            "layer": L,
                            "boundary": b,
                            "reference_ckpt": rc,
                            "reference": ref,
                            "nmi": 1.0 if same else 0.3 + 0.1 * L + 0.2 * i,
                            "ari": 1.0 if same else 0.1 * L,
                            "modularity": 0.1 * i + 0.01 * L,
                            "reason": None,
                        }
                    )
    return pd.DataFrame(rows)


def curves_df(n: int = 4, evals: int = 3, per_eval: int = 640) -> pd.DataFrame:
    """A lens's curves.tsv: held-out KL (L + 1)/(e + 1) at eval e, train KL twice that (no train row at e = 0)."""
    rows = []
    for e in range(evals):
        for split in ("train", "heldout"):
            if split == "train" and e == 0:
                continue
            for L in range(n):
                kl = (L + 1) / (e + 1) * (2.0 if split == "train" else 1.0)
                rows.append({"step": 10 * e, "tokens_seen": per_eval * e, "layer": L, "split": split, "kl": kl})
    return pd.DataFrame(rows)


def lens_df(n: int = 4) -> pd.DataFrame:
    rows = []
    for lens in ("tuned", "logit"):
        for L in range(n + 1):
            rows.append(
                {
                    "lens": lens,
                    "layer": L,
                    "kl": (n - L) * (1 if lens == "tuned" else 2.0),
                    "ce": 3 + (n - L) * 0.1,
                    "hit1": L / n,
                    "hit5": min(1, L / n + 0.2),
                    "n_tokens": 100,
                }
            )
    return pd.DataFrame(rows)


def rss_df(n: int = 9, ks=(2, 4, 8), d: int = 16) -> pd.DataFrame:
    rows = []
    for k in ks:
        for L in range(n):
            rows.append(
                {
                    "layer": L,
                    "k": k,
                    "k_fraction": k / d,
                    "rss": 0.5 + 0.4 * np.sin(np.pi * L / (n - 1)) * (k / d) ** 0.1,
                    "grassmann_distance": 0.3,
                    "energy": 0.5,
                }
            )
    return pd.DataFrame(rows)


PHASES = {"b1": 2, "b2": 6, "peak": 4, "reason": "", "k": 4, "n": 9}


def resolution_df() -> pd.DataFrame:
    e = np.array([0.2, 0.5, 0.9, 0.4])
    v = np.array([0.9, 0.6, 0.1, 0.5])
    return pd.DataFrame(
        {
            "k_fraction": [0.05, 0.1, 0.5, 0.08],
            "k": [1, 2, 8, 1],
            "energy": e,
            "mean_rss": 1 - v,
            "visibility": v,
            "pareto": [True, True, True, False],
        }
    )


def geometry_df(n: int = 8) -> pd.DataFrame:
    L = np.arange(n + 1)
    df = pd.DataFrame(
        {
            "layer": L,
            "state": ["h_L"] * n + ["output"],
            "hidden_erank": 10 + L,
            "update_orthogonality": np.r_[np.linspace(0.1, 0.5, n), np.nan],
            "norm_ratio": np.r_[np.linspace(1, 2, n), np.nan],
            "relative_update_norm": np.r_[np.linspace(0.3, 0.1, n), np.nan],
        }
    )
    return df


def widths_df() -> pd.DataFrame:
    rows = []
    for model, n in (("m8", 8), ("m12", 12), ("m16", 16)):
        w = [2, n // 2 - 2, (n - 1) - 2 - (n // 2 - 2)]
        rows += [{"model": model, "n_layers": n, "phase": p, "width": w[p - 1]} for p in (1, 2, 3)]
    return pd.DataFrame(rows)


def fits_df(status: str = "ok") -> pd.DataFrame:
    ok = status == "ok"
    return pd.DataFrame(
        {
            "phase": [1, 2, 3],
            "status": status,
            "slope": [0.0, 0.5, 0.5] if ok else np.nan,
            "intercept": [2.0, -2.0, -1.0] if ok else np.nan,
            "slope_ci_low": [0.0, 0.4, 0.3] if ok else np.nan,
            "slope_ci_high": [0.0, 0.6, 0.7] if ok else np.nan,
        }
    )


# ------------------------------------------------------------------------------- figure functions


def test_training_curve():
    df = training_df()
    fig = plots.training_curve(df, "zoo-8: training curve")
    (ax,) = _check(fig, 1, "zoo-8")
    _eq(_line(ax, "held-out").get_ydata(), df["heldout_loss"])
    _eq(_line(ax, "train (mean since previous eval)").get_ydata(), df["train_loss"])
    uni = _line(ax, "unigram baseline (held-out)")
    _eq(uni.get_ydata(), df["unigram_loss"])
    assert uni.get_linestyle() == "--"
    with pytest.raises(ValueError, match="heldout_loss"):
        plots.training_curve(df.drop(columns="heldout_loss"), "zoo-8")


def test_eigenvalue_grid_layers_by_kind():
    arrays = spectra_arrays(3)
    fig = plots.eigenvalue_grid(arrays, "zoo-8 / final")
    fig_axes = fig.get_axes()
    assert len(fig_axes) == 6
    assert "zoo-8 / final" in fig.get_suptitle()
    # row-major: L0 attn, L0 mlp, L1 attn, ...; points are the eigenvalues
    lam = arrays["L001_mlp"]["eigenvalues"]
    ax = fig_axes[3]
    assert "L1" in ax.get_title() and "MLP" in ax.get_title()
    offsets = ax.collections[0].get_offsets()
    _eq(offsets[:, 0], lam.real)
    _eq(offsets[:, 1], lam.imag)
    assert ax.get_aspect() == 1.0
    circle = ax.get_lines()[0]
    np.testing.assert_allclose(np.hypot(circle.get_xdata(), circle.get_ydata()), 1.0)
    assert fig_axes[-1].get_xlabel() and fig_axes[0].get_ylabel()
    _render(fig)
    # (arrays, attrs) from read_spectra_h5 is accepted too
    assert len(plots.eigenvalue_grid((arrays, {"schema": "x"}), "t").get_axes()) == 6


def test_eigenvalue_grid_wraps_deep_models_and_tolerates_nan():
    arrays = spectra_arrays(10, d=3)
    arrays["L004_attn"]["eigenvalues"] = np.array([np.nan + 0j, 0.5 + 0.5j, np.inf])
    del arrays["L009_mlp"]
    fig = plots.eigenvalue_grid(arrays, "deep")
    assert len(fig.get_axes()) == 19
    for ax in fig.get_axes():
        if ax.get_subplotspec().is_last_row() or not any(
            a.get_subplotspec().colspan == ax.get_subplotspec().colspan
            and a.get_subplotspec().rowspan.start > ax.get_subplotspec().rowspan.start
            for a in fig.get_axes()
        ):
            assert ax.get_xlabel()
    _render(fig)
    with pytest.raises(ValueError, match="L9_attention"):
        plots.eigenvalue_grid({"L9_attention": {"eigenvalues": [1.0]}}, "t")
    with pytest.raises(ValueError, match="eigenvalues"):
        plots.eigenvalue_grid({"L000_attn": {"singular_values": [1.0]}}, "t")


def test_operator_profile():
    df = spectra_df()
    fig = plots.operator_profile(df, "zoo-8 / final")
    ax_c, ax_h, ax_a = _check(fig, 3, "zoo-8 / final")
    line = _line(ax_c, "$J$, tol 1e-06")
    _eq(line.get_xdata(), df["s"])
    _eq(line.get_ydata(), df["complex_frac_J_tol1e-06"])
    assert _line(ax_c, "$J-I$, tol 1e-06").get_linestyle() == "--"
    _eq(_line(ax_h, "$J$").get_ydata(), df["henrici"])
    _eq(_line(ax_a, "k = 1").get_ydata(), df["self_alignment_k1"])
    # attention and MLP points carry different markers
    markers = {ln.get_marker() for ln in ax_h.get_lines() if ln.get_linestyle() == "None"}
    assert {"o", "s"} <= markers
    attn = [ln for ln in ax_h.get_lines() if ln.get_marker() == "o"][0]
    _eq(attn.get_xdata(), df.loc[df["kind"] == "attn", "s"])
    # with the symmetry columns: a panel after the Henrici departure, self-alignment last
    sym = df.assign(symmetry=np.linspace(0, 2, len(df)), symmetry_minus_identity=np.linspace(2, 0, len(df)))
    ax_c, ax_h, ax_s, ax_a = _check(plots.operator_profile(sym, "t"), 4, "t")
    _eq(_line(ax_s, "$J$").get_ydata(), sym["symmetry"])
    _eq(_line(ax_s, "$J-I$").get_ydata(), sym["symmetry_minus_identity"])
    _eq(_line(ax_a, "k = 1").get_ydata(), sym["self_alignment_k1"])
    with pytest.raises(ValueError, match="henrici"):
        plots.operator_profile(df.drop(columns="henrici"), "t")
    with pytest.raises(ValueError, match="self_alignment"):
        plots.operator_profile(df.drop(columns=[c for c in df if c.startswith("self_alignment")]), "t")


def test_funnel_log_scale_and_reference():
    df = bottleneck_df()
    (ax,) = _check(plots.funnel(df, "zoo-8 / final"), 1, "zoo-8 / final")
    assert ax.get_yscale() == "log"
    _eq(_line(ax, "effective rank erank($P_s$)").get_ydata(), df["erank"])
    ref = _line(ax, "erank($J_s$) (single sublayer)")
    _eq(ref.get_ydata(), df["erank_single"])
    assert ref.get_linestyle() == "--"
    # without references, and with a table that has nothing positive: linear, no warnings
    (ax,) = _check(plots.funnel(df[["s", "erank"]], "t"), 1)
    assert len(ax.get_lines()) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (ax,) = _check(
            plots.funnel(
                df.assign(erank=np.nan, participation_ratio=np.nan, erank_single=np.nan, pr_single=np.nan, d=np.nan),
                "t",
            ),
            1,
        )
    assert ax.get_yscale() == "linear"


def test_schur_curves_one_line_per_alpha():
    df = schur_df()
    (ax,) = _check(plots.schur_curves(df, "zoo-8 / final"), 1, "zoo-8 / final")
    lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("α")]
    assert len(lines) == 3
    _eq(_line(ax, "α = 0.5").get_ydata(), df.loc[df["alpha"] == 0.5, "erank"])
    assert len({ln.get_color() if isinstance(ln.get_color(), str) else tuple(ln.get_color()) for ln in lines}) == 3
    assert ax.get_yscale() == "log"


def test_checkpoint_comparison_keeps_order():
    order = ("step0", "final", "mid")  # not alphabetical: the table's order wins
    df = ckpt_df(order)
    metrics = ["complex_frac_J_tol1e-06", "henrici", "self_alignment_kfrac", "cum_erank"]
    axes = _check(plots.checkpoint_comparison(df, metrics, "OLMo"), 4, "OLMo")
    labels = [ln.get_label() for ln in axes[1].get_lines()]
    assert labels == list(order)
    _eq(_line(axes[1], "final").get_ydata(), df.loc[df["ckpt"] == "final", "henrici"])
    assert axes[3].get_yscale() == "log"
    assert _legend_texts(axes[0]) == list(order)
    # default metrics and the 'checkpoint' spelling
    axes = _check(plots.checkpoint_comparison(df.rename(columns={"ckpt": "checkpoint"}), None, "t"), 4)
    with pytest.raises(ValueError, match="nope"):
        plots.checkpoint_comparison(df, ["henrici", "nope"], "t")


def test_community_sizes():
    df = summary_df()
    ax_s, ax_n, ax_q = _check(plots.community_sizes(df, "zoo-8 / final"), 3, "zoo-8 / final")
    line = _line(ax_n, "number of communities")
    _eq(line.get_xdata(), [0, 1, 2, 3])  # boundary index 2L + [pre-MLP]
    _eq(line.get_ydata(), df["n_communities"])
    pts = np.concatenate([c.get_offsets()[:, 1] for c in ax_s.collections])
    assert sorted(pts.tolist()) == sorted([5, 2, 1, 6, 2, 3, 2, 2, 1, 8])
    _eq(_line(ax_s, "median size").get_ydata(), [2, 4, 2, 8])
    assert ax_s.get_yscale() == "log"
    # without quality: two axes; NaN sizes and counts are fine
    _check(
        plots.community_sizes(
            df.drop(columns="quality").assign(sizes=[np.nan, "[]", "[2]", None], n_communities=[np.nan, 0, 1, np.nan]),
            "t",
        ),
        2,
    )
    with pytest.raises(ValueError, match="not a list of sizes"):
        plots.community_sizes(df.assign(sizes=["[1, 2", "[1]", "[1]", "[1]"]), "t")
    # the pipeline's communities_summary.tsv writes sizes comma-joined
    ax_c = _check(plots.community_sizes(df.assign(sizes=["5,2,1", "6,2", "3,2,2", "1,8"]), "t"), 3)[0]
    pts = np.concatenate([c.get_offsets()[:, 1] for c in ax_c.collections])
    assert sorted(pts.tolist()) == sorted([5, 2, 1, 6, 2, 3, 2, 2, 1, 8])


def test_coupling_profile_filled_vs_hollow():
    df = coupling_df()
    (ax,) = _check(plots.coupling_profile(df, "zoo-8 / final"), 1, "zoo-8 / final")
    line = _line(ax, "boundaries")
    _eq(line.get_xdata(), [0, 1, 2, 3, 4, 5])
    _eq(line.get_ydata(), df["effect_log_median_ratio"])
    marks = [ln for ln in ax.get_lines() if ln.get_linestyle() == "None"]
    filled = [ln for ln in marks if ln.get_markerfacecolor() != "white"]
    hollow = [ln for ln in marks if ln.get_markerfacecolor() == "white"]
    assert len(filled[0].get_xdata()) == 4 and len(hollow[0].get_xdata()) == 2
    # TSV round trip gives the same picture (booleans may come back as strings)
    tsv = pd.read_csv(_io.StringIO(df.astype({"significant": str}).to_csv(sep="\t", index=False)), sep="\t")
    (ax2,) = _check(plots.coupling_profile(tsv, "t"), 1)
    assert len([ln for ln in ax2.get_lines() if ln.get_markerfacecolor() == "white"][0].get_xdata()) == 2
    # one line per checkpoint when the table spans several
    two = pd.concat([df.assign(ckpt="step0"), df.assign(ckpt="final")], ignore_index=True)
    (ax,) = _check(plots.coupling_profile(two, "t"), 1)
    assert {"step0", "final"} <= {ln.get_label() for ln in ax.get_lines()}
    # the empty table resdyn.study_a.topology.coupling_table returns for no rows
    _check(plots.coupling_profile(pd.DataFrame(columns=["p_value", "q_value", "significant"]), "t"), 1)
    with pytest.raises(ValueError, match="significant"):
        plots.coupling_profile(df.drop(columns=["significant", "q_value"]), "t")


def test_spearman_matches_scipy_with_ties_and_perfect_order():
    from scipy import stats

    from resdyn.plots.study_a_topology import _spearman

    rng = np.random.default_rng(0)
    cases = [(np.arange(6.0), np.arange(6.0) ** 3), (np.arange(6.0), -np.arange(6.0))]
    for n in (3, 5, 12, 40):
        x = rng.integers(0, 4, n).astype(float)  # many ties
        cases += [(x, rng.standard_normal(n)), (rng.standard_normal(n), 0.5 * x + rng.standard_normal(n))]
    for x, y in cases:
        want = stats.spearmanr(x, y)
        rho, p, n = _spearman(x, y)
        assert n == len(x)
        assert rho == pytest.approx(want.statistic, abs=1e-12) and p == pytest.approx(want.pvalue, abs=1e-12)
    x = np.array([1.0, np.nan, 2.0, 3.0, 4.0])
    assert _spearman(x, np.array([2.0, 1.0, np.inf, 1.0, 0.0]))[2] == 3  # non-finite pairs dropped
    assert np.isnan(_spearman(np.ones(4), np.arange(4.0))[0])  # constant input: no ρ


def test_coupling_vs_henrici_spearman_in_legend():
    from scipy import stats

    df = coupling_df()
    (ax,) = _check(plots.coupling_vs_henrici(df, "zoo-8 / final"), 1, "zoo-8 / final")
    rho = stats.spearmanr(df["henrici"], df["effect_log_median_ratio"]).statistic
    texts = _legend_texts(ax)
    assert any(f"Spearman ρ = {rho:.2g}" in t for t in texts), texts
    scat = [ln for ln in ax.get_lines() if "Spearman" in ln.get_label()][0]
    _eq(scat.get_xdata(), df["henrici"])
    _eq(scat.get_ydata(), df["effect_log_median_ratio"])
    # too few pairs: ρ is NaN, no crash; per-checkpoint groups each get a ρ
    (ax,) = _check(plots.coupling_vs_henrici(df.head(2), "t"), 1)
    assert any("ρ = nan" in t for t in _legend_texts(ax))
    two = pd.concat([df.assign(ckpt="step0"), df.assign(ckpt="final")], ignore_index=True)
    (ax,) = _check(plots.coupling_vs_henrici(two, "t"), 1)
    texts = _legend_texts(ax)
    assert any(t.startswith("step0: Spearman") for t in texts) and any(t.startswith("all: Spearman") for t in texts)
    with pytest.raises(ValueError, match="henrici"):
        plots.coupling_vs_henrici(df.drop(columns="henrici"), "t")


def test_significant_counts_bars():
    df = counts_df()
    (ax,) = _check(plots.significant_counts(df, "study A"), 1, "study A")
    heights = [p.get_height() for p in ax.patches]
    # bars are drawn checkpoint by checkpoint (step0 of a, b; mid of a, b; ...)
    assert heights == [0, 1, 3, 2, 5, 4]
    assert _legend_texts(ax) == ["step0", "mid", "final"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]
    assert ax.get_ylabel() == "FDR-significant layers (count)"
    assert ax.texts[0].get_text() == "0/8"  # count of layers / layers
    _check(plots.significant_counts(df.head(1).assign(n_significant_layers=np.nan), "t"), 1)
    # a table without the layer count (only n_significant per boundary) falls back, and says "tests"
    (ax,) = _check(
        plots.significant_counts(
            df.drop(columns=["n_significant_layers", "n_layers"]).rename(
                columns={"n_significant_boundaries": "n_significant"}
            ),
            "t",
        ),
        1,
    )
    assert [p.get_height() for p in ax.patches] == [0, 2, 4, 2, 9, 7] and ax.get_ylabel().endswith("tests (count)")
    with pytest.raises(ValueError, match="n_significant_layers"):
        plots.significant_counts(df.drop(columns="n_significant_layers"), "t")


def test_partition_similarity_plot_draws_each_pair_once():
    df = similarity_df()
    ax_n, ax_a, ax_m = _check(plots.partition_similarity_plot(df, "zoo-8"), 3, "zoo-8")
    # self-comparisons (1 by definition) are left out; "final vs step0" is "step0 vs final"
    assert [ln.get_label() for ln in ax_n.get_lines()] == ["step0 vs final", "mid vs final", "mid vs step0"]
    want = df[(df.ckpt == "mid") & (df.reference_ckpt == "step0")]
    _eq(_line(ax_n, "mid vs step0").get_ydata(), want["nmi"])
    _eq(_line(ax_a, "mid vs step0").get_xdata(), 2 * want["layer"] + (want["boundary"] == "pre_mlp"))
    # modularity: one line per checkpoint, one point per boundary
    assert [ln.get_label() for ln in ax_m.get_lines()] == ["step0", "mid", "final"]
    _eq(_line(ax_m, "final").get_ydata(), df[(df.ckpt == "final") & (df.reference == "final")]["modularity"])
    one = plots.partition_similarity_plot(similarity_df(("final",)), "t")
    assert "nothing to compare" in one.get_axes()[0].texts[0].get_text()
    _render(one)
    with pytest.raises(ValueError, match="nmi"):
        plots.partition_similarity_plot(df.drop(columns="nmi"), "t")


def test_lens_curves():
    df = lens_df()
    axes = _check(plots.lens_curves(df, curves_df(), "zoo-8 / final"), 6, "zoo-8 / final")
    for ax, col in zip(axes, ["kl", "ce", "hit1", "hit5"]):
        _eq(_line(ax, "tuned lens").get_ydata(), df.loc[df["lens"] == "tuned", col])
        _eq(_line(ax, "logit lens").get_ydata(), df.loc[df["lens"] == "logit", col])
        assert _line(ax, "logit lens").get_linestyle() == "--"
    with pytest.raises(ValueError, match="hit5"):
        plots.lens_curves(df.drop(columns="hit5"), None, "t")
    # held-out KL per layer and the layer mean of both splits against tokens seen
    curves = curves_df()
    held = curves[curves.split == "heldout"]
    for L in range(4):
        line = _line(axes[4], f"L = {L}")
        _eq(line.get_xdata(), held[held.layer == L]["tokens_seen"])
        _eq(line.get_ydata(), held[held.layer == L]["kl"])
    _eq(_line(axes[5], "heldout").get_xdata(), [0, 640, 1280])
    _eq(_line(axes[5], "heldout").get_ydata(), [2.5, 1.25, 2.5 / 3])
    _eq(_line(axes[5], "train").get_ydata(), [2.5, 5 / 3])
    imported = plots.lens_curves(df, None, "t").get_axes()
    assert "imported lens" in imported[4].texts[0].get_text() and not imported[4].get_lines()
    with pytest.raises(ValueError, match="tokens_seen"):
        plots.lens_curves(df, curves.drop(columns="tokens_seen"), "t")


def test_rss_profile_with_phases():
    df = rss_df()
    (ax,) = _check(plots.rss_profile_plot(df, PHASES, "qwen-1.5b"), 1, "qwen-1.5b")
    line = _line(ax, "k = 4 (25% of d) (phase cut)")
    _eq(line.get_ydata(), df.loc[df["k"] == 4, "rss"])
    assert line.get_linewidth() > _line(ax, "k = 2 (12% of d)").get_linewidth()
    spans = [p for p in ax.patches if p.get_label().startswith("phase")]
    assert [p.get_label() for p in spans] == ["phase 1 (rise)", "phase 2 (plateau)", "phase 3 (descent)"]
    extents = [(p.get_x(), p.get_x() + p.get_width()) for p in spans]
    np.testing.assert_allclose(extents, [(-0.5, 2.5), (2.5, 6.5), (6.5, 8.5)])
    for key in ("b1", "b2", "peak"):
        v = _line(ax, f"{key} = {PHASES[key]}")
        _eq(v.get_xdata(), [PHASES[key]] * 2)
    # no phases, or a fallback without cut points: just the lines
    (ax,) = _check(plots.rss_profile_plot(df, None, "t"), 1)
    assert not ax.patches
    fig = plots.rss_profile_plot(df, {"b1": None, "b2": None, "peak": 3, "reason": "no knee"}, "t")
    (ax,) = _check(fig, 1)
    assert not ax.patches and "no knee" in fig.get_supxlabel()
    # k_fraction only
    _check(plots.rss_profile_plot(df.drop(columns="k"), PHASES, "t"), 1)


def test_resolution_frontier():
    df = resolution_df()
    (ax,) = _check(plots.resolution_frontier(df, "qwen-1.5b"), 1, "qwen-1.5b")
    allp = _line(ax, "k in the sweep")
    _eq(allp.get_xdata(), df["energy"])
    _eq(allp.get_ydata(), df["visibility"])
    front = _line(ax, "Pareto front")
    _eq(front.get_xdata(), [0.2, 0.5, 0.9])
    _eq(front.get_ydata(), [0.9, 0.6, 0.1])
    assert [t.get_text() for t in ax.texts] == ["k=1 (5%)", "k=2 (10%)", "k=8 (50%)", "k=1 (8%)"]
    # pareto computed when absent
    (ax,) = _check(plots.resolution_frontier(df.drop(columns="pareto"), "t"), 1)
    _eq(_line(ax, "Pareto front").get_xdata(), [0.2, 0.5, 0.9])


def test_phase_metric_profiles():
    df = geometry_df()
    metrics = ["hidden_erank", "update_orthogonality", "norm_ratio"]
    axes = _check(plots.phase_metric_profiles(df, PHASES, metrics, "qwen-1.5b"), 3, "qwen-1.5b")
    for ax, m in zip(axes, metrics):
        data = [ln for ln in ax.get_lines() if ln.get_marker() == "o"][0]
        _eq(data.get_xdata(), df["layer"])
        _eq(data.get_ydata(), df[m])
        assert len([p for p in ax.patches]) == 3
    # phase 3 runs to the last row
    last = axes[0].patches[-1]
    assert last.get_x() + last.get_width() == pytest.approx(df["layer"].max() + 0.5)
    assert _check(plots.phase_metric_profiles(df, None, None, "t"), 4)
    with pytest.raises(ValueError, match="nope"):
        plots.phase_metric_profiles(df, PHASES, ["nope"], "t")


def test_phase_width_scaling_fits_and_too_few_depths():
    w = widths_df()
    (ax,) = _check(plots.phase_width_scaling(w, fits_df(), "zoo family"), 1, "zoo family")
    texts = _legend_texts(ax)
    assert any("phase 2 (plateau): slope 0.5 [0.4, 0.6]" in t for t in texts), texts
    pts = _line(ax, [t for t in texts if t.startswith("phase 2")][0])
    _eq(pts.get_xdata(), w.loc[w["phase"] == 2, "n_layers"])
    _eq(pts.get_ydata(), w.loc[w["phase"] == 2, "width"])
    fitted = [ln for ln in ax.get_lines() if ln.get_label().startswith("_") and len(ln.get_xdata()) == 2]
    assert len(fitted) == 3
    np.testing.assert_allclose(fitted[1].get_ydata(), -2.0 + 0.5 * np.array([8, 16]))
    # too few depths: points only
    (ax,) = _check(plots.phase_width_scaling(w[w["model"] != "m16"], fits_df("too_few_depths"), "t"), 1)
    assert all(ln.get_linestyle() == "None" for ln in ax.get_lines())
    assert any("too_few_depths" in t for t in _legend_texts(ax))
    _check(plots.phase_width_scaling(w, None, "t"), 1)


# one row and NaN: every function draws without crashing ------------------------------------


def bridge_df(n: int = 5) -> pd.DataFrame:
    L = np.arange(n)
    return pd.DataFrame(
        {
            "layer": L,
            "rss": 0.9 - 0.05 * L,
            "transport": 0.6 + 0.02 * L,
            "random_mean": 0.25 + 0 * L,
            "random_sd": 0.05 + 0 * L,
            "chance": 0.25 + 0 * L,
            "complex_frac_attn": 0.1 * L,
            "complex_frac_mlp": 0.05 * L,
            "henrici_attn": 0.3 + 0.01 * L,
            "henrici_mlp": 0.4 + 0 * L,
            "cum_erank": 30.0 - 2 * L,
        }
    )


def causal_df(n: int = 4) -> pd.DataFrame:
    rows = [
        {
            "layer": L,
            "intervention": iv,
            "kl": 0.5 + L,
            "flip_rate": 0.1 * L,
            "random_kl_mean": 0.2 + 0.1 * L,
            "random_kl_sd": 0.05,
            "random_flip_mean": 0.02 * L,
        }
        for iv in ("project", "patch")
        for L in range(n)
    ]
    return pd.DataFrame(rows)


def bootstrap_df(n: int = 4) -> pd.DataFrame:
    rows = [
        {
            "metric": m,
            "s": s,
            "estimate": 0.5 + 0.1 * s,
            "ci_low": 0.4 + 0.1 * s,
            "ci_high": 0.6 + 0.1 * s,
            "level": 0.95,
        }
        for m in ("henrici", "complex_frac")
        for s in range(n)
    ]
    rows.append(
        {"metric": "cum_erank_final", "s": np.nan, "estimate": 3.0, "ci_low": 2.5, "ci_high": 3.5, "level": 0.95}
    )
    return pd.DataFrame(rows)


def boot_trajectory_df(n: int = 3) -> pd.DataFrame:
    """Whole-model bootstrap rows of n checkpoints of two models, as render.trajectory_table gives them."""
    return pd.DataFrame(
        [
            {
                "model": m,
                "ckpt": f"step{10 * i}",
                "ckpt_index": i,
                "step": 10.0 * i,
                "metric": "cum",
                "layer": np.nan,
                "estimate": 3.0 + i,
                "ci_low": 2.5 + i,
                "ci_high": 3.5 + i,
                "bootstrapped": True,
            }
            for m in ("a", "b")
            for i in range(n)
        ]
    )


def phase_trajectory_df(n: int = 3) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "model": "a",
                "ckpt": f"step{10 * i}",
                "ckpt_index": i,
                "step": 10.0 * i,
                "phase": ph,
                "phase_name": name,
                "metric": "hidden_erank",
                "mean": 2.0 + i,
                "sd": 0.5,
            }
            for i in range(n)
            for ph, name in ((1, "rise"), (2, "plateau"))
        ]
    )


def _one_row_cases():
    return {
        "study_a_trajectory": lambda: plots.study_a_trajectory(boot_trajectory_df(1).head(1), title="m"),
        "study_b_trajectory": lambda: plots.study_b_trajectory(phase_trajectory_df(1).head(1), title="m"),
        "training_curve": lambda: plots.training_curve(training_df(1), "m"),
        "eigenvalue_grid": lambda: plots.eigenvalue_grid({"L000_mlp": {"eigenvalues": np.array([0.5 + 0j])}}, "m"),
        "operator_profile": lambda: plots.operator_profile(spectra_df(1).head(1), "m"),
        "funnel": lambda: plots.funnel(bottleneck_df(1), "m"),
        "schur_curves": lambda: plots.schur_curves(schur_df((1.0,), 1), "m"),
        "checkpoint_comparison": lambda: plots.checkpoint_comparison(ckpt_df(("step0",)).head(1), ["henrici"], "m"),
        "community_sizes": lambda: plots.community_sizes(summary_df().head(1), "m"),
        "coupling_profile": lambda: plots.coupling_profile(coupling_df().head(1), "m"),
        "coupling_vs_henrici": lambda: plots.coupling_vs_henrici(coupling_df().head(1), "m"),
        "significant_counts": lambda: plots.significant_counts(counts_df().head(1), "m"),
        "partition_similarity_plot": lambda: plots.partition_similarity_plot(similarity_df().head(2), "m"),
        "lens_curves": lambda: plots.lens_curves(lens_df().head(1), curves_df().head(1), "m"),
        "rss_profile_plot": lambda: plots.rss_profile_plot(rss_df().head(1), {"b1": 0, "b2": 0, "peak": 0}, "m"),
        "resolution_frontier": lambda: plots.resolution_frontier(resolution_df().head(1), "m"),
        "phase_metric_profiles": lambda: plots.phase_metric_profiles(
            geometry_df().head(1), PHASES, ["hidden_erank"], "m"
        ),
        "phase_width_scaling": lambda: plots.phase_width_scaling(widths_df().head(1), fits_df().head(1), "m"),
        "bridge_profiles": lambda: plots.bridge_profiles(bridge_df(1), {"b1": 0, "b2": 0, "peak": 0}, "m"),
        "causal_effects": lambda: plots.causal_effects(causal_df(1), "m"),
        "uncertainty_bands": lambda: plots.uncertainty_bands(bootstrap_df(1), "m"),
    }


def _nan(df: pd.DataFrame, keep: tuple[str, ...] = ()) -> pd.DataFrame:
    """Every other numeric value NaN (the columns in ``keep`` intact)."""
    out = df.copy()
    for c in out.columns:
        if c not in keep and pd.api.types.is_numeric_dtype(out[c]) and not pd.api.types.is_bool_dtype(out[c]):
            out[c] = out[c].astype(float)
            out.loc[out.index[::2], c] = np.nan
    return out


def _nan_cases():
    all_nan_eig = spectra_arrays(2)
    all_nan_eig["L000_attn"]["eigenvalues"] = np.full(4, np.nan, dtype=complex)
    return {
        "training_curve": lambda: plots.training_curve(_nan(training_df()), "m"),
        "eigenvalue_grid": lambda: plots.eigenvalue_grid(all_nan_eig, "m"),
        "operator_profile": lambda: plots.operator_profile(_nan(spectra_df()), "m"),
        "funnel": lambda: plots.funnel(_nan(bottleneck_df()), "m"),
        "schur_curves": lambda: plots.schur_curves(_nan(schur_df(), keep=("alpha",)), "m"),
        "checkpoint_comparison": lambda: plots.checkpoint_comparison(_nan(ckpt_df()), ["henrici", "cum_erank"], "m"),
        "community_sizes": lambda: plots.community_sizes(_nan(summary_df()), "m"),
        "coupling_profile": lambda: plots.coupling_profile(_nan(coupling_df()), "m"),
        "coupling_vs_henrici": lambda: plots.coupling_vs_henrici(_nan(coupling_df()), "m"),
        "significant_counts": lambda: plots.significant_counts(_nan(counts_df()), "m"),
        "partition_similarity_plot": lambda: plots.partition_similarity_plot(_nan(similarity_df()), "m"),
        "lens_curves": lambda: plots.lens_curves(_nan(lens_df()), _nan(curves_df()), "m"),
        "rss_profile_plot": lambda: plots.rss_profile_plot(_nan(rss_df(), keep=("k",)), PHASES, "m"),
        "resolution_frontier": lambda: plots.resolution_frontier(_nan(resolution_df()), "m"),
        "phase_metric_profiles": lambda: plots.phase_metric_profiles(
            _nan(geometry_df()), {"b1": np.nan, "b2": 3, "peak": None, "reason": "x"}, ["norm_ratio"], "m"
        ),
        "phase_width_scaling": lambda: plots.phase_width_scaling(widths_df(), _nan(fits_df()), "m"),
        "bridge_profiles": lambda: plots.bridge_profiles(_nan(bridge_df()), PHASES, "m"),
        "causal_effects": lambda: plots.causal_effects(_nan(causal_df()), "m"),
        "uncertainty_bands": lambda: plots.uncertainty_bands(_nan(bootstrap_df(), keep=("s",)), "m"),
        "study_a_trajectory": lambda: plots.study_a_trajectory(_nan(boot_trajectory_df(), keep=("layer",)), title="m"),
        "study_b_trajectory": lambda: plots.study_b_trajectory(_nan(phase_trajectory_df(), keep=("phase",)), title="m"),
    }


@pytest.mark.parametrize("name", sorted(_one_row_cases()))
def test_one_row_inputs(name):
    fig = _one_row_cases()[name]()
    assert isinstance(fig, Figure) and fig.get_axes()
    assert all(ax.get_xlabel() for ax in fig.get_axes() if ax.get_subplotspec().is_last_row())
    _render(fig)


@pytest.mark.parametrize("name", sorted(_nan_cases()))
def test_nan_inputs(name):
    fig = _nan_cases()[name]()
    assert isinstance(fig, Figure) and fig.get_axes()
    _render(fig)


def test_every_figure_function_is_covered():
    public = {f.function for f in catalogue.FIGURES}
    assert public == set(_one_row_cases()) == set(_nan_cases())


def test_empty_tables_give_a_figure_and_bad_types_a_message():
    fig = plots.lens_curves(pd.DataFrame(columns=["lens", "layer"]), None, "m")
    assert "no data" in fig.get_axes()[0].texts[0].get_text()
    _render(fig)
    with pytest.raises(ValueError, match="DataFrame"):
        plots.funnel({"s": [0]}, "m")


def test_rcparams_of_the_caller_are_untouched():
    before = dict(mpl.rcParams)
    plots.funnel(bottleneck_df(), "m")
    assert dict(mpl.rcParams) == before


# ------------------------------------------------------------------------------- save_figure


def _pdf_literal(raw: bytes, key: bytes) -> str:
    """The PDF literal string after ``/key`` (balanced parentheses, backslash escapes)."""
    i = raw.index(b"/" + key)
    i = raw.index(b"(", i) + 1
    out, depth = bytearray(), 1
    esc = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("b"): b"\b", ord("f"): b"\f"}
    while True:
        c = raw[i]
        if c == ord("\\"):
            nxt = raw[i + 1]
            if nxt in esc:
                out += esc[nxt]
                i += 2
            elif ord("0") <= nxt <= ord("7"):
                j = i + 1
                while j < i + 4 and ord("0") <= raw[j] <= ord("7"):
                    j += 1
                out.append(int(raw[i + 1 : j], 8))
                i = j
            else:
                out.append(nxt)
                i += 2
            continue
        if c == ord("("):
            depth += 1
        elif c == ord(")"):
            depth -= 1
            if depth == 0:
                return out.decode("latin-1")
        out.append(c)
        i += 1


PROV = {
    "rule": "figure_funnel",
    "wildcards": {"model": "zoo-8", "ckpt": "final"},
    "params": {"dpi": 120, "note": "a (nested) \\ path λ"},
    "inputs": {"results/x.tsv": "ab" * 32},
    "git": {"commit": None, "dirty": True},
    "n": np.int64(3),
    "x": np.float32(0.5),
    "bad": float("nan"),
    "end": None,
}
PROV_JSON = json.loads(json.dumps({**PROV, "n": 3, "x": 0.5, "bad": None}))


def test_save_figure_writes_png_and_pdf_with_provenance(tmp_path):
    fig = plots.funnel(bottleneck_df(), "zoo-8 / final")
    png, pdf = tmp_path / "figs" / "funnel.png", tmp_path / "figs" / "funnel.pdf"
    plots.save_figure(fig, png, pdf, PROV, dpi=60)
    assert sorted(p.name for p in png.parent.iterdir()) == ["funnel.pdf", "funnel.png"]  # no temp files
    with Image.open(png) as im:
        assert im.format == "PNG"
        assert json.loads(im.text[plots.PROVENANCE_KEY]) == PROV_JSON
    assert sidecars.read(png) == PROV_JSON  # no sidecar: read from the PNG
    # the sidecar a rule writes with resdyn.io holds the same record
    from resdyn import io as rio

    rio.write_json(PROV, rio.prov_path(png), nan_as_null=("bad",))  # io refuses NaN unless declared
    assert sidecars.read(png) == PROV_JSON
    rio.prov_path(png).unlink()
    raw = pdf.read_bytes()
    assert raw.startswith(b"%PDF")
    assert json.loads(_pdf_literal(raw, b"Subject")) == PROV_JSON
    assert _pdf_literal(raw, b"Keywords") == "resdyn; figure_funnel; zoo-8; final"
    assert _pdf_literal(raw, b"Title") == "zoo-8 / final"
    assert b"/CreationDate" not in raw


def _embedded_truetype_fonts(raw: bytes) -> list:
    """The TrueType programs (``/FontFile2`` streams, Flate-decoded) a PDF embeds, as fontTools fonts."""
    from fontTools.ttLib import TTFont

    fonts = []
    for ref in sorted(set(re.findall(rb"/FontFile2 (\d+) 0 R", raw))):
        body = re.search(rb"(?<!\d)" + ref + rb" 0 obj\s*<<.*?>>\s*stream\r?\n(.*?)endstream", raw, re.DOTALL)
        fonts.append(TTFont(_io.BytesIO(zlib.decompressobj().decompress(body.group(1)))))
    return fonts


def test_pdf_fonts_are_truetype_subsets_without_layout_tables(tmp_path):
    """save_figure's PDF embeds the same glyph outlines as matplotlib's own PDF, without the
    OpenType layout tables (GSUB/GPOS/GDEF/kern) no PDF viewer reads; fontTools' defaults are restored."""
    from fontTools import subset

    default = list(subset.Options._drop_tables_default)
    fig = plots.funnel(bottleneck_df(), "zoo-8 / final")
    plots.save_figure(fig, tmp_path / "f.png", tmp_path / "f.pdf", PROV, dpi=60)
    assert subset.Options._drop_tables_default == default
    ours = _embedded_truetype_fonts((tmp_path / "f.pdf").read_bytes())
    with mpl.rc_context(plots.RC):
        fig.savefig(tmp_path / "plain.pdf", format="pdf")  # matplotlib alone: the oracle
    plain = _embedded_truetype_fonts((tmp_path / "plain.pdf").read_bytes())
    assert len(ours) == len(plain) >= 1
    assert any(t in f for f in plain for t in plots.PDF_UNUSED_FONT_TABLES)  # the check sees the tables
    for mine, theirs in zip(ours, plain):
        assert not [t for t in plots.PDF_UNUSED_FONT_TABLES if t in mine]
        assert {"glyf", "loca", "head", "hhea", "hmtx", "maxp"} <= set(mine.keys())
        # the same glyphs but those GSUB alone reaches (ligatures the text does not use)
        assert set(mine.getGlyphOrder()) <= set(theirs.getGlyphOrder()) and len(mine.getGlyphOrder()) > 5
        for name in mine.getGlyphOrder():
            a, b = mine["glyf"][name], theirs["glyf"][name]
            assert a.compile(mine["glyf"]) == b.compile(theirs["glyf"]), name
            assert mine["hmtx"][name] == theirs["hmtx"][name], name
    names = [f["name"].getDebugName(6) for f in ours]  # PostScript names, e.g. DejaVuSans, DejaVuSans-Oblique
    cmap = ours[names.index("DejaVuSans")].getBestCmap()
    assert {ord(c) for c in "zoo-8 / final" if c != " "} <= set(cmap)  # the title's characters


def test_save_figure_failure_leaves_nothing(tmp_path, monkeypatch):
    fig = plots.funnel(bottleneck_df(), "t")
    real = fig.savefig

    def failing(fname, *args, **kwargs):
        if kwargs.get("format") == "pdf":
            raise RuntimeError("disk full")
        return real(fname, *args, **kwargs)

    monkeypatch.setattr(fig, "savefig", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        plots.save_figure(fig, tmp_path / "f.png", tmp_path / "f.pdf", PROV, dpi=40)
    assert list(tmp_path.iterdir()) == []
    # earlier outputs stay as they were
    (tmp_path / "f.png").write_bytes(b"old")
    with pytest.raises(RuntimeError):
        plots.save_figure(fig, tmp_path / "f.png", tmp_path / "f.pdf", PROV, dpi=40)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.png"]
    assert (tmp_path / "f.png").read_bytes() == b"old"


def test_save_figure_closes_pyplot_figures(tmp_path):
    import matplotlib.pyplot as plt

    fig = plt.figure()
    fig.add_subplot().plot([0, 1])
    num = fig.number
    plots.save_figure(fig, tmp_path / "p.png", tmp_path / "p.pdf", {"rule": "r"}, dpi=30)
    assert not plt.fignum_exists(num)
    with pytest.raises(ValueError, match="provenance"):
        plots.save_figure(Figure(), tmp_path / "q.png", tmp_path / "q.pdf", ["not", "a", "dict"])


# ------------------------------------------------------------------------------- import hygiene


def test_numerical_modules_do_not_import_matplotlib():
    code = (
        "import sys\n"
        "import resdyn.study_a.spectral, resdyn.study_b.readout, resdyn.study_b.phases, resdyn.study_a.schur, "
        "resdyn.study_b.geometry\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'seaborn'))\n"
        "print(bad[:5]); sys.exit(1 if bad else 0)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_style_constants_are_seaborns_and_plots_import_neither_seaborn_nor_scipy():
    import seaborn as sns

    np.testing.assert_allclose(np.array(plots.PALETTE), np.array(sns.color_palette("colorblind")), atol=1e-12)
    want = {**sns.axes_style("whitegrid"), **sns.plotting_context("paper")}
    want.pop("image.cmap")  # seaborn's own colormap; no figure draws an image
    got = {**plots._SEABORN_WHITEGRID, **plots._SEABORN_PAPER}
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == (pytest.approx(value) if isinstance(value, float) else value), key
    code = (
        "import sys, resdyn.plots; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('seaborn', 'scipy', 'torch')); "
        "print(bad[:5]); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


# ------------------------------------------------------------------ catalogue and render cache

FIGURE_MODULES = (bridge, study_a_spectra, study_a_topology, study_b, trajectory, zoo)


def test_catalogue_names_existing_functions_and_every_figure_module():
    for spec in catalogue.FIGURES:
        fn = render.plot_function(spec.plot)
        assert callable(fn) and fn.__module__ == spec.module, spec.name
    assert {f.module for f in catalogue.FIGURES} == {m.__name__ for m in FIGURE_MODULES}
    # the figure script imports every figure module statically: its rule's code version covers them
    from resdyn.provenance import codeversion

    closure = codeversion.import_closure(Path(__file__).parent.parent / "workflow" / "scripts" / "figure.py")
    assert {f.module for f in catalogue.FIGURES} | {catalogue.RENDER_MODULE} <= closure
    with pytest.raises(ValueError, match="unknown figure 'nope'; known: training"):
        catalogue.by_name("nope")


def test_catalogue_paths_and_study_filter():
    spec = catalogue.by_name("rss")
    assert catalogue.output_path(spec, model="m", ckpt="c") == "results/figures/m/c/rss.png"
    assert catalogue.output_path(spec, "pdf") == "results/figures/{model}/{ckpt}/rss.pdf"
    assert catalogue.input_paths(spec, model="m", ckpt="c") == ["results/m/c/rss.tsv", "results/m/c/phases.json"]
    assert catalogue.output_path(catalogue.by_name("phase_widths")) == "results/figures/scaling/phase_widths.png"
    only_b = {"studies": ["B"]}
    assert [f.name for f in catalogue.of_scope("lens", only_b)] == [
        "lens",
        "rss",
        "resolution",
        "phase_metrics",
        "causal",
    ]
    assert catalogue.of_scope("ckpt", only_b) == ()


def _copy_package(tmp_path: Path) -> Path:
    import shutil

    pkg = tmp_path / "resdyn"
    shutil.copytree(Path(catalogue.__file__).parent.parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return pkg


def _versions(pkg: Path) -> dict[str, str]:
    return {f.name: catalogue.figure_code_version(f.name, pkg) for f in catalogue.FIGURES}


def _append_to_function(path: Path, function: str, line: str) -> None:
    import ast

    text = path.read_text().splitlines(keepends=True)
    node = next(n for n in ast.parse("".join(text)).body if isinstance(n, ast.FunctionDef) and n.name == function)
    text.insert(node.end_lineno, f"    {line}\n")
    path.write_text("".join(text))


def test_editing_one_plot_function_changes_only_that_figures_code_version(tmp_path):
    """The render cache's code key re-renders exactly the figures whose code an edit reaches.

    An edit of funnel() re-renders the funnel only; an edit of a helper of a figure module
    re-renders that module's figures; one of the shared helpers, all.
    """
    pkg = _copy_package(tmp_path)
    before = _versions(pkg)
    assert len(set(before.values())) == len(before)  # one version per figure
    plots_dir = pkg / "plots"
    _append_to_function(plots_dir / "study_a_spectra.py", "funnel", "x = 1  # unreachable, but code")
    after = _versions(pkg)
    assert {n for n in before if before[n] != after[n]} == {"funnel"}
    # comments and blank lines of the figure's own module do not count
    (plots_dir / "study_b.py").write_text((plots_dir / "study_b.py").read_text() + "\n# a comment\n")
    assert _versions(pkg) == after
    # a module-level helper of study_b: every study_b figure, nothing else
    (plots_dir / "study_b.py").write_text(
        (plots_dir / "study_b.py")
        .read_text()
        .replace('_LENS_STYLE = {"tuned": (PALETTE[0], "-", "o")', '_LENS_STYLE = {"tuned": (PALETTE[5], "-", "o")')
    )
    edited = _versions(pkg)
    assert {n for n in after if after[n] != edited[n]} == {
        f.name for f in catalogue.FIGURES if f.module == "resdyn.plots.study_b"
    }
    # the shared helpers, the render module and what they import: every figure
    for rel in ("plots/common.py", "plots/render.py", "io.py"):
        (pkg / rel).write_text((pkg / rel).read_text() + "\n# edited\n")
        now = _versions(pkg)
        assert all(now[n] != edited[n] for n in now), rel
        edited = now


def _figure_job(work: Path, cache: Path, code: dict[str, str] | None = None) -> dict[str, bool]:
    """What a figure job does (workflow/scripts/figure.py): render funnel and schur.

    The outputs are deleted first, as Snakemake does. Returns figure -> drawn (False: restored).
    """
    drawn = {}
    for name in ("funnel", "schur"):
        spec = catalogue.by_name(name)
        png, pdf = work / f"{name}.png", work / f"{name}.pdf"
        for out in (png, pdf):
            out.unlink(missing_ok=True)
        inputs = {str(work / Path(p).name): sidecars.hash_path(work / Path(p).name) for p in spec.inputs}
        version = (code or {}).get(name) or catalogue.figure_code_version(name)
        drawn[name] = render.render(
            name,
            spec.plot,
            inputs,
            str(png),
            str(pdf),
            f"m · {name}",
            spec.caption,
            60,
            version,
            {"rule": "figure_ckpt", "start": repr(np.random.rand())},
            cache,
        )
    return drawn


def test_figure_job_redraws_exactly_the_figures_whose_input_or_code_changed(tmp_path):
    from resdyn import io as rio

    work, cache = tmp_path / "results" / "figures", tmp_path / "results" / "figures" / ".cache"
    work.mkdir(parents=True)
    rio.write_tsv(bottleneck_df(), work / "bottleneck.tsv")
    rio.write_tsv(schur_df(), work / "schur.tsv")
    assert _figure_job(work, cache) == {"funnel": True, "schur": True}
    first = {p.name: p.read_bytes() for p in work.glob("*.p*")}
    assert len(first) == 4 and all(sidecars.read(work / f"{n}.png")["figure"] == n for n in ("funnel", "schur"))
    # nothing changed: both restored byte for byte (the provenance's start time would differ if drawn)
    assert _figure_job(work, cache) == {"funnel": False, "schur": False}
    assert {p.name: p.read_bytes() for p in work.glob("*.p*")} == first
    # one input table changed: only its figure is drawn again
    rio.write_tsv(schur_df(alphas=(0.0, 1.0)), work / "schur.tsv")
    assert _figure_job(work, cache) == {"funnel": False, "schur": True}
    second = {p.name: p.read_bytes() for p in work.glob("*.p*")}
    assert second["funnel.png"] == first["funnel.png"] and second["funnel.pdf"] == first["funnel.pdf"]
    assert second["schur.png"] != first["schur.png"]
    # one figure's code changed: only it is drawn; the cache keeps one entry per file
    assert _figure_job(work, cache, {"funnel": "0" * 16}) == {"funnel": True, "schur": False}
    assert (work / "schur.png").read_bytes() == second["schur.png"]
    assert sorted(p.name.split(".")[0] for p in cache.rglob("*.p[nd][gf]")) == ["funnel", "funnel", "schur", "schur"]
    assert [p.parent for p in cache.rglob("*.png")] == [cache] * 2  # entries mirror the folders under results/figures
    # a cache entry changed after it was stored is not restored: the figure is drawn again
    entry = next(cache.glob("schur.*.png"))
    entry.write_bytes(entry.read_bytes() + b"tampered")
    assert _figure_job(work, cache, {"funnel": "0" * 16}) == {"funnel": False, "schur": True}
    assert not (work / "schur.png").read_bytes().endswith(b"tampered")


def test_select_metrics_defaults_names_and_errors():
    from resdyn.plots.common import select_metrics

    df = pd.DataFrame({"a": [1.0], "c": [2.0]})
    assert select_metrics(df, None, ("a", None, "b", "c"), "t") == ["a", "c"]  # present defaults, in order
    assert select_metrics(df, "b", ("a",), "t") == ["b"]  # an explicit name is taken as given
    assert select_metrics(df, ("c", "a"), ("a",), "t") == ["c", "a"]
    with pytest.raises(ValueError, match="at least one column"):
        select_metrics(df, [], ("a",), "t")
    with pytest.raises(
        ValueError, match=r"geometry table has none of the default metrics \['x', 'y'\]; it has \['a', 'c'\]"
    ):
        select_metrics(df, None, ("x", "y"), "geometry table")
    with pytest.raises(ValueError, match=r"none of the default metrics \['shown'\]"):
        select_metrics(df, None, ("x",), "t", listed=("shown",))
