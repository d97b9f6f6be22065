"""The artifacts layer: every class round-trips its file and names the file and the fault on a bad read."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from resdyn import artifacts as A
from resdyn.beyond import bootstrap, bridge, causal, scorecard
from resdyn.study_a import spectral
from resdyn.study_b import lens, phases, readout

TSV_CLASSES = sorted(
    (c for c in vars(A).values() if isinstance(c, type) and issubclass(c, A.TsvArtifact) and c is not A.TsvArtifact),
    key=lambda c: c.__name__,
)
_VALUES = {"int": [0, 3], "float": [0.5, -1.25e-7], "bool": [True, False], "str": ["a b", "x,y"]}


def valid_table(cls: type[A.TsvArtifact]) -> pd.DataFrame:
    """Two rows, one value of each column's kind per row."""
    return pd.DataFrame({name: _VALUES[kind] for name, kind in cls.columns.items()})


def test_every_artifact_has_a_class():
    names = {c.__name__ for c in TSV_CLASSES}
    assert {
        "SpectraTable",
        "BottleneckTable",
        "SchurCurves",
        "CouplingTable",
        "CommunitiesSummary",
        "CommunityPartitions",
        "CausalTable",
        "BridgeTable",
        "BridgeAlignment",
        "BootstrapTable",
        "BootstrapReplicates",
        "ScorecardTable",
        "RssProfile",
        "ResolutionTable",
        "LensMetrics",
        "PhaseMetrics",
        "LayerGeometry",
        "TrainingCurve",
    } <= names
    for cls in TSV_CLASSES:
        packaged = cls is A.ClaimsTable  # package data, not a run output
        assert cls.columns and (cls.relpath or packaged), cls.__name__
        assert cls.__doc__.startswith(("``resdyn/data/",) if packaged else ("``results/", "``models/")), cls.__name__
        # a NaN-allowed column is a declared one, or an extra column of a class that takes extras
        assert cls.extra_columns or set(cls.allow_nan) <= set(cls.columns), cls.__name__


def test_artifact_classes_register_themselves_and_are_re_exported():
    """Artifact.__init_subclass__ fills the registry; the package re-exports every class its modules
    define, and artifact_classes lists those with a path, module by module in MODULES order."""
    defined = [
        c
        for m in A.MODULES
        for c in vars(m).values()
        if isinstance(c, type) and issubclass(c, A.Artifact) and c is not A.Artifact and c.__module__ == m.__name__
    ]
    assert len(defined) > 35 and set(defined) <= set(A.base.registered())
    assert all(getattr(A, c.__name__) is c and c.__name__ in A.__all__ for c in defined)
    assert A.artifact_classes() == [c for c in defined if c.relpath]
    assert A.by_relpath("results/{model}/{ckpt}/rss.tsv") is A.RssProfile

    class Elsewhere(A.TsvArtifact):  # registers too, but is not one of the package's artifact classes
        relpath = "results/{model}/{ckpt}/rss.tsv"

    assert Elsewhere in A.base.registered() and Elsewhere not in A.artifact_classes()
    assert A.by_relpath("results/{model}/{ckpt}/rss.tsv") is A.RssProfile


def test_the_catalogue_lists_every_artifact_class_and_its_path():
    """docs/artifacts.md has one row per artifact class with a path, and the row gives that path."""

    text = (Path(__file__).parents[1] / "docs" / "artifacts.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]+)`", text, re.M))
    for cls in A.artifact_classes():
        assert cls.__name__ in rows, f"docs/artifacts.md has no row for {cls.__name__}"
        assert rows[cls.__name__] == cls.relpath, (cls.__name__, rows[cls.__name__], cls.relpath)


def test_column_lists_have_one_home():
    # concept modules use the lists the classes define (the same objects, not copies)
    assert bootstrap.BOOTSTRAP_COLUMNS is A.BOOTSTRAP_COLUMNS == list(A.BootstrapTable.columns)
    assert bootstrap.REPLICATE_COLUMNS is A.REPLICATE_COLUMNS
    assert causal.CAUSAL_COLUMNS is A.CAUSAL_COLUMNS
    assert bridge.ALIGNMENT_COLUMNS is A.ALIGNMENT_COLUMNS
    assert scorecard.SCORECARD_COLUMNS is A.SCORECARD_COLUMNS
    assert readout.RSS_COLUMNS is A.RSS_COLUMNS and "d" in A.RSS_COLUMNS
    assert lens.METRIC_COLUMNS is A.LENS_METRIC_COLUMNS


def test_paths_are_relative_to_the_run(tmp_path):
    assert A.SpectraTable.path(tmp_path, model="m", ckpt="c") == tmp_path / "results/m/c/spectra.tsv"
    assert A.ScorecardTable.path(tmp_path, model="m") == tmp_path / "results/m/scorecard.tsv"
    assert A.SpectraArrays.path(model="m", ckpt="c").as_posix() == "results/m/c/spectra.h5"
    assert A.PhaseCuts.path(tmp_path, model="m", ckpt="c").name == "phases.json"


@pytest.mark.parametrize("cls", TSV_CLASSES, ids=lambda c: c.__name__)
def test_tsv_round_trip(cls, tmp_path):
    table = valid_table(cls)
    path = tmp_path / "out" / "t.tsv"
    cls.write(table, path, provenance={"rule": "x"})
    assert sorted(p.name for p in path.parent.iterdir()) == ["t.tsv", "t.tsv.prov.json"]  # no temp left
    pd.testing.assert_frame_equal(cls.read(path), table)


@pytest.mark.parametrize("cls", TSV_CLASSES, ids=lambda c: c.__name__)
def test_tsv_validation_names_file_and_fault(cls, tmp_path):
    path = tmp_path / "bad.tsv"
    table = valid_table(cls)
    first = next(iter(cls.columns))
    table.drop(columns=[first]).to_csv(path, sep="\t", index=False)
    with pytest.raises(A.ArtifactError, match=rf"bad\.tsv: lacks column\(s\) \['{first}'\]"):
        cls.read(path)
    with pytest.raises(A.ArtifactError, match="refusing to write"):
        cls.write(table.drop(columns=[first]), path)
    numeric = [c for c, k in cls.columns.items() if k in ("int", "float")]
    if numeric:
        bad = valid_table(cls).astype({numeric[-1]: object})
        bad.loc[1, numeric[-1]] = "oops"
        bad.to_csv(path, sep="\t", index=False)
        with pytest.raises(A.ArtifactError, match=rf"bad\.tsv: column '{numeric[-1]}' must hold"):
            cls.read(path)
    strict = [c for c in numeric if c not in cls.allow_nan]
    if strict:
        bad = valid_table(cls).astype({strict[0]: float})
        bad.loc[0, strict[0]] = np.nan
        if "reason" in bad.columns:
            bad["reason"] = ""
        bad.to_csv(path, sep="\t", index=False)
        with pytest.raises(A.ArtifactError, match=rf"bad\.tsv: column '{strict[0]}' row 0 is nan"):
            cls.read(path)
    if not cls.extra_columns:
        valid_table(cls).assign(surprise=1).to_csv(path, sep="\t", index=False)
        with pytest.raises(A.ArtifactError, match=r"unexpected column\(s\) \['surprise'\]"):
            cls.read(path)


def test_nan_allowed_where_declared_or_with_a_reason(tmp_path):
    t = valid_table(A.BootstrapTable).astype({"layer": float, "estimate": float})
    t.loc[1, ["layer", "s"]] = np.nan  # whole-model row: no layer
    A.BootstrapTable.write(t, tmp_path / "b.tsv")
    back = A.BootstrapTable.read(tmp_path / "b.tsv")
    assert back["layer"].isna().tolist() == [False, True]
    t.loc[0, "estimate"] = np.nan
    t.loc[0, "reason"] = "not bootstrapped"
    A.BootstrapTable.write(t, tmp_path / "b.tsv")
    assert np.isnan(A.BootstrapTable.read(tmp_path / "b.tsv")["estimate"][0])
    t.loc[0, "reason"] = ""
    with pytest.raises(FloatingPointError, match="estimate"):
        A.BootstrapTable.write(t, tmp_path / "b.tsv")  # the writer refuses it too


def test_int_column_with_allowed_nan_must_still_be_integral(tmp_path):
    t = valid_table(A.CausalTable).astype({"phase": float})
    t.loc[0, "phase"] = np.nan
    t.loc[1, "phase"] = 2.5
    t.to_csv(tmp_path / "c.tsv", sep="\t", index=False)
    with pytest.raises(A.ArtifactError, match="column 'phase' must hold int"):
        A.CausalTable.read(tmp_path / "c.tsv")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.tsv"):
        A.SpectraTable.read(tmp_path / "nothing.tsv")


def test_community_partitions_folder(tmp_path):
    t = valid_table(A.CommunityPartitions)
    for layer in (1, 0):
        A.CommunityPartitions.write(t.assign(layer=layer), A.CommunityPartitions.layer_file(tmp_path, layer))
    assert A.CommunityPartitions.layer_file(tmp_path, 1).name == "layer001.tsv"
    back = A.CommunityPartitions.read_folder(tmp_path)
    assert back["layer"].tolist() == [0, 0, 1, 1]
    with pytest.raises(FileNotFoundError, match="no layer"):
        A.CommunityPartitions.read_folder(tmp_path / "missing")


def _arrays():
    rng = np.random.default_rng(2)
    return spectral.spectra_table({(0, "attn"): rng.standard_normal((5, 5)), (0, "mlp"): np.eye(5)})[1]


def test_spectra_arrays_round_trip(tmp_path):
    arrays = _arrays()
    path = tmp_path / "out" / "spectra.h5"
    A.SpectraArrays.write(arrays, path, {"model": "zoo-8", "ckpt": "final", "config": {"k": [1, 2]}})
    assert sorted(p.name for p in path.parent.iterdir()) == ["spectra.h5"]  # no temp left over
    back, attrs = A.SpectraArrays.read(path)
    assert attrs["schema"] == "resdyn.spectra/1" and attrs["model"] == "zoo-8"
    assert attrs["config"] == '{"k": [1, 2]}'
    for name, ds in arrays.items():
        for k, v in ds.items():
            np.testing.assert_array_equal(back[name][k], v)
    with h5py.File(path) as f:
        assert (f["L000_mlp"].attrs["layer"], f["L000_mlp"].attrs["s"]) == (0, 1)
        assert f["L000_mlp"].attrs["kind"] == "mlp"
        assert f["L000_attn/eigenvalues"].dtype == np.complex128
    assert A.SpectraArrays.read(path)[1]["schema"] == "resdyn.spectra/1"


def test_spectra_arrays_refuse_bad_input_and_files(tmp_path):
    arrays = _arrays()
    with pytest.raises(ValueError, match="not of the form"):
        A.SpectraArrays.write({"layer0": arrays["L000_attn"]}, tmp_path / "x.h5")
    with pytest.raises(ValueError, match="lacks datasets"):
        A.SpectraArrays.write({"L000_attn": {"eigenvalues": np.ones(2)}}, tmp_path / "x.h5")
    with pytest.raises(ValueError, match="must be 1-D"):
        A.SpectraArrays.write(
            {"L000_attn": {**arrays["L000_attn"], "singular_values": np.ones((5, 1))}}, tmp_path / "x.h5"
        )
    with pytest.raises(ValueError, match="differ in length"):
        A.SpectraArrays.write({"L000_attn": {**arrays["L000_attn"], "singular_values": np.ones(4)}}, tmp_path / "x.h5")
    assert not (tmp_path / "x.h5").exists()
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f.attrs["schema"] = "something/else"
    with pytest.raises(A.ArtifactError, match=r"foreign\.h5: schema 'something/else', expected 'resdyn.spectra/1'"):
        A.SpectraArrays.read(tmp_path / "foreign.h5")
    path = tmp_path / "s.h5"
    A.SpectraArrays.write(arrays, path)
    with h5py.File(path, "a") as f:
        del f["L000_mlp/singular_values_JmI"]
    with pytest.raises(A.ArtifactError, match="s.h5: group 'L000_mlp' lacks dataset 'singular_values_JmI'"):
        A.SpectraArrays.read(path)
    with h5py.File(path, "a") as f:
        f["L000_mlp/singular_values_JmI"] = np.ones(5, dtype=np.float32)
    with pytest.raises(A.ArtifactError, match="L000_mlp/singular_values_JmI is float32"):
        A.SpectraArrays.read(path)
    (tmp_path / "junk.h5").write_text("not hdf5")
    with pytest.raises(A.ArtifactError, match="junk.h5: cannot open as HDF5"):
        A.SpectraArrays.read(tmp_path / "junk.h5")


def test_spectra_depth_index_is_the_sublayer_index():
    for layer in (0, 3):
        for kind in spectral.OPERATOR_KINDS:
            assert A.SpectraArrays.depth_index(layer, kind) == spectral.sublayer_index(layer, kind)


def test_phase_cuts_round_trip(tmp_path):
    profile = np.array([0.2, 0.5, 0.8, 0.9, 0.85, 0.5, 0.3, 0.25, 0.2])
    cuts = phases.cutpoints(profile, window=1, method="none").at_k(3, 0.25)
    path = tmp_path / "phases.json"
    A.PhaseCuts.write(cuts, path)
    back = phases.Cutpoints.from_json(A.PhaseCuts.read(path), source=str(path))
    assert back == cuts and A.PhaseCuts.read(path) == cuts.to_json()
    path.write_text('{"b1": 1}')
    with pytest.raises(A.ArtifactError, match=r"phases.json: lacks keys \['b2'"):
        A.PhaseCuts.read(path)
    path.write_text("[1, 2]")
    with pytest.raises(A.ArtifactError, match="phases.json: expected a JSON object"):
        A.PhaseCuts.read(path)
    with pytest.raises(A.ArtifactError, match="without keys"):
        A.PhaseCuts.write({"b1": 0}, path)


def test_corpus_round_trip_and_corrupt_line(tmp_path):
    p = A.Corpus.path(tmp_path, dataset="kjv", split="train")
    assert p == tmp_path / "results/data/kjv/train.jsonl"
    A.Corpus.write(["a\nb", "ç"], p)
    assert A.Corpus.read(p) == ["a\nb", "ç"]
    p.write_text(p.read_text() + '{"text": 3}\n')
    with pytest.raises(ValueError, match=r"train.jsonl:3: not a document line \(text is a int"):
        A.Corpus.read(p)
    p.write_text('{"text": "x"}\n{broken\n')
    with pytest.raises(ValueError, match=r"train.jsonl:2"):
        A.Corpus.read(p)


def test_samples_round_trip_hash_shape_and_corruption(tmp_path):
    ids = np.arange(12, dtype=np.int64).reshape(3, 4)
    sids = np.array([0, 4, 8])
    p = tmp_path / "s.h5"
    digest = A.Samples.write(p, ids, sids, {"dataset": "x", "cfg": {"a": 1}})
    got, gsids, attrs = A.Samples.read(p)
    np.testing.assert_array_equal(got, ids)
    np.testing.assert_array_equal(gsids, sids)
    assert attrs["samples_hash"] == digest and attrs["cfg"] == '{"a": 1}'
    A.Samples.write(tmp_path / "short.h5", ids, sids[:2], {})
    with pytest.raises(A.ArtifactError, match=r"short.h5: input_ids must be \(N, T\) and sample_ids \(N,\)"):
        A.Samples.read(tmp_path / "short.h5")
    A.Samples.write(tmp_path / "float.h5", ids.astype(float), sids, {})
    with pytest.raises(A.ArtifactError, match="float.h5: input_ids and sample_ids must be integers"):
        A.Samples.read(tmp_path / "float.h5")
    with h5py.File(p, "r+") as f:
        f["input_ids"][0, 0] = 99
    with pytest.raises(ValueError, match="samples_hash"):
        A.Samples.read(p)
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match="junk.h5"):
        A.Samples.read(tmp_path / "junk.h5")


def _record() -> dict:
    return {
        "model": "m",
        "checkpoint": "step0",
        "source": "train",
        "path": "models/m/weights/step0",
        "folder": "/abs/models/m/weights/step0",
        "resolved_commit": None,
        "weight_files": ["model.safetensors"],
        "content_hash": "a" * 64,
        "tokenizer_hash": "b" * 64,
    }


def test_checkpoint_record_round_trip_and_validation(tmp_path):
    p = A.CheckpointRecord.path(tmp_path, model="m", ckpt="step0")
    A.CheckpointRecord.write(_record(), p)
    assert A.CheckpointRecord.read(p) == _record()
    bad = _record()
    del bad["content_hash"]
    with pytest.raises(A.ArtifactError, match=r"checkpoint.json: lacks key\(s\) \['content_hash'\]"):
        A.CheckpointRecord.write(bad, p)
    p.write_text(
        '{"model": "m", "checkpoint": 0, "source": "train", "folder": "f", "weight_files": [], '
        '"content_hash": "x", "tokenizer_hash": "y"}'
    )
    with pytest.raises(A.ArtifactError, match="checkpoint.json: checkpoint must be a str, got 0"):
        A.CheckpointRecord.read(p)
    p.write_text(p.read_text().replace('"checkpoint": 0', '"checkpoint": "s"'))
    with pytest.raises(A.ArtifactError, match="content_hash must be a SHA-256 hex digest"):
        A.CheckpointRecord.read(p)


def _activation_folder(tmp_path, n_layers=2, residual="sequential"):
    rng = np.random.default_rng(0)
    states = rng.standard_normal((3, 2 * n_layers + 1, 4, 5)).astype(np.float32)
    for layer in range(n_layers):
        with h5py.File(tmp_path / f"layer{layer:03d}.h5", "w") as f:
            f["pre_attn"], f["pre_mlp"] = states[:, 2 * layer], states[:, 2 * layer + 1]
            if layer == n_layers - 1:
                f["output"] = states[:, -1]
            f.attrs["residual"] = residual
    return states


def test_activation_readers(tmp_path):
    states = _activation_folder(tmp_path)
    assert A.Activations.boundaries(tmp_path / "layer000.h5") == ("pre_attn", "pre_mlp")
    np.testing.assert_array_equal(A.Activations.read_all_boundaries(tmp_path), states)
    view = A.Activations.view(tmp_path)
    assert view.shape == states.shape
    np.testing.assert_array_equal(view[1:3, 4, :, 2:4], states[1:3, 4, :, 2:4])
    np.testing.assert_array_equal(view[:, -1, :, :], states[:, -1])
    with pytest.raises(IndexError, match="state 5 outside 0..4"):
        view[:, 5, :, :]
    with pytest.raises(ValueError, match=r"layer000.h5: cannot read activations 'output'"):
        A.Activations.read_boundary(tmp_path / "layer000.h5", "output")
    with pytest.raises(FileNotFoundError, match="no layer"):
        A.Activations.view(tmp_path / "missing")


def test_folder_artifacts_paths(tmp_path):
    assert (
        A.JacobianBlocks.path(tmp_path, model="m", ckpt="c", block="layers000-003")
        == tmp_path / "results/m/c/jacobians/layers000-003"
    )
    folder = A.Activations.path(tmp_path, model="m", ckpt="c")
    folder.mkdir(parents=True)
    for name in ("layer010.h5", "layer002.h5", "notes.txt"):
        (folder / name).write_text("")
    assert [f.name for f in A.Activations.layer_files(folder)] == ["layer002.h5", "layer010.h5"]


def test_artifacts_imports_nothing_heavy_or_conceptual():
    """Every script imports this package: its imports enter every rule's code version and start-up."""
    from resdyn.provenance import codeversion

    package = Path(A.__file__).parent
    files = sorted(package.glob("*.py"))
    own = {f"resdyn.artifacts.{m.__name__.rsplit('.', 1)[1]}" for m in A.MODULES}
    assert {f"resdyn.artifacts.{p.stem}" for p in files if p.stem != "__init__"} == own
    for path in files:
        name = "resdyn.artifacts" if path.stem == "__init__" else f"resdyn.artifacts.{path.stem}"
        assert codeversion.imported_modules(path, name) <= {"resdyn", "resdyn.io", "resdyn.artifacts"} | own, path
    heavy = {"torch", "transformers", "matplotlib", "scipy"}
    # torch only inside the writers/readers of torch's own file formats, which the jobs that
    # train a lens call (they have torch loaded already); nowhere else, and never at import
    allowed = {("LensFolder", "write_tuned_lens"), ("LensCheckpoint", "save"), ("LensCheckpoint", "load")}

    def heavy_imports(node: ast.AST) -> set[str]:
        roots = set()
        for n in ast.walk(node):
            if isinstance(n, ast.Import):
                roots |= {a.name.split(".")[0] for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.module:
                roots.add(n.module.split(".")[0])
        return roots & heavy

    found = set()
    for top in (top for path in files for top in ast.parse(path.read_text()).body):
        if isinstance(top, ast.ClassDef):
            found |= {
                (top.name, fn.name, m) for fn in top.body if isinstance(fn, ast.FunctionDef) for m in heavy_imports(fn)
            }
        else:  # module level and module functions: none at all
            assert not heavy_imports(top), (getattr(top, "name", top.lineno), heavy_imports(top))
    assert {(c, f) for c, f, _ in found} <= allowed and {m for *_, m in found} <= {"torch"}, found
    code = "import sys, resdyn.artifacts; print(sorted(m for m in sys.modules if m.split('.')[0] in %r))" % sorted(
        heavy
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
