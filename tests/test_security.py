"""What resdyn does with input that another member of a shared cluster (or a careless colleague)
could have planted: resume states that run code, sidecars that would switch the tamper check
off, names that would become shell commands, shapes that would crash or plan nothing, outputs
the group cannot read, and a collect that overwrites what it did not write."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from resdyn import io
from resdyn.lm import hub, zoo
from resdyn.pipeline import config as rc
from resdyn.pipeline import fetch
from resdyn.provenance import sidecars

ROOT = Path(__file__).resolve().parent.parent


# --- deserialisation ----------------------------------------------------------------------------

#: Calls that unpickle (run code from a file) or load YAML with an unsafe loader.
_UNSAFE = [
    (re.compile(r"weights_only\s*=\s*False"), "torch.load(weights_only=False)"),
    (re.compile(r"\bimport pickle\b|\bfrom pickle\b|\bpickle\.loads?\("), "pickle"),
    (re.compile(r"\bcloudpickle\b|\bdill\b"), "pickle"),
    (re.compile(r"allow_pickle\s*=\s*True"), "np.load(allow_pickle=True)"),
    (re.compile(r"yaml\.(unsafe_load|full_load)\(|Loader\s*=\s*yaml\.(Unsafe|Full)?Loader\b"), "unsafe YAML"),
    (re.compile(r"trust_remote_code\s*=\s*True"), "trust_remote_code=True"),
]


def unsafe_loads(source: str) -> list[str]:
    """The unsafe deserialisations in ``source`` (code only: comments and docstrings do not count)."""
    tree = ast.parse(source)
    strings = {n.lineno for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    found = []
    for i, line in enumerate(source.splitlines(), 1):
        code = line.split("#", 1)[0]
        if i in strings:
            continue
        found += [f"line {i}: {what}" for pattern, what in _UNSAFE if pattern.search(code)]
    # torch.load without weights_only=True (its default changed across releases: say it)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "load"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "torch"
        ):
            kw = {k.arg: k.value for k in node.keywords}
            if not (isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True):
                found.append(f"line {node.lineno}: torch.load without weights_only=True")
    return found


def test_no_unsafe_deserialisation_in_the_package_and_the_workflow():
    files = sorted([*(ROOT / "resdyn").rglob("*.py"), *(ROOT / "workflow").rglob("*.py")])
    assert len(files) > 60
    bad = [f"{p.relative_to(ROOT)} {hit}" for p in files for hit in unsafe_loads(p.read_text())]
    assert not bad, "unsafe deserialisation:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nx = torch.load(p, weights_only=False)\n",
        "import torch\nx = torch.load(p)\n",
        "import pickle\n",
        "import numpy as np\nnp.load(p, allow_pickle=True)\n",
        "import yaml\nyaml.load(s, Loader=yaml.Loader)\n",
        "import yaml\nyaml.unsafe_load(s)\n",
        "m = f(p, trust_remote_code=True)\n",
    ],
)
def test_the_scan_sees_each_unsafe_load(source):
    assert unsafe_loads(source)


def test_the_scan_passes_safe_loads():
    assert (
        unsafe_loads(
            'import torch\n"""torch.load(x, weights_only=False) in a docstring"""\n'
            "x = torch.load(p, map_location='cpu', weights_only=True)  # pickle\n"
        )
        == []
    )


class _Planted:
    """An object whose unpickling writes a marker file: what a hostile resume state would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_a_pickled_resume_state_runs_no_code(tmp_path):
    import torch

    marker, state = tmp_path / "marker", tmp_path / "training_state.pt"
    torch.save({"fingerprint": "x", "payload": _Planted(marker)}, state)
    with pytest.raises(ValueError, match=r"training_state\.pt: not a training state resdyn wrote"):
        zoo.load_training_state(state)
    assert not marker.exists()
    state.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="not a training state resdyn wrote"):
        zoo.load_training_state(state)
    genuine = {
        "model": {"w": torch.ones(2)},
        "optimizer": {"state": {}, "param_groups": [{"lr": 0.1}]},
        "step": 3,
        "rows": [{"step": 0, "heldout_loss": float("nan"), "reason": "step 0"}],
        "running": [1.5],
        "fingerprint": "abc",
    }
    torch.save(genuine, state)
    assert zoo.load_training_state(state)["step"] == 3


def test_training_reads_its_resume_state_safely():
    """train_zoo_model (with the module's functions it calls) loads its state through
    load_training_state (the one safe reader)."""
    tree = ast.parse((ROOT / "resdyn" / "lm" / "zoo.py").read_text())
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    calls: set[str] = set()
    todo, seen = ["train_zoo_model"], set()
    while todo:
        name = todo.pop()
        seen.add(name)
        found = {ast.unparse(n.func) for n in ast.walk(defs[name]) if isinstance(n, ast.Call)}
        calls |= found
        todo += [f for f in found if f in defs and f not in seen and f != "load_training_state"]
    assert "load_training_state" in calls and "torch.load" not in calls


# --- the tamper check fails closed --------------------------------------------------------------


def _artifact(tmp_path: Path) -> Path:
    art = tmp_path / "results" / "m" / "layer005.h5"
    art.parent.mkdir(parents=True)
    art.write_bytes(b"made by its rule")
    fp = sidecars.fingerprint(art)
    io.write_json({"rule": "jacobians", "inputs": {}, "artifact": fp}, io.prov_path(art))
    return art


@pytest.mark.parametrize(
    "sidecar",
    [
        "{not json",
        "[1, 2]",
        '"a string"',
        '{"inputs": [1, 2]}',
        '{"artifact": "abc"}',
        '{"rule": "x"}',
        '{"artifact": {"sha256": 5}}',
    ],
)
def test_an_edited_input_with_a_broken_sidecar_stops_the_job(tmp_path, monkeypatch, sidecar):
    monkeypatch.chdir(tmp_path)
    art = _artifact(tmp_path)
    art.write_bytes(b"edited afterwards")
    io.prov_path(art).write_text(sidecar)
    with pytest.raises(sidecars.SidecarError) as err:
        sidecars.check_input(art)
    assert str(io.prov_path(art)) in str(err.value) and "\n" not in str(err.value)


def test_an_input_without_a_sidecar_is_only_fingerprinted(tmp_path):
    src = tmp_path / "corpus.txt"
    src.write_text("text")
    assert sidecars.check_input(src)["sha256"] == io.sha256_file(src)


@pytest.mark.parametrize("sidecar", ["[1, 2]", '{"inputs": [1, 2]}', '{"inputs": {"a": 3}}', '"x"', '{"params": []}'])
def test_verify_and_provenance_report_a_malformed_sidecar_in_one_line(tmp_path, monkeypatch, capsys, sidecar):
    from resdyn import cli

    monkeypatch.chdir(tmp_path)
    art = _artifact(tmp_path)
    io.prov_path(art).write_text(sidecar)
    assert cli.main(["verify", "results"]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("unreadable sidecar: ") and "layer005.h5" in lines[0]
    assert cli.main(["provenance", str(art)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("resdyn provenance: error: sidecar ") and "\n" not in err


def test_a_sidecar_naming_a_folder_above_the_run_is_refused(tmp_path, monkeypatch, capsys):
    from resdyn import cli

    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(run)
    art = _artifact(run)
    for above in ("/", str(tmp_path), ".."):
        io.write_json(
            {"rule": "x", "inputs": {above: "0" * 64}, "artifact": sidecars.fingerprint(art)}, io.prov_path(art)
        )
        assert cli.main(["provenance", str(art)]) == 2
        assert "is a folder above the run folder" in capsys.readouterr().err
    # inputs inside the run and source files outside it stay allowed
    outside = tmp_path / "corpus.txt"
    outside.write_text("source")
    io.write_json(
        {
            "rule": "x",
            "inputs": {str(outside): io.sha256_file(outside), "results/a": None},
            "artifact": sidecars.fingerprint(art),
        },
        io.prov_path(art),
    )
    assert cli.main(["provenance", str(art)]) == 0


# --- values that reach a shell ------------------------------------------------------------------


def _bash_ok(script: str) -> None:
    assert subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True).returncode == 0, script


def test_fetch_output_is_a_script_that_runs_only_its_downloads(tmp_path):
    hostile = "main\ntouch " + str(tmp_path / "pwned") + " ; #"
    downloads = [
        fetch.Download(f"model m @ {hostile}", "org/name", "model", hostile, ("*.json", "a b")),
        fetch.Download("dataset d $(touch x)", "org/data`id`", "dataset", None, ()),
    ]
    script = fetch.render(downloads)
    _bash_ok(script)
    lines = script.splitlines()
    commands = [line for line in lines if not line.startswith("#")]
    assert len(commands) == 1 and commands[0].startswith("hf download ")
    assert shlex.split(commands[0]) == ["hf", "download", "org/data`id`", "--repo-type", "dataset"]
    assert any(line.startswith("# refused: model m @ main\\ntouch ") for line in lines), lines
    spaced = fetch.Download("model m", "org/name", "model", "v1;rm -rf x", ("a b",))
    assert shlex.split(spaced.command()) == [
        "hf",
        "download",
        "org/name",
        "--revision",
        "v1;rm -rf x",
        "--include",
        "a b",
    ]
    # run the script with hf replaced by a stub: nothing but the two stub calls happens
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "hf").write_text('#!/bin/sh\necho called >> "$HF_LOG"\n')
    (tmp_path / "bin" / "hf").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "HF_LOG": str(tmp_path / "log")}
    subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, check=True)
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "x").exists()
    assert (tmp_path / "log").read_text().count("called") == 1


def test_the_download_hint_in_error_messages_is_quoted():
    cmd = hub.download_command("org/name", "a b;touch x")
    assert shlex.split(cmd) == ["hf", "download", "org/name", "--revision", "a b;touch x"]
    assert shlex.split(hub.download_command("org/d", None, "dataset")) == [
        "hf",
        "download",
        "--repo-type",
        "dataset",
        "org/d",
    ]


def _config(**over) -> dict:
    cfg = rc.read_yaml(ROOT / "configs" / "smoke.yaml")
    for path, value in over.items():
        node = cfg
        *parents, last = path.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return cfg


@pytest.mark.parametrize(
    "key, value",
    [
        ("models.tiny\n", None),  # a model name with a trailing newline
        ("datasets.kjv.name", "org/data\nrm -rf ~"),
        ("datasets.kjv.revision", "main; touch x"),
        ("datasets.kjv.split", "train\n"),
    ],
)
def test_names_with_shell_or_newline_characters_are_refused(key, value):
    cfg = _config()
    if value is None:  # rename a model
        name = next(iter(cfg["models"]))
        cfg["models"][key.split(".", 1)[1]] = cfg["models"].pop(name)
        where = "models"
    else:
        ds = cfg["datasets"][next(iter(cfg["datasets"]))]
        ds.update({"source": "hf", "name": "org/data"}) if key.endswith(("revision", "split")) else None
        ds.pop("paths", None), ds.pop("texts", None)
        ds["source"] = "hf"
        ds[key.rsplit(".", 1)[1]] = value
        where = key.rsplit(".", 1)[1]
    with pytest.raises(rc.ConfigError) as err:
        rc.validate_schema(cfg)
    assert where in str(err.value)


def test_a_hub_revision_with_a_newline_is_refused():
    schema = rc.load_schema()
    import jsonschema

    rev = {"$defs": schema["$defs"], **schema["$defs"]["revision"]}
    jsonschema.validate("stage1-step0-tokens0B", rev)
    jsonschema.validate("main", rev)
    for bad in ("main\n", "main\ntouch x", "a b", "$(x)", "-rf"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, rev)


def test_every_name_pattern_anchors_at_the_very_end():
    text = (ROOT / "resdyn" / "schemas" / "config.schema.yaml").read_text()
    patterns = re.findall(r"pattern:\s*['\"]([^'\"]+)['\"]", text)
    assert patterns and all(p.startswith("^") and p.endswith("\\Z") for p in patterns), patterns


# --- shapes from config.json --------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, value",
    [
        ("hidden_size", 0),
        ("num_hidden_layers", -3),
        ("vocab_size", 10**12),
        ("num_attention_heads", 0),
        ("intermediate_size", -1),
        ("head_dim", 0),
        ("num_key_value_heads", 64),
    ],
)
def test_a_bad_shape_in_config_json_names_the_file_key_value_and_range(key, value):
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
        "max_position_embeddings": 64,
        key: value,
    }
    with pytest.raises(hub.HubError) as err:
        hub.architecture(cfg, source="/models/x/config.json")
    msg = str(err.value)
    assert msg.startswith("/models/x/config.json: key ") and f"'{key}' = {value}" in msg and "allowed" in msg
    assert "\n" not in msg


# --- outputs follow the umask -------------------------------------------------------------------


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_atomic_outputs_get_the_users_umask(tmp_path, mask, file_mode, dir_mode):
    old = os.umask(mask)
    try:
        with io.atomic_path(tmp_path / "a.tsv") as tmp:
            tmp.write_text("x")
        io.write_json({"a": 1}, tmp_path / "b.json")
        folder = tmp_path / ".staging"
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "f").write_text("y")
        os.chmod(folder, 0o700)
        io.publish_modes(folder)
    finally:
        os.umask(old)
    assert (tmp_path / "a.tsv").stat().st_mode & 0o777 == file_mode
    assert (tmp_path / "b.json").stat().st_mode & 0o777 == file_mode
    assert folder.stat().st_mode & 0o777 == dir_mode and (folder / "sub" / "f").stat().st_mode & 0o777 == file_mode


# --- resdyn collect -o DIR ----------------------------------------------------------------------


def _collected(tmp_path):
    import pandas as pd

    from resdyn import results

    run = tmp_path / "run" / "results"
    run.mkdir(parents=True)
    return results, results.Collected(run=run, tables={"spectra": pd.DataFrame({"a": [1]})})


def test_collect_refuses_the_results_tree_and_files_it_did_not_write(tmp_path):
    results, got = _collected(tmp_path)
    for inside in (got.run, got.run / "collected"):
        with pytest.raises(results.CollectRefused, match="inside the results tree"):
            results.write_collected(got, inside)
    assert not (got.run / "collected").exists()
    out = tmp_path / "out"
    out.mkdir()
    (out / "spectra.parquet").write_text("someone's file")
    with pytest.raises(results.CollectRefused, match=r"spectra\.parquet, which no resdyn collect wrote"):
        results.write_collected(got, out)
    assert (out / "spectra.parquet").read_text() == "someone's file"
    results.write_collected(got, out, force=True)
    assert json.loads((out / "catalog.json").read_text())["tables"].keys() == {"spectra"}
    results.write_collected(got, out)  # its own files: rewritten without --force


# --- sbatch extra flags -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        "--exclude=n01 ; touch X ; #",
        "--exclude=n01 $(touch X)",
        "--exclude=`touch X`",
        "--exclude=n01 && touch X",
        "--exclude n01",
        "--mail-user='a b'",
        "--begin=now|x",
        "--exclude=n01\ntouch X",
    ],
)
def test_an_extra_flag_that_would_reach_the_shell_is_refused(monkeypatch, flags):
    from resdyn.cluster import site

    for var in [v for v in os.environ if v.startswith("RESDYN_SLURM_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("RESDYN_SLURM_EXTRA", flags)
    with pytest.raises(ValueError) as err:
        site.set_resources()
    assert str(err.value).startswith("RESDYN_SLURM_EXTRA=") and "\n" not in str(err.value)


def test_the_plugins_sbatch_call_with_resdyns_extra_flags_runs_only_sbatch(tmp_path, monkeypatch):
    """The SLURM plugin appends slurm_extra unquoted to the sbatch command it runs with a shell: the
    flags resdyn passes on are quoted words, so the command is sbatch and nothing else."""
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.submit_string import get_submit_command

    from resdyn.cluster import site

    extra = site.check_extra("--nodelist=n[01-04] --signal=B:USR1@60 --mail-type=END,FAIL", "RESDYN_SLURM_EXTRA")
    (tmp_path / "n0").write_text("a file the unquoted glob n[01-04] would match")
    resources = SimpleNamespace(get=lambda k, d=None: {"slurm_extra": extra}.get(k, d), slurm_extra=extra)
    job = SimpleNamespace(resources=resources, is_group=lambda: False, threads=1, name="r", wildcards={})
    params = {
        "run_uuid": "u",
        "slurm_logfile": "l",
        "comment_str": "c",
        "account": "",
        "partition": "",
        "workdir": str(tmp_path),
    }
    try:
        call = get_submit_command(job, params)
    except Exception as err:  # the plugin's job interface differs between releases
        pytest.skip(f"the plugin's get_submit_command needs more of the job interface: {err}")
    assert extra in call
    (tmp_path / "bin").mkdir()
    stub = tmp_path / "bin" / "sbatch"
    stub.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done > "$ARGS_OUT"\n')
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "ARGS_OUT": str(tmp_path / "args")}
    subprocess.run(["bash", "-c", call], cwd=tmp_path, env=env, check=True)
    args = (tmp_path / "args").read_text().splitlines()
    assert "--nodelist=n[01-04]" in args and "--signal=B:USR1@60" in args and "--mail-type=END,FAIL" in args


# --- a ceiling for every job --------------------------------------------------------------------


def test_a_zoo_model_no_site_can_hold_is_refused_with_its_numbers(monkeypatch):
    from resdyn.cluster import multigpu
    from resdyn.pipeline import dag

    cfg = rc.load_config(ROOT / "config.yaml")
    dag.check_fits(cfg)  # the default run fits
    name = next(iter(cfg["models"]))
    cfg["models"] = {
        name: {
            **cfg["models"][name],
            "n_layers": 512,
            "d_model": 65536,
            "n_heads": 512,
            "n_kv_heads": 512,
            "d_ff": 4 * 65536,
        }
    }
    cfg = rc.validate_config({**cfg, "device": "cpu", "scaling": {}})  # on a CPU no GPU kind can refuse it
    with pytest.raises(multigpu.FitError) as err:
        dag.check_fits(cfg)
    msg = str(err.value)
    assert re.match(
        r"^job \w+ .*: asks for [\d,]+ GB of host memory and [\d,.]+ h; a job may ask for at most "
        r"1,000 GB and 168 h",
        msg,
    ), msg
    monkeypatch.setenv("RESDYN_MAX_JOB_MEMORY_GB", "not a number")
    with pytest.raises(ValueError, match="RESDYN_MAX_JOB_MEMORY_GB='not a number': expected a positive number"):
        dag.check_fits(cfg)


def test_a_lens_step_of_a_trillion_tokens_is_refused(monkeypatch):
    from resdyn.cluster import multigpu
    from resdyn.pipeline import dag

    cfg = rc.read_yaml(ROOT / "config.yaml")
    # reused blocks (train_tokens 0), so that the fits check, not the fresh-token budget, refuses it
    cfg["lens"] = {**cfg.get("lens", {}), "tokens_per_step": 10**12, "train_tokens": 0}
    cfg = rc.validate_config({**cfg, "device": "cpu"})
    with pytest.raises(multigpu.FitError, match=r"^job lens .*a job may ask for at most"):
        dag.check_fits(cfg)


# --- checkpoints transformers refuses -----------------------------------------------------------


@pytest.mark.parametrize("weights", ["pickled", "bad_header"])
def test_a_refused_checkpoint_is_one_line_naming_it(tmp_path, weights):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from resdyn.lm import models

    folder = tmp_path / "m"
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    model.save_pretrained(folder)
    (folder / "model.safetensors").unlink()
    if weights == "pickled":  # an old-style .bin whose unpickling would run code
        torch.save({"x": _Planted(tmp_path / "marker")}, folder / "pytorch_model.bin")
    else:
        (folder / "model.safetensors").write_bytes(b"\xff" * 64)
    record = {"model": "m", "checkpoint": "step0", "folder": str(folder), "content_hash": None}
    with pytest.raises(RuntimeError) as err:
        models.load_model(record, device="cpu", verify_hash=False)
    msg = str(err.value)
    assert msg.startswith(f"cannot load checkpoint m/step0 from {folder}: ") and "\n" not in msg, msg
    assert not (tmp_path / "marker").exists()
