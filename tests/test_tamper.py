"""Tampers with a finished run are caught; bad run-time inputs stop cleanly (see tests/helpers/tamper.py).

One finished run (local model + text corpus, smoke sizes) per session; every case works on a
fresh copy of it. A tamper must be flagged by `resdyn verify` with the expected kind and file,
and/or scheduled for rebuild by a Snakemake dry run. A bad run-time input must fail its job with
one line naming the file or model, and leave the job's outputs absent.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from helpers import tamper as T

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def finished(tmp_path_factory, code_cache_seed) -> Path:
    start = time.perf_counter()
    work = T.build(tmp_path_factory.mktemp("tamper") / "finished", code_cache=code_cache_seed)
    print(f"\ntamper run built in {time.perf_counter() - start:.0f} s")
    return work


@pytest.fixture
def work(finished, tmp_path) -> Path:
    return T.fresh_copy(finished, tmp_path / "wf")


def test_untampered_run_verifies_clean_and_is_up_to_date(work):
    proc = T.verify(work)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "0 problem(s)" in proc.stderr
    assert T.planned_rules(work) == set()


def test_there_are_at_least_twelve_distinct_tampers():
    assert len({t.name for t in T.TAMPERS}) >= 12


@pytest.mark.parametrize("tamper", T.TAMPERS, ids=[t.name for t in T.TAMPERS])
def test_tamper_is_caught(tamper, work):
    result = T.check(tamper, work)
    assert tamper.verify or tamper.rebuild
    if tamper.verify:
        assert result["verify_rc"] == 1, result["verify_lines"]
        assert result["verify"], (tamper.verify, result["verify_lines"])
        # every line says what to do
        assert all(" — " in ln for ln in result["verify_lines"])
    if tamper.rebuild is not None:
        assert result["snakemake"], (tamper.rebuild, result["planned"])


def test_provenance_chain_reaches_the_sources(work):
    """`resdyn provenance` walks to the corpus text and the local model files (not one step short)."""
    fig = f"results/figures/{T.MODEL}/{T.CKPT}/funnel.png"
    proc = T.run(work, str(T.BIN / "resdyn"), "provenance", fig)
    assert proc.returncode == 0, proc.stderr
    for rule in ("figure_ckpt", "spectra", "jacobians", "resolve_checkpoint", "samples", "corpus"):
        assert f"rule {rule} " in proc.stdout, rule
    assert "corpus/part0.txt\n  source (no provenance of its own): sha256" in proc.stdout
    assert "local/m/model.safetensors\n  source" in proc.stdout


def test_corrupt_jacobian_stops_the_next_job_with_the_file_named(work):
    T.TAMPERS[0].apply(work)  # flipped value in jacobians/layers000-001/layer000.h5
    proc = T.snakemake(work, "--cores", "1", "--forcerun", "spectra", f"{T.R}/spectra.tsv")
    assert proc.returncode != 0
    _one_line(work, proc, "differs from what its rule wrote (changed layer000.h5)")
    assert not (work / T.R / "spectra.tsv").exists()


# --- bad run-time inputs ------------------------------------------------------------------------


def _one_line(work: Path, proc, text: str) -> str:
    """The single line (in Snakemake's output or a rule log) that carries ``text``."""
    logs = "\n".join(p.read_text(errors="replace") for p in (work / "logs").rglob("*.log"))
    lines = {ln.strip() for ln in (proc.stdout + proc.stderr + logs).splitlines() if text in ln}
    assert lines, f"{text!r} not found:\n{proc.stderr[-3000:]}"
    line = min(lines, key=len)
    assert len(line) < 600, line
    return line


def _set_weight(work: Path, name_part: str, value: float) -> None:
    from safetensors.torch import load_file, save_file

    path = work / "local" / "m" / "model.safetensors"
    tensors = load_file(str(path))
    key = next(k for k in sorted(tensors) if name_part in k)
    tensors[key][0, 0] = value
    save_file(tensors, str(path), metadata={"format": "pt"})


def _no_leftovers(folder: Path, name: str) -> None:
    assert not (folder / name).exists(), folder / name
    assert not [p for p in folder.glob(f".{name}.*") if "staging" not in p.name], list(folder.iterdir())


def test_nan_weight_stops_lens_and_activations(work):
    _set_weight(work, "layers.1.mlp.down_proj", float("nan"))
    targets = [f"{T.R}/lens", f"{T.R}/activations"]  # (the Jacobian engine had its guard already)
    proc = T.snakemake(work, "--cores", "1", "--keep-going", *targets)
    assert proc.returncode != 0
    line = _one_line(work, proc, "non-finite held-out residual state")
    assert f"model '{T.MODEL}'" in line and "layer 2" in line and "lens step 0" in line
    line = _one_line(work, proc, "non-finite residual state (NaN/Inf) at layer")
    assert f"model {T.MODEL} checkpoint {T.CKPT}" in line
    _one_line(work, proc, "non-finite")
    for t in targets:
        _no_leftovers((work / t).parent, Path(t).name)


def test_corrupt_weights_get_no_checkpoint_record(work):
    path = work / "local" / "m" / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    proc = T.snakemake(work, "--cores", "1", f"models/{T.MODEL}/{T.CKPT}/checkpoint.json")
    assert proc.returncode != 0
    _one_line(work, proc, "model.safetensors is not a readable safetensors file")
    _no_leftovers(work / "models" / T.MODEL / T.CKPT, "checkpoint.json")


def test_missing_weights_get_no_checkpoint_record(work):
    (work / "local" / "m" / "model.safetensors").unlink()
    proc = T.snakemake(work, "--cores", "1", f"models/{T.MODEL}/{T.CKPT}/checkpoint.json")
    assert proc.returncode != 0
    _one_line(work, proc, "no weight files in")
    _no_leftovers(work / "models" / T.MODEL / T.CKPT, "checkpoint.json")


def test_invalid_config_json_does_not_stick(work):
    """A broken config.json stops before any job (it is read when the config is validated; and
    resolve_checkpoint refuses it too, see test_models); the record made from the good folder is
    left as it was, and once the folder is fixed the record is redone (its inputs are newer)."""
    cfg_path = work / "local" / "m" / "config.json"
    record = work / "models" / T.MODEL / T.CKPT / "checkpoint.json"
    before = record.read_bytes()
    good = cfg_path.read_text()
    cfg_path.write_text(good[: len(good) // 2])
    proc = T.snakemake(work, "--cores", "1", f"models/{T.MODEL}/{T.CKPT}/checkpoint.json")
    assert proc.returncode != 0
    line = _one_line(work, proc, "config.json: not a readable config.json")
    assert "local/m/config.json" in line
    assert record.read_bytes() == before
    assert not [p for p in record.parent.glob(".checkpoint.json.*")]
    cfg_path.write_text(good)  # restored as it was: the record still describes it
    assert T.verify(work).returncode == 0
    fixed = good.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-05')
    assert fixed != good
    cfg_path.write_text(fixed)  # fixed differently: the record is redone
    assert "resolve_checkpoint" in T.planned_rules(work)


def test_invalid_tokenizer_json_gets_no_checkpoint_record(work):
    path = work / "local" / "m" / "tokenizer.json"
    path.write_text(path.read_text()[:100])
    proc = T.snakemake(work, "--cores", "1", f"models/{T.MODEL}/{T.CKPT}/checkpoint.json")
    assert proc.returncode != 0
    _one_line(work, proc, "tokenizer.json is not valid JSON")
    _no_leftovers(work / "models" / T.MODEL / T.CKPT, "checkpoint.json")


def test_empty_corpus_names_dataset_and_files(work):
    for p in (work / "corpus").glob("*.txt"):
        p.write_text("\n")
    proc = T.snakemake(work, "--cores", "1", "results/data/txt/train.jsonl")
    assert proc.returncode != 0
    line = _one_line(work, proc, "gave 0 non-empty document(s)")
    assert "dataset 'txt'" in line and "corpus/part0.txt" in line
    _no_leftovers(work / "results" / "data" / "txt", "train.jsonl")
    _no_leftovers(work / "results" / "data" / "txt", "heldout.jsonl")


def test_non_utf8_corpus_names_the_file(work):
    (work / "corpus" / "part1.txt").write_bytes(b"caf\xe9 au lait\n\nsecond\n")
    proc = T.snakemake(work, "--cores", "1", "results/data/txt/train.jsonl")
    assert proc.returncode != 0
    _one_line(work, proc, "corpus/part1.txt: not UTF-8")
    _no_leftovers(work / "results" / "data" / "txt", "train.jsonl")


def test_more_samples_than_the_corpus_holds(work):
    cfg = yaml.safe_load((work / T.CONFIG).read_text())
    cfg["samples"]["n"] = 99999  # 3 groups of 33,333 (jacobian.n_groups)
    (work / "configs" / "big.yaml").write_text(yaml.safe_dump(cfg))
    proc = T.snakemake(work, "--cores", "1", f"results/{T.MODEL}/samples.h5", config="configs/big.yaml")
    assert proc.returncode != 0
    line = _one_line(work, proc, "asked for 99999 samples")
    assert "dataset 'txt'" in line and "lower samples.n (at most" in line
    _no_leftovers(work / "results" / T.MODEL, "samples.h5")


def test_corrupt_lens_translator_stops_readers(work):
    """NaN written into a fitted lens: the next reader (rss) stops naming the lens folder's file."""
    lens_dir = work / T.R / "lens"
    target = next(p for p in sorted(lens_dir.iterdir()) if p.suffix in (".pt", ".safetensors", ".npy", ".h5"))
    data = bytearray(target.read_bytes())
    data[-8:] = np.array([np.nan], dtype=np.float64).tobytes()
    target.write_bytes(bytes(data))
    proc = T.snakemake(work, "--cores", "1", "--forcerun", "rss", f"{T.R}/rss.tsv")
    assert proc.returncode != 0
    _one_line(work, proc, f"differs from what its rule wrote (changed {target.name})")
    _no_leftovers(work / T.R, "rss.tsv")
