"""Config validation: defaults, and bad configs stop with a message naming key, value, allowed."""

import copy
from pathlib import Path

import pytest
import yaml

from resdyn.pipeline import config as rc
from resdyn.plots import catalogue as figs

ROOT = Path(__file__).resolve().parent.parent


def _load(name):
    return yaml.safe_load((ROOT / name).read_text())


@pytest.mark.parametrize(
    "name",
    [
        "config.yaml",
        "configs/smoke.yaml",
        "configs/paper-a.yaml",
        "configs/paper-b.yaml",
        "configs/paper-b-extended.yaml",
        "configs/pythia.yaml",
    ],
)
def test_shipped_configs_validate(name, paper_hub_cache, monkeypatch):
    # hub shapes come from config.json: the paper presets validate against stand-in snapshots
    monkeypatch.setenv("HF_HUB_CACHE", str(paper_hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = rc.validate_config(_load(name))
    assert cfg["models"]
    assert all("n_layers" in m and "family" in m for m in cfg["models"].values())


def test_defaults_are_filled():
    cfg = rc.validate_config(
        {
            "datasets": {"e": {"source": "embedded"}},
            "models": {
                "m": {
                    "source": "train",
                    "dataset": "e",
                    "family": "llama",
                    "n_layers": 8,
                    "d_model": 32,
                    "n_heads": 4,
                    "d_ff": 64,
                }
            },
            "jacobian": {"store_first_n": 2},
        }
    )
    assert cfg["samples"] == {"n": 64, "length": 64, "seed": 0}
    assert cfg["models"]["m"]["train"]["checkpoints"] == [0, 300, 600]
    assert cfg["models"]["m"]["train"]["precision"] == "float32"
    assert cfg["phases"]["window"] == 3
    assert cfg["jacobian"]["positions"] == "last"
    assert rc.checkpoints(cfg, "m") == ["step0", "step300", "step600"]


#: What config.yaml sets beyond the schema's defaults: only what the embedded zoo needs (each
#: line is marked "zoo" there); everything else a user leaves out gets the documented value.
ZOO_OVERRIDES = {
    ("threads",),
    ("lens", "checkpoints"),
    ("lens", "lr"),
    ("lens", "tokens_per_step"),
    ("lens", "train_tokens"),
    ("scaling", "groups"),
}


def test_schema_defaults_are_the_documented_defaults():
    raw = rc.read_yaml(ROOT / "config.yaml")
    full = rc.validate_config(copy.deepcopy(raw))
    bare = rc.validate_config({"datasets": copy.deepcopy(raw["datasets"]), "models": copy.deepcopy(raw["models"])})
    differ = set()
    for key in set(full) - {"datasets", "models"}:
        if isinstance(full[key], dict):
            differ |= {(key, k) for k in full[key] if full[key][k] != bare[key].get(k)}
        elif full[key] != bare[key]:
            differ.add((key,))
    assert differ == ZOO_OVERRIDES
    text = (ROOT / "config.yaml").read_text()
    for key in ZOO_OVERRIDES:
        assert any(ln.strip().startswith(f"{key[-1]}:") and "zoo" in ln for ln in text.splitlines()), key
    assert full["models"] == bare["models"]  # zoo models: dtype auto = float32
    assert {m["dtype"] for m in full["models"].values()} == {"float32"}


def test_schema_declares_each_key_once():
    lines = [ln for ln in rc.SCHEMA_PATH.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    rc.read_yaml(rc.SCHEMA_PATH)  # the strict loader refuses a key written twice in one mapping
    assert sum(ln.strip().startswith("readout_dtype:") for ln in lines) == 1


def _bad(mutate):
    cfg = copy.deepcopy(_load("configs/smoke.yaml"))
    mutate(cfg)
    with pytest.raises(rc.ConfigError) as err:
        rc.validate_config(cfg)
    return str(err.value)


def _set(path, value):
    def mutate(cfg):
        node = cfg
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


BAD = [
    # (mutation, substrings the message must contain: key, bad value, what is allowed)
    (_set(["samples", "n"], "many"), ["samples.n", "'many'", "integer"]),
    (_set(["readout", "phase_k_fraction"], 1.5), ["readout.phase_k_fraction", "1.5", "maximum of 1"]),
    (_set(["models", "tiny_llama", "family"], "gpt2"), ["models.tiny_llama.family", "'gpt2'", "llama"]),
    (
        _set(["models", "tiny_llama", "train", "checkpoints"], []),
        ["models.tiny_llama.train.checkpoints", "[]", "non-empty"],
    ),
    (_set(["models", "tiny_llama", "source"], "ftp"), ["models.tiny_llama.source", "'ftp'", "'hf', 'local', 'train'"]),
    (
        _set(
            ["models", "tiny_llama"],
            {"source": "local", "dataset": "kjv", "n_layers": 4, "path": "/nonexistent/folder"},
        ),
        ["models.tiny_llama", "/nonexistent/folder", "config.json"],
    ),
    (
        _set(["models", "tiny_llama"], {"source": "hf", "dataset": "kjv", "n_layers": 4, "repo": "a/b"}),
        ["models.tiny_llama", "revisions", "required"],
    ),
    (_set(["models", "tiny_llama", "dataset"], "nope"), ["models.tiny_llama.dataset", "'nope'", "kjv"]),
    (_set(["models", "tiny_llama", "train", "checkpoints"], [0, 999]), ["train.checkpoints", "999", "train.steps=30"]),
    (_set(["phases", "window"], 4), ["phases.window", "4", "odd"]),
    (_set(["jacobian", "positions"], "first"), ["jacobian.positions", "'first'", "last"]),
    (_set(["jacobian", "store_dtype"], "int8"), ["jacobian.store_dtype", "'int8'", "float32"]),
    (_set(["topology", "fdr_q"], 0), ["topology.fdr_q", "0", "less than or equal to the minimum"]),
    (_set(["models", "tiny_llama", "n_heads"], 5), ["models.tiny_llama.n_heads", "5", "d_model=32"]),
    (_set(["scaling", "groups"], {"llama": ["ghost"]}), ["scaling.groups.llama", "ghost", "tiny_llama"]),
    (_set(["lens", "optimizer"], "lbfgs"), ["lens.optimizer", "'lbfgs'", "adam"]),
    (_set(["bootstrap"], {"complex_tol": 0.05}), ["bootstrap.complex_tol", "0.05", "spectra.complex_tolerances"]),
    (_set(["jacobian", "store_first_n"], 0), ["jacobian.store_first_n", "0", "at least 2"]),
    (_set(["unknown_section"], {}), ["unknown_section", "unknown key"]),
    (_set(["samples", "length"], 1000), ["samples.length", "1000", "max_position"]),
    (
        _set(["datasets", "kjv"], {"source": "text", "paths": ["missing.txt"]}),
        ["datasets.kjv.paths", "missing.txt", "does not exist"],
    ),
    (_set(["studies"], ["A", "C"]), ["studies.1", "'C'", "'A', 'B'"]),
    (_set(["studies"], []), ["studies", "[]", "non-empty"]),
    (
        _set(["models", "tiny_llama", "train", "precision"], "float16"),
        ["models.tiny_llama.train.precision", "'float16'", "'bfloat16'"],
    ),
]


@pytest.mark.parametrize("mutate,expected", BAD, ids=[f"{i}-{x[1][0]}" for i, x in enumerate(BAD)])
def test_bad_config_names_key_value_and_allowed(mutate, expected):
    message = _bad(mutate)
    for part in expected:
        assert part in message, f"{part!r} missing from: {message}"


def test_not_a_mapping():
    with pytest.raises(rc.ConfigError, match="mapping"):
        rc.validate_config(["not", "a", "dict"])


def test_snakemake_stops_before_any_job_on_bad_config(tmp_path):
    import subprocess
    import sys

    cfg = _load("configs/smoke.yaml")
    cfg["samples"]["n"] = -3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), "-n", "--configfile", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "samples.n" in proc.stdout + proc.stderr and "-3" in proc.stdout + proc.stderr


def test_block_names_roundtrip():
    cfg = rc.validate_config(_load("configs/smoke.yaml"))
    blocks = rc.layer_blocks(cfg, "tiny_llama")
    assert blocks == ["layers000-003", "layers004-005"]
    assert sum((rc.block_layers(b) for b in blocks), []) == list(range(6))
    with pytest.raises(ValueError, match="layersAAA-BBB"):
        rc.block_layers("layer3")


def test_key_order_does_not_matter():
    """Snakemake compares params as text: a reordered config must give identical params."""
    a = _load("configs/smoke.yaml")
    b = yaml.safe_load(yaml.safe_dump(copy.deepcopy(a), sort_keys=True))
    b["models"] = dict(reversed(list(b["models"].items())))
    ca, cb = rc.validate_config(a), rc.validate_config(b)
    assert repr(ca) == repr(cb)
    assert repr(rc.checkpoint_spec(ca, "tiny_llama", "step30")) == repr(rc.checkpoint_spec(cb, "tiny_llama", "step30"))


def _seeds(node, path=""):
    """Every (dotted key, value) named seed in a nested config."""
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{path}.{k}" if path else str(k)
            if k == "seed" and not isinstance(v, dict):
                yield key, v
            else:
                yield from _seeds(v, key)


def test_top_level_seed_seeds_every_stage_without_its_own():
    cfg = _load("config.yaml")

    def drop(node):
        if isinstance(node, dict):
            node.pop("seed", None)
            for v in node.values():
                drop(v)

    for section in cfg.values():
        drop(section)
    cfg["seed"] = 7
    cfg["bootstrap"]["seed"] = 3  # an explicit stage seed wins
    out = dict(_seeds(rc.validate_config(cfg)))
    assert out.pop("bootstrap.seed") == 3 and out.pop("seed") == 7
    assert {"samples.seed", "lens.seed", "topology.seed", "causal.seed", "bridge.seed"} <= set(out)
    assert any(k.startswith("datasets.") for k in out) and any(k.endswith("train.seed") for k in out)
    assert set(out.values()) == {7}, out


def test_no_stage_seed_has_a_schema_default():
    def walk(node, path=""):
        if isinstance(node, dict):
            for k, v in node.items():
                p = f"{path}.{k}" if path else k
                if k == "seed" and isinstance(v, dict):
                    yield p, v
                yield from walk(v, p)

    found = dict(walk(rc.load_schema()))
    assert len(found) >= 9
    with_default = [p for p, v in found.items() if "default" in v and p != "properties.seed"]
    assert with_default == [], f"stage seeds must default to the top-level seed, not {with_default}"


def test_one_report_category_per_stage():
    import re

    rules = "".join(p.read_text() for p in (ROOT / "workflow" / "rules").glob("*.smk"))
    used = set(re.findall(r'\bcategory="([^"]+)"', rules))
    used |= {f.category for f in figs.FIGURES}
    assert used == {*figs.CATEGORIES, "Scorecard", "At a glance: the papers"}  # the last sorts first: the paper table


def test_study_switch_defaults_to_both_and_guards_figures():
    cfg = rc.validate_config(_load("configs/smoke.yaml"))
    assert cfg["studies"] == ["A", "B"] and rc.runs(cfg, "A", "B")
    figs.require_studies(cfg, "bridge")  # both run: no error
    only_a = _load("configs/smoke.yaml") | {"studies": ["A"]}
    only_a["jacobian"]["store_first_n"] = 2
    only_a = rc.validate_config(only_a)
    assert rc.runs(only_a, "A") and not rc.runs(only_a, "B") and not rc.runs(only_a, "A", "B")
    figs.require_studies(only_a, "funnel")
    figs.require_studies(only_a, "training")  # needs no study
    for figure in ("rss", "bridge", "phase_widths"):
        with pytest.raises(rc.ConfigError) as err:
            figs.require_studies(only_a, figure)
        message = str(err.value)
        assert "\n" not in message and "'studies'" in message and "['A']" in message and repr(figure) in message
    # Study B alone needs no per-sample Jacobians: the bootstrap's store_first_n check is A's
    only_b = _load("configs/smoke.yaml") | {"studies": ["B"]}
    only_b["jacobian"] = {"store_first_n": 0}
    rc.validate_config(only_b)
    # the figures a study-A-only run draws are exactly those needing A or nothing
    assert {f.name for f in figs.FIGURES if figs.enabled(only_a, f)} == {
        "training",
        "eigenvalues",
        "operator",
        "funnel",
        "schur",
        "communities",
        "coupling",
        "coupling_henrici",
        "checkpoints",
        "significant",
        "partitions",
        "uncertainty",
        "trajectory_a",
    }
