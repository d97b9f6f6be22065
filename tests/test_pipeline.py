"""Integration: the smoke preset end to end with Snakemake, then incremental rebuilds and audits.

One full run of configs/smoke.yaml in a temporary copy of the workflow (session fixture); the
other tests read it. Incremental behaviour is checked with dry runs against the finished run:
a config change must schedule exactly the jobs that depend on it.
"""

from __future__ import annotations

import math
import modulefinder
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
import yaml

from resdyn import io
from resdyn.provenance import sidecars

from helpers import codecache

ROOT = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
RESDYN = str(Path(sys.executable).parent / "resdyn")
IGNORE = shutil.ignore_patterns(
    ".venv",
    ".git",
    "results",
    "models",
    "logs",
    ".snakemake",
    "report.html",
    "__pycache__",
    ".pytest_cache",
    "out",
    "*.egg-info",
)

pytestmark = pytest.mark.slow


def copy_workflow(dest: Path, code_cache: Path | None = None) -> Path:
    """A copy of the workflow (``code_cache``: the seed of its rules' code versions, carried over:
    tests/helpers/codecache.py)."""
    shutil.copytree(ROOT, dest, ignore=IGNORE)
    return dest if code_cache is None else codecache.carry(ROOT, dest, code_cache)


def env_for(work: Path) -> dict:
    # The copy's own resdyn must be imported (the venv's editable install points at ROOT).
    return {**os.environ, "PYTHONPATH": str(work), "HF_HUB_OFFLINE": "1"}


def snakemake(work: Path, *args: str, config: str = "configs/smoke.yaml", check: bool = True):
    proc = subprocess.run(
        [SNAKEMAKE, "--configfile", config, *args], cwd=work, env=env_for(work), capture_output=True, text=True
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def planned_jobs(work: Path, config: str = "configs/smoke.yaml") -> dict[str, int]:
    """Rule -> number of jobs a dry run would execute."""
    out = snakemake(work, "-n", config=config).stdout
    if "Nothing to be done" in out:
        return {}
    stats = out.split("Job stats:", 1)[1]
    jobs = {}
    for line in stats.splitlines():
        m = re.fullmatch(r"\s*([A-Za-z_][\w]*)\s+(\d+)\s*", line)
        if m and m[1] != "total":
            jobs[m[1]] = int(m[2])
        if line.strip().startswith("total"):
            break
    return jobs


@pytest.fixture(scope="session")
def smoke(tmp_path_factory, code_cache_seed) -> Path:
    work = copy_workflow(tmp_path_factory.mktemp("smoke") / "wf", code_cache_seed)
    snakemake(work, "--cores", "2")
    return work


def with_config(work: Path, name: str, change) -> str:
    cfg = yaml.safe_load((work / "configs" / "smoke.yaml").read_text())
    change(cfg)
    path = work / "configs" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return f"configs/{name}.yaml"


def test_outputs_follow_the_users_umask(smoke):
    """Every file and folder the run wrote under results/ and models/ has the modes a plain write
    gets under the umask the run started with (0644/0755 under 022), not mkstemp's private 0600."""
    mask = os.umask(0o022)
    os.umask(mask)
    wrong = []
    for top in ("results", "models"):
        for p in [smoke / top, *(smoke / top).rglob("*")]:
            if any(part.startswith(".") for part in p.relative_to(smoke).parts):
                continue  # a staging name or Snakemake's own
            want = (0o777 if p.is_dir() else 0o666) & ~mask
            if stat.S_IMODE(p.stat().st_mode) != want:
                wrong.append(f"{p.relative_to(smoke)}: {oct(stat.S_IMODE(p.stat().st_mode))}, want {oct(want)}")
    assert not wrong, "\n".join(wrong[:20])


def test_every_artifact_exists_and_parses(smoke):
    files = [p for p in (smoke / "results").rglob("*") if p.is_file() and not p.name.endswith(".prov.json")]
    assert files
    for p in files:
        if p.suffix == ".tsv":
            assert not io.read_tsv(p).empty, p
        elif p.suffix == ".json":
            io.read_json(p)
        elif p.suffix == ".h5":
            with h5py.File(p, "r") as f:
                assert len(f.keys()) > 0, p
        elif p.suffix == ".png":
            assert sidecars.read(p)["rule"].startswith("figure"), p
    for model in ("tiny_llama",):
        for rel in (
            "checkpoints.tsv",
            "step30/spectra.tsv",
            "step30/bottleneck.tsv",
            "step30/schur.tsv",
            "step30/coupling.tsv",
            "step0/coupling.tsv",
            "step30/lens_metrics.tsv",
            "step30/rss.tsv",
            "step30/resolution.tsv",
            "step30/phases.json",
            "step30/phase_metrics.tsv",
        ):
            assert (smoke / "results" / model / rel).is_file(), rel
    assert (smoke / "results" / "scaling" / "phase_widths.tsv").is_file()
    # study A's headline count is in layers (as the paper states it): every checkpoint, out of the model's 6 layers
    counts = io.read_tsv(smoke / "results" / "tiny_llama" / "coupling_counts.tsv")
    assert counts["ckpt"].tolist() == ["step0", "step30"] and set(counts["n_layers"]) == {6}
    assert (counts["n_significant_layers"] <= counts["n_layers_tested"]).all()
    for ckpt in ("step0", "step30"):
        layers = io.read_tsv(smoke / "results" / "tiny_llama" / ckpt / "coupling_layers.tsv")
        assert layers["layer"].tolist() == list(range(6))
        assert int(layers["significant"].sum()) == int(counts.set_index("ckpt").loc[ckpt, "n_significant_layers"])
    similarity = io.read_tsv(smoke / "results" / "tiny_llama" / "partition_similarity.tsv")
    assert len(similarity) == 2 * 6 * 2 * 2  # checkpoints × layers × boundaries × references
    itself = similarity[similarity["ckpt"] == similarity["reference_ckpt"]]
    assert (itself["nmi"] == 1).all() and (itself["ari"] == 1).all()
    assert (smoke / "results" / "figures" / "tiny_llama" / "partitions.png").is_file()
    widths = io.read_tsv(smoke / "results" / "scaling" / "phase_widths.tsv")
    assert set(widths["status"]) == {"too_few_depths"}  # one depth in the smoke preset


def test_paper_table_and_study_b_metrics(smoke):
    """The paper table names every stated figure, with a value or a reason; the update
    effective ranks, absolute norms, hit ratios and the middle regime's agreement are produced."""
    from resdyn import artifacts as A

    table = A.PaperComparison.read(smoke / "results" / "paper_comparison.tsv")
    assert set(table["claim"]) == set(A.ClaimsTable.load()["claim_id"])
    assert (table["run_value"].notna() | (table["reason"].fillna("") != "")).all()
    geo = A.LayerGeometry.read(smoke / "results" / "tiny_llama" / "step30" / "geometry.tsv")
    inner = geo[geo["state"] != "output"]
    assert (inner[["update_erank", "attn_update_erank", "mlp_update_erank", "update_norm"]] > 0).all().all()
    assert {"tuned_hit5_over_hit1", "logit_hit5_over_hit1"} <= set(geo.columns)
    regime = io.read_json(smoke / "results" / "tiny_llama" / "step30" / "phases.json")["regime"]
    assert regime["k"] and regime["max_shift"] == max(regime["b1_shift"], regime["b2_shift"]) >= 0


def read_every_artifact(run: Path) -> set[Path]:
    """Read every file under ``run/results`` that an artifact class declares through that class
    (the schemas hold for real outputs, not only for hand-made ones); returns the files read."""
    from resdyn import artifacts as A

    read: set[Path] = set()
    classes = [
        c
        for c in vars(A).values()
        if isinstance(c, type)
        and issubclass(c, A.Artifact)
        and c.relpath
        and c not in (A.Activations, A.JacobianBlocks)
    ]
    for cls in classes:
        for path in sorted(run.glob(re.sub(r"\{[a-z]+\}", "*", cls.relpath))):
            if cls is A.CommunityPartitions:
                cls.read_folder(path)
                read.update(path.glob("layer*.tsv"))
                continue
            if cls is A.Samples:
                cls.read(path.with_name("lens_tokens.h5"))
                read.add(path.with_name("lens_tokens.h5"))
            cls.read(path)
            read.add(path)
    for folder in sorted(run.glob(re.sub(r"\{[a-z]+\}", "*", A.Activations.relpath))):
        assert [layer for layer, _ in A.Activations.layers(folder)] == list(
            range(len(A.Activations.layer_files(folder)))
        )
        A.Activations.read_all_boundaries(folder)
        read.update(A.Activations.layer_files(folder))
    blocks = sorted(run.glob(re.sub(r"\{[a-z]+\}", "*", A.JacobianBlocks.relpath)))
    for jacobians in sorted({b.parent for b in blocks}):
        jf = A.JacobianBlocks.read([b for b in blocks if b.parent == jacobians])
        for load in (*jf.means.values(), *jf.per_sample.values()):  # the values: finite
            load()
        read.update(jf.files)
    return read


def test_every_artifact_reads_through_its_class(smoke):
    read = read_every_artifact(smoke)
    tables = {p for p in (smoke / "results").rglob("*.tsv") if "lens" not in p.parent.name}
    assert tables <= read, sorted(str(p.relative_to(smoke)) for p in tables - read)
    assert {p.name for p in read} >= {
        "phases.json",
        "spectra.h5",
        "samples.h5",
        "train.jsonl",
        "bootstrap.tsv",
        "training.tsv",
        "checkpoint.json",
        "lens",
        "layer000.h5",
        "layer005.h5",
    }


def test_jacobian_files_follow_the_schema(smoke):
    files = sorted((smoke / "results" / "tiny_llama" / "step30" / "jacobians").rglob("layer*.h5"))
    assert [f.name for f in files] == [f"layer{i:03d}.h5" for i in range(6)]
    with h5py.File(files[0], "r") as f:
        for kind in ("attn", "mlp"):
            assert f[kind]["mean"].shape == (32, 32)
            assert int(f[kind]["count"][()]) == 6
        assert f.attrs["samples_hash"]


def _sidecar(path: Path) -> Path:
    """The artifact's own sidecar, or that of the declared directory output holding it."""
    for candidate in (path, *path.parents):
        if io.prov_path(candidate).is_file():
            return io.prov_path(candidate)
    raise AssertionError(f"{path}: no provenance sidecar on it or any folder above it")


def test_every_output_has_provenance(smoke):
    for p in (smoke / "results").rglob("*.tsv"):
        prov = io.read_json(_sidecar(p))
        assert prov["rule"] and prov["versions"]["torch"] and prov["git"] is not None
        assert all(len(h) == 64 for h in prov["inputs"].values() if h), p


def test_provenance_chain_reaches_model_and_data(smoke, monkeypatch):
    fig = next((smoke / "results" / "figures" / "tiny_llama" / "step30").glob("funnel.png"))
    proc = subprocess.run(
        [RESDYN, "provenance", str(fig.relative_to(smoke))],
        cwd=smoke,
        env=env_for(smoke),
        capture_output=True,
        text=True,
        check=True,
    )
    out = proc.stdout
    for rule in ("figure_ckpt", "spectra", "jacobians", "resolve_checkpoint", "samples", "corpus"):
        assert f"rule {rule} " in out, rule
    assert "weights sha256" in out and "samples sha256" in out
    monkeypatch.chdir(smoke)
    rules = [prov["rule"] for _, prov in sidecars.chain(fig.relative_to(smoke))]
    assert rules[0] == "figure_ckpt" and "zoo_train" in rules


def test_every_rule_log_records_the_job_on_success(smoke):
    """Each job's log holds its INFO lines (inputs with shapes, threads, outputs,
    seconds, device, peak memory) and its progress bars, although every job succeeded."""
    logs = sorted((smoke / "logs").rglob("*.log"))
    assert len(logs) >= 35  # one per job: 40 in the smoke DAG (figures: one job per checkpoint/model)
    for log in logs:
        text = log.read_text()
        assert re.search(r"INFO resdyn\.rule\.\w+: rule \w+, wildcards .*, threads \d+", text), log
        assert re.search(
            r"INFO resdyn\.rule\.\w+: done in [\d.]+ s wall, [\d.]+ s CPU; device cpu.*; peak memory host "
            r"[\d.]+ (MiB|GiB)",
            text,
        ), log
        assert " output " in text, log
    log = lambda rel: (smoke / "logs" / rel).read_text()  # noqa: E731
    assert re.search(
        r"input results/tiny_llama/samples\.h5: [\d.]+ KiB, datasets .*\(6, 16\)",
        log("jacobians/tiny_llama/step30/layers000-003.log"),
    )
    assert "jacobians L0-3: 100%" in log("jacobians/tiny_llama/step30/layers000-003.log")  # tqdm bars
    assert "lens: " in log("lens/tiny_llama/step30.log")
    assert "train llama-6L: 100%" in log("zoo_train/tiny_llama.log")
    assert re.search(
        r"output results/tiny_llama/step30/spectra\.tsv: [\d.]+ KiB, 12 rows x \d+ columns",
        log("spectra/tiny_llama/step30.log"),
    )
    assert "fontTools" not in log("figures/tiny_llama/step30/figure_ckpt.log")  # library chatter kept out


def test_verify_detects_an_edited_upstream_table(smoke, tmp_path):
    work = copy_workflow(tmp_path / "wf")
    shutil.copytree(smoke / "results", work / "results")
    shutil.copytree(smoke / "models", work / "models")
    ok = subprocess.run([RESDYN, "verify", "results"], cwd=work, env=env_for(work), capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout
    table = work / "results" / "tiny_llama" / "step30" / "spectra.tsv"
    table.write_text(table.read_text().replace("\t0.", "\t1.", 1))
    bad = subprocess.run([RESDYN, "verify", "results"], cwd=work, env=env_for(work), capture_output=True, text=True)
    assert bad.returncode == 1
    assert "changed output: results/tiny_llama/step30/spectra.tsv: differs from what rule spectra wrote" in bad.stdout
    assert "checkpoints.tsv" in bad.stdout  # the artifacts made from it are named


def test_nothing_changed_nothing_reruns(smoke):
    assert planned_jobs(smoke) == {}


def test_phase_window_reruns_only_phases_and_downstream(smoke):
    cfg = with_config(smoke, "window", lambda c: c["phases"].update(window=5))
    jobs = planned_jobs(smoke, cfg)
    # bridge, causal and the scorecard label or compare layers by phase, so they follow
    assert set(jobs) == {
        "phases",
        "phase_metrics",
        "scaling",
        "bridge",
        "causal",
        "scorecard",
        "paper_comparison",
        "sensitivity",
        "figure_lens",
        "figure_global",
        "all",
    }
    assert jobs["phases"] == 1


def test_resolution_k_list_does_not_touch_jacobians_activations_or_lens(smoke):
    cfg = with_config(smoke, "ks", lambda c: c["readout"].update(k_fractions=[0.1, 0.25, 0.5]))
    jobs = planned_jobs(smoke, cfg)
    assert {"rss", "resolution"} <= set(jobs)
    assert not {"jacobians", "activations", "lens", "lens_metrics", "zoo_train", "samples"} & set(jobs)


def test_leiden_resolution_reruns_only_topology(smoke):
    cfg = with_config(smoke, "gamma", lambda c: c["topology"].update(resolution=0.1))
    jobs = planned_jobs(smoke, cfg)
    assert set(jobs) == {
        "communities",
        "coupling",
        "checkpoints",
        "scorecard",
        "paper_comparison",
        "sensitivity",
        "figure_ckpt",
        "figure_model",
        "all",
    }
    assert jobs["communities"] == 2  # 2 checkpoints


def test_sample_count_reruns_everything_downstream_of_samples(smoke):
    cfg = with_config(smoke, "n", lambda c: c["samples"].update(n=9))  # 3 groups of 3 (jacobian.n_groups)
    jobs = planned_jobs(smoke, cfg)
    assert {
        "samples",
        "jacobians",
        "activations",
        "spectra",
        "schur",
        "communities",
        "coupling",
        "lens_metrics",
        "phase_metrics",
    } <= set(jobs)
    assert not {"zoo_train", "corpus", "tokenizer", "lens_tokens", "lens"} & set(jobs)


def rule_scripts(work: Path) -> dict[str, str]:
    """Rule -> its script (workflow/scripts/...), read from the rule files' text."""
    out = {}
    for smk in sorted((work / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"(?m)^[ \t]*rule ", smk.read_text())[1:]:
            script = re.search(r'\bscript:\s*"\.\./scripts/([\w.]+\.py)"', block)
            if script:
                out[block.split(":", 1)[0].strip()] = f"workflow/scripts/{script[1]}"
    return out


def reached_modules(work: Path, script: str) -> set[str]:
    """resdyn modules a script reaches, by the standard library's modulefinder (bytecode), the
    oracle for resdyn.provenance.codeversion's ast walk."""
    finder = modulefinder.ModuleFinder(path=[str(work)])  # only the copy's resdyn is findable
    finder.run_script(str(work / script))
    return {m for m in finder.modules if m == "resdyn" or m.startswith("resdyn.")}


def summary_rows(work: Path, config: str = "configs/smoke.yaml") -> list[list[str]]:
    """snakemake --summary: [output_file, date, rule, log, status, plan] per output (nothing runs)."""
    lines = snakemake(work, "--summary", config=config).stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("output_file\t"))
    return [cols for cols in (line.split("\t") for line in lines[start + 1 :]) if len(cols) >= 6]


def params_changed(work: Path) -> set[str]:
    """Rules with an output whose recorded params differ from today's ("params changed" in
    --summary; unlike a dry run's reasons, it is checked for every job, not only the first
    needing a rerun on each path)."""
    rows = summary_rows(work)
    assert {r[4] for r in rows} <= {"ok", "params changed"}, {r[4] for r in rows}
    return {r[2] for r in rows if r[4] == "params changed"}


def edited_copy(smoke: Path, dest: Path) -> Path:
    """A copy of the finished smoke run (workflow, results, Snakemake's records) to edit."""
    work = copy_workflow(dest)
    for d in ("results", "models", ".snakemake"):
        shutil.copytree(smoke / d, work / d, symlinks=True)
    return codecache.carry(smoke, work)


def edit(path: Path, old: str | None, new: str) -> None:
    """Replace ``old`` by ``new`` in the file; ``old`` None: a new file."""
    if old is None:
        assert not path.exists(), path
        path.write_text(new)
        return
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


#: Edits that change no number: (file, old, new). A comment, a docstring, an unused helper and a
#: new family (adapter class and table entries; the smoke model is a llama). Every module of
#: resdyn/artifacts/ counts whole for the figure rules (render finds classes by path: docs/reruns.md),
#: so a new helper or artifact class there reruns the figure jobs, which restore unchanged figures.
NO_RERUN_EDITS = [
    ("resdyn/artifacts/study_a.py", "class SpectraTable(", "# a comment\nclass SpectraTable("),
    ("resdyn/study_a/jacobian.py", "other positions frozen.", "every other position held fixed."),
    ("resdyn/study_a/jacobian.py", "def attn_jacobian(", "def _unused_helper():\n    return 1\n\n\ndef attn_jacobian("),
    (
        "resdyn/lm/adapters/newfam.py",
        None,
        "from resdyn.lm.sublayers import LayerSublayers\n\n\nclass NewSublayers(LayerSublayers):\n"
        '    mlp_post = "post_feedforward_layernorm"\n',
    ),
    (
        "resdyn/lm/families.py",
        "FAMILIES: dict[str, Family] = {",
        'FAMILIES: dict[str, Family] = {\n    "newfam": Family(("newfam",), "NewLayer", '
        '"resdyn.lm.adapters.newfam:NewSublayers"),',
    ),
]

FIGURE_RULES = {
    "figure_ckpt",
    "figure_lens",
    "figure_model",
    "figure_zoo",
    "figure_global",
    "figure_trajectory",
    "figure_lens_trajectory",
}


def test_symbol_edits_rerun_exactly_the_rules_whose_scripts_reach_them(smoke, tmp_path):
    """Code versions are per symbol: a comment, a docstring, an unused helper or a new family reruns nothing; a new
    artifact class or helper in resdyn/artifacts/study_a.py only the figure rules; editing the body of
    attn_jacobian exactly the rules whose scripts reach it, among those that import its module
    (modulefinder, the oracle), and a dry run plans only them and their consumers."""
    from resdyn.provenance import codeversion

    work = edited_copy(smoke, tmp_path / "wf")
    assert params_changed(work) == set()
    originals = {rel: (work / rel).read_text() for rel, old, _ in NO_RERUN_EDITS if old is not None}
    for rel, old, new in NO_RERUN_EDITS:
        edit(work / rel, old, new)
    assert params_changed(work) == set()
    for rel, old, _ in NO_RERUN_EDITS:
        if old is None:
            (work / rel).unlink()
    for rel, text in originals.items():
        (work / rel).write_text(text)

    edit(
        work / "resdyn/artifacts/study_a.py",
        "class SpectraTable(",
        "def _unused_helper():\n    return 1\n\n\n"
        'class NewTable(TsvArtifact):\n    relpath = CKPT_DIR + "new.tsv"\n\n\nclass SpectraTable(',
    )
    assert params_changed(work) <= FIGURE_RULES
    (work / "resdyn/artifacts/study_a.py").write_text(originals["resdyn/artifacts/study_a.py"])

    in_dag = {row[2] for row in summary_rows(work)}
    scripts = {r: s for r, s in rule_scripts(work).items() if r in in_dag}
    symbol = "resdyn.study_a.jacobian:attn_jacobian"
    expected = {r for r, s in scripts.items() if symbol in codeversion.symbol_closure(work / s, work / "resdyn")}
    importers = {r for r, s in scripts.items() if "resdyn.study_a.jacobian" in reached_modules(work, s)}
    assert "jacobians" in expected and expected <= importers
    edit(work / "resdyn/study_a/jacobian.py", "    x = h[t].detach().clone()", "    x = h[t].detach().clone() * 1")
    assert params_changed(work) == expected
    jobs = planned_jobs(work)
    assert set(jobs) >= expected and jobs["jacobians"] == 4  # 2 checkpoints x 2 layer blocks
    assert not {
        "zoo_train",
        "resolve_checkpoint",
        "samples",
        "lens_tokens",
        "lens",
        "activations",
        "lens_metrics",
        "communities",
    } & set(jobs)


def test_settings_rerun_nothing(smoke):
    """checkpoint_every (Jacobians, lens) and device are settings, not rerun triggers."""

    def change(c):
        c["jacobian"]["checkpoint_every"] = 3
        c["lens"]["checkpoint_every"] = 7
        c["device"] = "auto"

    assert planned_jobs(smoke, with_config(smoke, "settings", change)) == {}


def test_adding_a_revision_plans_only_its_jobs(smoke, tmp_path):
    """Revisions are planned per checkpoint: a local model whose checkpoints are folders (the zoo's
    weights), run up to its spectra. A new first checkpoint plans only its own jobs (no samples: they depend on the
    tokenizer, not on which checkpoint comes first); reordering them, or removing the one the
    tokenizer was copied from, plans nothing."""
    from resdyn.provenance import changes

    work = edited_copy(smoke, tmp_path / "wf")
    shutil.copytree(work / "models" / "tiny_llama" / "weights" / "step0", work / "extra_ckpt")

    def local(paths):
        def change(c):  # extra_ckpt is a copy of step0: kept (and marked) by allow_duplicate_weights
            m = {"source": "local", "dataset": "kjv", "paths": paths, "allow_duplicate_weights": True}
            c["models"] = {"tiny_local": m}
            c["scaling"]["groups"] = {"llama": ["tiny_local"]}

        return change

    def targets(paths):
        return [f"results/tiny_local/{c}/spectra.tsv" for c in paths]

    before = {"step0": "models/tiny_llama/weights/step0", "step30": "models/tiny_llama/weights/step30"}
    cfg = with_config(work, "local", local(before))
    snakemake(work, "--cores", "2", *targets(before), config=cfg)
    added = {"first": "extra_ckpt", **before}
    out = snakemake(work, "-n", *targets(added), config=with_config(work, "added", local(added))).stdout
    jobs = changes.parse_dry_run(out)
    assert sorted((j.rule, j.wildcards.get("ckpt")) for j in jobs) == [
        ("checkpoint_integrity", "first"),
        ("jacobians", "first"),
        ("jacobians", "first"),
        ("resolve_checkpoint", "first"),
        ("spectra", "first"),
    ]
    reordered = {"step30": before["step30"], "step0": before["step0"]}
    out = snakemake(work, "-n", *targets(reordered), config=with_config(work, "reordered", local(reordered))).stdout
    assert "Nothing to be done" in out, out[-3000:]
    # step0 is where the tokenizer was copied from: without it, still nothing to redo
    removed = {"step30": before["step30"]}
    out = snakemake(work, "-n", *targets(removed), config=with_config(work, "removed", local(removed))).stdout
    assert "Nothing to be done" in out, out[-3000:]


def test_a_fresh_checkout_reruns_nothing_with_the_profiles(smoke, tmp_path):
    """Every script newer than the outputs, as after a fresh clone or a checkout: Snakemake's own
    "code" trigger reruns every job (it compares script mtimes with the outputs); the profiles
    leave it out, since the code param already holds each script's normalised code."""
    work = edited_copy(smoke, tmp_path / "wf")
    later = max(p.stat().st_mtime for p in (work / "results").rglob("*")) + 60
    for script in (work / "workflow" / "scripts").glob("*.py"):
        os.utime(script, (later, later))
    assert "Code has changed since last execution" in snakemake(work, "-n").stdout
    out = snakemake(work, "-n", "--profile", "profiles/local").stdout
    assert "Nothing to be done" in out, out[-3000:]
    for profile in ("local", "slurm"):
        cfg = yaml.safe_load((ROOT / "profiles" / profile / "config.yaml").read_text())
        assert cfg["rerun-triggers"] == ["mtime", "params", "input", "software-env"], profile


def test_plan_changes_names_the_symbol_and_the_cost(smoke, tmp_path):
    """`resdyn plan --changes` after an edit: the rule, the changed symbol, and hours."""
    work = edited_copy(smoke, tmp_path / "wf")
    edit(work / "resdyn/study_a/jacobian.py", "    x = h[t].detach().clone()", "    x = h[t].detach().clone() * 1")
    proc = subprocess.run(
        [RESDYN, "plan", "configs/smoke.yaml", "--changes"], cwd=work, env=env_for(work), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert re.search(r"^jacobians: 4 job\(s\), 0 GPU-h, [0-9.e-]+ CPU-h$", text, re.M), text
    assert "code: resdyn.study_a.jacobian:attn_jacobian" in text
    assert "input: after jacobians ×2" in text and "zoo_train" not in text
    assert re.search(r"^total: \d+ jobs, ", text, re.M)


def dag_outputs(work: Path, config: str) -> dict[str, str]:
    """Output file -> rule for every job of the DAG."""
    return {row[0]: row[2] for row in summary_rows(work, config)}


A_RULES = {"jacobians", "spectra", "schur", "communities", "coupling", "checkpoints", "bootstrap", "figure_trajectory"}
B_RULES = {
    "lens_tokens",
    "lens",
    "lens_metrics",
    "rss",
    "resolution",
    "phases",
    "phase_metrics",
    "scaling",
    "causal",
    "figure_lens",
    "figure_global",
}  # no figure_lens_trajectory: the smoke preset's lens is trained at one checkpoint
A_FIGURES = {"eigenvalues", "operator", "funnel", "schur", "communities", "coupling", "coupling_henrici", "uncertainty"}
B_FIGURES = {"lens", "rss", "resolution", "phase_metrics", "causal"}


@pytest.mark.parametrize("studies", [["A"], ["B"], ["A", "B"]], ids="".join)
def test_study_switch_selects_the_dag(studies, tmp_path, code_cache_seed):
    """Config key studies: the DAG holds the rules and figures of the chosen studies only (the
    bridge needs both); every model keeps its scorecard."""
    work = copy_workflow(tmp_path / "wf", code_cache_seed)
    cfg = with_config(work, "studies", lambda c: c.update(studies=studies))
    files = dag_outputs(work, cfg)
    rules = set(files.values())
    a, b = "A" in studies, "B" in studies
    assert (A_RULES <= rules) == a and not (A_RULES & rules) == (not a)
    assert (B_RULES <= rules) == b and not (B_RULES & rules) == (not b)
    assert ("bridge" in rules) == (a and b)
    assert "results/tiny_llama/scorecard.tsv" in files
    figures = {}
    for path in files:
        m = re.fullmatch(r"results/figures/tiny_llama/(?:(step\d+)/)?(\w+)\.png", path)
        if m:
            figures.setdefault(m[1], set()).add(m[2])
    expected_final = (A_FIGURES if a else set()) | (B_FIGURES if b else set()) | ({"bridge"} if a and b else set())
    assert figures.get("step30", set()) == expected_final
    assert figures.get("step0", set()) == (A_FIGURES if a else set())  # lens figures: final checkpoint only
    assert figures[None] == {"training"} | ({"checkpoints", "significant", "partitions"} if a else set())
    if studies != ["A", "B"]:
        wanted = "results/figures/tiny_llama/step30/" + ("rss.png" if studies == ["A"] else "funnel.png")
        proc = snakemake(work, "-n", wanted, config=cfg, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "config key 'studies'" in out and "leaves out study" in out, out[-2000:]


def test_editing_one_plot_function_redraws_exactly_that_figure(smoke, tmp_path):
    """One figure job per checkpoint (fewer job start-ups), yet per-figure rebuilds. After an edit of
    funnel() every figure job reruns (its code version covers the figure modules), but only the
    funnel figures are drawn again: the others come back from the render cache byte for byte."""
    work = edited_copy(smoke, tmp_path / "wf")
    figures = sorted((work / "results" / "figures").glob("tiny_llama/**/*.p[nd][gf]"))
    before = {p: p.read_bytes() for p in figures}
    module = work / "resdyn" / "plots" / "study_a_spectra.py"
    module.write_text(
        module.read_text().replace(
            "def funnel(bottleneck_df: pd.DataFrame, title: str) -> Figure:\n",
            'def funnel(bottleneck_df: pd.DataFrame, title: str) -> Figure:\n    title = title + " (edited)"\n',
            1,
        )
    )
    assert planned_jobs(work).keys() == {
        "figure_ckpt",
        "figure_lens",
        "figure_model",
        "figure_zoo",
        "figure_global",
        "figure_trajectory",
        "all",
    }
    snakemake(work, "--cores", "1")
    changed = {str(p.relative_to(work)) for p in figures if p.read_bytes() != before[p]}
    assert changed == {
        f"results/figures/tiny_llama/{c}/funnel.{e}" for c in ("step0", "step30") for e in ("png", "pdf")
    }
    log = (work / "logs" / "figures" / "tiny_llama" / "step0" / "figure_ckpt.log").read_text()
    assert "drew funnel" in log and "restored unchanged eigenvalues" in log and "drew eigenvalues" not in log
    assert planned_jobs(work) == {}


def test_lint_and_format(smoke):
    lint = subprocess.run(
        [SNAKEMAKE, "--lint", "--configfile", "configs/smoke.yaml"],
        cwd=ROOT,
        env=env_for(ROOT),
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0 and "Lints for" not in lint.stdout + lint.stderr, lint.stdout + lint.stderr
    fmt = subprocess.run(
        [str(Path(sys.executable).parent / "snakefmt"), "--check", "Snakefile", "workflow/rules"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


@pytest.mark.parametrize(
    "config",
    [
        "config.yaml",
        "configs/smoke.yaml",
        "configs/paper-a.yaml",
        "configs/paper-b.yaml",
        "configs/paper-b-extended.yaml",
        "configs/pythia.yaml",
    ],
)
def test_dry_run_every_config(config, paper_hub_cache):
    # offline, hub models must be in the cache: stand-in snapshots of the paper presets' models
    proc = subprocess.run(
        [SNAKEMAKE, "-n", "--configfile", config],
        cwd=ROOT,
        env={**env_for(ROOT), "HF_HUB_CACHE": str(paper_hub_cache)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_collect_load_compare_and_the_notebook_on_the_smoke_run(smoke, tmp_path):
    """Collect the smoke run into parquet, load it back, compare it with itself and with a
    copy whose step30 bootstrap was redone with another seed, and run the example notebook on it."""
    import matplotlib.pyplot as plt
    import numpy as np

    import resdyn
    from resdyn import artifacts as A

    from helpers.notebooks import run_notebook

    def cli(*args):
        return subprocess.run([RESDYN, *args], cwd=smoke, env=env_for(smoke), capture_output=True, text=True)

    out = cli("collect", "results", "-o", str(tmp_path / "t"))
    assert out.returncode == 0, out.stderr
    tables = resdyn.load(tmp_path / "t")
    assert {"spectra", "bootstrap", "lens_metrics", "rss", "phase_metrics", "communities", "scorecard"} <= set(tables)
    spectra = tables["spectra"]
    ident = spectra[["model", "family", "n_layers", "d_model", "ckpt", "step", "tokens"]].drop_duplicates()
    assert ident.values.tolist() == [
        ["tiny_llama", "llama", 6, 32, "step0", 0.0, 0.0],
        ["tiny_llama", "llama", 6, 32, "step30", 30.0, 30 * 8 * 32.0],
    ]
    prov = io.read_json(smoke / "results/tiny_llama/step30/spectra.tsv.prov.json")
    assert set(spectra["code_version"]) <= {
        prov["params"]["code"],
        io.read_json(smoke / "results/tiny_llama/step0/spectra.tsv.prov.json")["params"]["code"],
    }
    assert (
        set(spectra["resdyn_version"])
        == {resdyn.__version__}
        == {io.read_json(tmp_path / "t/catalog.json")["resdyn_version"]}
    )
    assert cli("compare", "results", str(tmp_path / "t")).returncode == 0

    other = tmp_path / "other"  # the same run, its step30 bootstrap redone with seed 1
    for folder in ("results", "models"):
        shutil.copytree(smoke / folder, other / folder, ignore=shutil.ignore_patterns("*.h5", "*.safetensors"))
    boot = other / "results/tiny_llama/step30/bootstrap.tsv"
    table = io.read_tsv(boot)
    table["ci_low"] = table["ci_low"] - 0.01 * np.abs(table["ci_low"]) - 1e-3
    side = io.read_json(io.prov_path(boot))
    side["params"]["seed"] = side["params"].get("seed", 0) + 1
    A.BootstrapTable.write(table, boot)
    side["artifact"] = sidecars.fingerprint(boot)
    io.write_json(side, io.prov_path(boot))
    out = cli("compare", "results", str(other))
    assert out.returncode == 1, out.stdout + out.stderr
    assert re.findall(r"^DIFFERENT (\w+): (\S+):", out.stdout, re.M) == [
        ("bootstrap", "results/tiny_llama/step30/bootstrap.tsv")
    ]
    assert "ci_low:" in out.stdout and re.search(r"provenance difference: params seed \d+ → \d+", out.stdout)

    plt.close("all")
    run_notebook(ROOT / "examples" / "cross_checkpoint.ipynb", {"RESDYN_RUN": str(tmp_path / "t")})
    figures = [plt.figure(n) for n in plt.get_fignums()]
    assert len(figures) == 2
    for fig in figures:
        assert all(list(line.get_xdata()) == [0.0, 30.0] for ax in fig.axes for line in ax.lines)
        assert sum(len(ax.lines) for ax in fig.axes) >= 2
    plt.close("all")


def test_sensitivity_table_defaults_are_the_paper_table(smoke):
    """Every open choice has rows for each option; the configured option's rows are the paper
    table's own numbers and verdicts, and an option without numbers says why."""
    from resdyn import artifacts as A
    from resdyn.beyond import sensitivity as S

    sens = A.SensitivityTable.read(smoke / "results" / "sensitivity.tsv")
    paper = A.PaperComparison.read(smoke / "results" / "paper_comparison.tsv").fillna({"reason": ""})
    assert set(sens["choice"]) == set(S.CHOICES)
    for choice, options in S.CHOICES.items():
        assert set(sens.loc[sens["choice"] == choice, "option"]) == set(options), choice
    assert (sens["value"].notna() | (sens["reason"].fillna("") != "")).all()
    by = paper.set_index(["claim", "model", "measure"])
    checked = 0
    for r in sens[sens["default"]].itertuples():
        if (r.claim, r.model, r.measure) in by.index:
            p = by.loc[(r.claim, r.model, r.measure)]
            p = p.iloc[0] if isinstance(p, pd.DataFrame) else p
            assert r.verdict == p["verdict"], (r.claim, r.measure)
            assert (math.isnan(r.value) and math.isnan(p["run_value"])) or r.value == p["run_value"]
            checked += 1
    assert checked >= 30
    # the other readout matrix is recomputed as the rss, resolution and phases rules would: with the
    # configured one it gives the run's own phases.json (the profile up to rss.tsv's printed digits)
    cfg = yaml.safe_load((smoke / "configs" / "smoke.yaml").read_text())
    ph = S.readout_phases(
        A.LensFolder.read_translator_matrices(smoke / "results" / "tiny_llama" / "step30" / "lens"),
        "I_plus_W",
        cfg["readout"]["k_fractions"],
        cfg["readout"]["phase_k_fraction"],
        cfg["phases"]["window"],
        cfg["phases"]["smoothing"],
    )
    run = io.read_json(smoke / "results" / "tiny_llama" / "step30" / "phases.json")
    assert {k: v for k, v in ph.items() if k not in ("profile", "smoothed", "stages")} == {
        k: v for k, v in run.items() if k not in ("profile", "smoothed", "stages")
    }
    np.testing.assert_allclose(ph["profile"], run["profile"], atol=1e-9)
