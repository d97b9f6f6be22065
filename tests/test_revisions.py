"""Revisions by training step: `resdyn revisions`, `steps:` lists resolved to branch names (cache
offline, hub refs online), bad steps stopping with one line, and the presets' names."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from resdyn import cli
from resdyn.lm import hub, revisions
from resdyn.pipeline import config as rc

from helpers import hubcache

ROOT = Path(__file__).resolve().parent.parent
OLMO, PYTHIA = "org/olmo-style", "org/pythia-style"


@pytest.fixture(scope="module")
def user_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("user-hf")
    hubcache.build_user(home)
    return home


@pytest.fixture
def offline(user_home, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(user_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return user_home


@pytest.mark.parametrize(
    "name, expected",
    [
        ("stage1-step471000-tokens1976B", ("stage1-step471000-tokens1976B", 1, 471000, "1976B")),
        ("stage2-ingredient1-step1000-tokens5B", ("stage2-ingredient1-step1000-tokens5B", 2, 1000, "5B")),
        ("step143000", ("step143000", 0, 143000, None)),
        ("main", ("main", None, None, None)),
    ],
)
def test_revision_parse(name, expected):
    r = revisions.Revision.parse(name)
    assert (r.name, r.stage, r.step, r.tokens) == expected
    assert revisions.Revision.parse("v1.0") is None


def test_revisions_lists_cached_branches_in_training_order(offline, capsys):
    assert cli.main(["revisions", PYTHIA]) == 0
    out, err = capsys.readouterr()
    rows = [ln.split("\t") for ln in out.splitlines()]
    assert rows[0] == ["step", "tokens", "name"]
    # alphabetical would put step143000 before step8000: the order is by step, main last
    assert [r[2] for r in rows[1:]] == ["step0", "step1000", "step8000", "step143000", "main"]
    assert [r[0] for r in rows[1:]] == ["0", "1000", "8000", "143000", ""]
    assert "4 training revisions of org/pythia-style, from the cache" in err
    assert cli.main(["revisions", OLMO]) == 0
    rows = [ln.split("\t") for ln in capsys.readouterr()[0].splitlines()[1:]]
    assert rows == [
        ["0", "0B", "stage1-step0-tokens0B"],
        ["1000", "5B", "stage1-step1000-tokens5B"],
        ["1000", "5B", "stage2-ingredient1-step1000-tokens5B"],
        ["", "", "main"],
    ]


def test_revisions_every_and_steps(offline, capsys):
    assert cli.main(["revisions", PYTHIA, "--every", "2000"]) == 0
    assert [ln.split("\t")[2] for ln in capsys.readouterr()[0].splitlines()[1:]] == ["step0", "step8000", "main"]
    assert cli.main(["revisions", PYTHIA, "--steps", "0", "143000", "final"]) == 0
    assert capsys.readouterr()[0].splitlines() == ["0\tstep0", "143000\tstep143000", "final\tmain"]


@pytest.mark.parametrize(
    "args, words",
    [
        (
            [OLMO, "--steps", "1000"],
            ["step 1000 is ambiguous", "stage1-step1000-tokens5B", "stage2-ingredient1-step1000-tokens5B"],
        ),
        ([PYTHIA, "--steps", "5000"], ["step 5000 has no branch", "nearest", "step1000", "step8000"]),
        ([PYTHIA, "--steps", "five"], ["step 'five'"]),
        (["org/unknown"], ["'org/unknown'", "no branches known", "HF_HUB_OFFLINE=1"]),
    ],
)
def test_bad_steps_give_one_line(offline, capsys, args, words):
    assert cli.main(["revisions", *args]) == 2
    err = capsys.readouterr()[1].strip()
    assert len(err.splitlines()) == 1 and err.startswith("resdyn revisions: error:"), err
    assert all(w in err for w in words), err


def test_online_branches_come_from_the_hub_refs(offline, monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    names = ["main", "stage1-step2000-tokens9B", "stage1-step0-tokens0B"]
    calls = []

    def list_repo_refs(self, repo, repo_type="model"):
        calls.append((repo, repo_type))
        return SimpleNamespace(branches=[SimpleNamespace(name=n) for n in names], tags=[])

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_refs", list_repo_refs)
    assert revisions.branches("allenai/x") == (sorted(names), "the hub")
    assert calls == [("allenai/x", "model")]

    def unreachable(self, repo, repo_type="model"):
        raise ConnectionError("no network")

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_refs", unreachable)
    names_cached, where = revisions.branches(PYTHIA)  # falls back to the cache
    assert "step8000" in names_cached and where.startswith("the cache")
    with pytest.raises(hub.HubError, match="ConnectionError: no network"):
        revisions.branches("org/unknown")


def _config(**olmo) -> dict:
    return {
        "datasets": {
            "wiki": {"source": "hf", "name": hubcache.DATASET, "config": hubcache.DATASET_CONFIG, "split": "test"}
        },
        "models": {
            "olmo": {"source": "hf", "repo": OLMO, "dataset": "wiki", **olmo},
            "pythia": {"source": "hf", "repo": PYTHIA, "dataset": "wiki", "steps": [0, 8000, "final"]},
        },
        "samples": {"n": 4, "length": 16},
    }


def test_config_steps_resolve_to_branch_names(offline):
    cfg = rc.validate_config(_config(revisions=[0, "stage2-ingredient1-step1000-tokens5B", "final"]))
    assert (
        cfg["models"]["pythia"]["revisions"] == ["step0", "step8000", "main"] and "steps" not in cfg["models"]["pythia"]
    )
    assert rc.checkpoints(cfg, "pythia") == ["step0", "step8000", "main"]
    assert rc.checkpoints(cfg, "olmo") == ["stage1-step0-tokens0B", "stage2-ingredient1-step1000-tokens5B", "main"]
    spec = rc.checkpoint_spec(cfg, "olmo", "stage1-step0-tokens0B")
    assert spec["revision"] == "stage1-step0-tokens0B" and spec["dtype"] == "float32"  # config.json's dtype
    assert rc.validate_config(cfg) == cfg  # validating again changes nothing


@pytest.mark.parametrize(
    "olmo, words",
    [
        (
            {"steps": [0, 1000]},
            [
                "models.olmo.revisions",
                "'olmo'",
                "step 1000 is ambiguous",
                "stage1-step1000-tokens5B",
                "stage2-ingredient1-step1000-tokens5B",
            ],
        ),
        ({"steps": [0, 3]}, ["models.olmo.revisions", "step 3 has no branch", "nearest"]),
        ({"steps": [0], "revisions": ["main"]}, ["models.olmo.revisions", "not both"]),
        ({"steps": [1000, 0]}, ["models.olmo.revisions", "ambiguous"]),
        ({"revisions": [1000, "main"], "repo": "org/final-only"}, ["no training revisions", "branches: main"]),
    ],
)
def test_bad_steps_stop_validation_with_one_line(offline, tmp_path, monkeypatch, olmo, words):
    if olmo.get("repo") == "org/final-only":
        hubcache.write_config_only(Path(offline) / "hub", "org/final-only", "main", {"model_type": "llama"})
    with pytest.raises(rc.ConfigError) as err:
        rc.validate_config(_config(**olmo))
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines


# --- the presets' revision names follow the hub's naming rules --------------------------------------

#: how each organisation names its training branches on the hub (main: the final model)
NAMING_RULES = {
    "allenai/": re.compile(r"stage\d+(-[a-z]+\d+)?-step\d+-tokens\d+B|main"),  # OLMo 2 / OLMo 3
    "EleutherAI/pythia-": re.compile(r"step\d+|main"),
}


@pytest.mark.parametrize("preset", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")) + ["config.yaml"])
def test_preset_revisions_follow_the_hub_naming_rules(preset):
    path = ROOT / ("config.yaml" if preset == "config.yaml" else f"configs/{preset}")
    for key, m in yaml.safe_load(path.read_text())["models"].items():
        if m.get("source") != "hf" or m["repo"].startswith("resdyn-ci/"):  # the CI's own stand-ins
            continue
        for rev in m.get("revisions", []):
            if isinstance(rev, int):
                continue  # a training step: resolved from the refs
            rule = next((r for org, r in NAMING_RULES.items() if m["repo"].startswith(org)), re.compile("main"))
            assert rule.fullmatch(rev), f"{preset}: {key} revision {rev!r} is not a branch name of {m['repo']}"
        assert all(
            isinstance(s, int) or s == "final" for s in (m.get("steps") if isinstance(m.get("steps"), list) else [])
        )


# --- resdyn fetch CONFIG --------------------------------------------------------------------------

INCLUDE = (
    "--include config.json --include 'tokenizer*' --include 'vocab*' --include merges.txt "
    "--include special_tokens_map.json --include '*.model'"
)


def _fetch(capsys, cfg: dict, tmp_path, *extra) -> tuple[int, list[str], str]:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    rc_ = cli.main(["fetch", str(path), *extra])
    out, err = capsys.readouterr()
    return rc_, out.splitlines(), err


def test_fetch_prints_exactly_the_missing_downloads(offline, capsys, tmp_path):
    cfg = _config(revisions=[0, "main"])
    code, lines, _ = _fetch(capsys, cfg, tmp_path)
    assert code == 0
    assert [ln for ln in lines if not ln.startswith("#")] == []  # everything is cached
    assert "# cached already: model pythia @ step8000 (org/pythia-style@step8000)" in lines
    assert "# cached already: dataset wiki (resdyn-ci/wikitext-mini)" in lines
    cfg["models"]["absent"] = {"source": "hf", "repo": "org/absent", "revisions": ["main"], "dataset": "wiki"}
    cfg["datasets"]["wt2"] = {"source": "hf", "name": "Salesforce/wikitext", "config": "wikitext-2-raw-v1"}
    cfg["lens"] = {"source": "tuned_lens", "repo": "org/lenses", "path": "lens/{repo}"}
    code, lines, _ = _fetch(capsys, cfg, tmp_path)
    assert code == 0
    assert [ln for ln in lines if not ln.startswith("#")] == [
        f"hf download org/absent --revision main {INCLUDE} --include '*.safetensors' "
        "--include '*.safetensors.index.json'",
        "hf download Salesforce/wikitext --repo-type dataset --include 'wikitext-2-raw-v1/*' --include README.md",
        "hf download org/lenses --repo-type space --include lens/org/absent/config.json "
        "--include lens/org/absent/params.pt "
        "--include lens/org/olmo-style/config.json --include lens/org/olmo-style/params.pt "
        "--include lens/org/pythia-style/config.json --include lens/org/pythia-style/params.pt",
    ]
    assert lines[-1].startswith("# 3 download(s), size unknown")


def test_fetch_sizes_online_and_bin_only_revisions(offline, capsys, tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    trees = {
        ("org/new", "step0"): {
            "config.json": 700,
            "pytorch_model.bin": 5_000,
            "tokenizer.json": 300,
            "README.md": 99,
            "flax_model.msgpack": 7_000,
        },
        ("org/new", "main"): {
            "config.json": 700,
            "model-00001-of-00002.safetensors": 2_000_000,
            "model-00002-of-00002.safetensors": 1_000_000,
            "model.safetensors.index.json": 50,
            "pytorch_model.bin": 3_000_000,
            "tokenizer.json": 300,
        },
    }

    def list_repo_tree(self, repo, revision=None, repo_type="model", recursive=False):
        return [SimpleNamespace(path=p, size=n) for p, n in trees[(repo, revision)].items()]

    def list_repo_refs(self, repo, repo_type="model"):
        return SimpleNamespace(branches=[SimpleNamespace(name=n) for n in ("main", "step0")])

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_tree", list_repo_tree)
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_refs", list_repo_refs)
    cfg = _config(revisions=[0, "main"])
    cfg["models"] = {"new": {"source": "hf", "repo": "org/new", "steps": [0, "final"], "dataset": "wiki"}}
    code, lines, _ = _fetch(capsys, cfg, tmp_path)
    assert code == 0
    assert lines[lines.index("# model new @ step0: 6.0 KB") + 1] == (
        f"hf download org/new --revision step0 {INCLUDE} --include '*.bin' --include '*.bin.index.json'"
    )
    assert lines[lines.index("# model new @ main: 3.0 MB") + 1].endswith("--include '*.safetensors.index.json'")
    assert lines[-1].startswith("# 2 download(s), 3.0 MB;")


def test_fetch_run_and_an_unresolvable_model(offline, capsys, tmp_path, monkeypatch):
    import subprocess

    ran = []
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: ran.append(args) or SimpleNamespace(returncode=0))
    cfg = _config(steps=[0, 3])  # step 3 has no branch: the rest is still fetched, the exit code says 1
    cfg["models"]["absent"] = {"source": "hf", "repo": "org/absent", "revisions": ["main"], "dataset": "wiki"}
    code, lines, err = _fetch(capsys, cfg, tmp_path, "--run")
    assert code == 1 and ran == [
        [
            "hf",
            "download",
            "org/absent",
            "--revision",
            "main",
            *[a.strip("'") for a in INCLUDE.split()],
            "--include",
            "*.safetensors",
            "--include",
            "*.safetensors.index.json",
        ]
    ]
    assert "resdyn fetch: error: model olmo: model 'olmo' (org/olmo-style): step 3 has no branch" in err


# --- hub ids: presets and docs agree with one table (docs/hub.md) ---------------------------------

_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*"


def _id_table() -> set[str]:
    text = (ROOT / "docs" / "hub.md").read_text().split("## Hub ids of the presets and docs", 1)[1].split("\n## ", 1)[0]
    return {
        i for row in text.splitlines() if row.startswith("| `") for i in re.findall(rf"`({_ID})`", row.split("|")[1])
    }


def _preset_ids() -> dict[str, str]:
    out = {}
    for path in [ROOT / "config.yaml", *sorted((ROOT / "configs").glob("*.yaml"))]:
        cfg = yaml.safe_load(path.read_text())
        ids = [m["repo"] for m in cfg["models"].values() if m.get("source") == "hf"]
        ids += [d["name"] for d in cfg["datasets"].values() if d.get("source") == "hf" and "name" in d]
        ids += [cfg["lens"]["repo"]] if cfg.get("lens", {}).get("repo") else []
        out.update({i: path.name for i in ids if not i.startswith("resdyn-ci/")})  # the CI's stand-ins
    return out


def _doc_ids() -> dict[str, str]:
    """Ids in `hf download` commands and in `repo:` / `name:` keys of the docs, README and config comments."""
    out = {}
    files = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "config.yaml",
        *sorted((ROOT / "configs").glob("*.yaml")),
    ]
    for path in files:
        for line in path.read_text().splitlines():
            for m in re.finditer(rf"hf download(?: --repo-type \w+)? ({_ID})|\b(?:repo|name): ({_ID})", line):
                ident = m[1] or m[2]
                if not ident.startswith(("resdyn-ci/", "org/")):
                    out[ident] = path.name
    return out


def test_hub_ids_in_presets_and_docs_are_in_one_table():
    table = _id_table()
    assert "Salesforce/wikitext" in table and "allenai/Olmo-3-1025-7B" in table
    for ident, where in {**_preset_ids(), **_doc_ids()}.items():
        assert ident in table, f"{where}: hub id {ident!r} is not in docs/hub.md 'Hub ids of the presets and docs'"
    assert set(_preset_ids()) <= table and table <= set(_preset_ids()) | set(_doc_ids())  # no stale row


def test_wikitext_is_the_salesforce_id_with_its_config_everywhere():
    for path in [ROOT / "config.yaml", *sorted((ROOT / "configs").glob("*.yaml"))]:
        text = path.read_text()
        assert not re.search(r"name: wikitext\b", text), f"{path.name}: WikiText is Salesforce/wikitext on the hub"
        for ds in (yaml.safe_load(text)["datasets"] or {}).values():
            if ds.get("name") == "Salesforce/wikitext":
                assert ds["config"] == "wikitext-2-raw-v1", path.name


def test_steps_in_the_cache_resolve_without_the_network(offline, monkeypatch):
    """Every Snakemake start validates (each cluster job too): steps the cache resolves never ask
    the hub; a step it cannot resolve does (online)."""
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    asked = []

    def list_repo_refs(self, repo, repo_type="model"):
        asked.append(repo)
        return SimpleNamespace(branches=[SimpleNamespace(name=n) for n in ("main", "step0", "step8000", "step9000")])

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_refs", list_repo_refs)
    entry = {"source": "hf", "repo": PYTHIA, "steps": [0, 8000, "final"]}
    revisions.resolve_model("p", entry)
    assert entry["revisions"] == ["step0", "step8000", "main"] and asked == []
    entry = {"source": "hf", "repo": PYTHIA, "steps": [0, 9000]}  # step 9000 is not downloaded yet
    revisions.resolve_model("p", entry)
    assert entry["revisions"] == ["step0", "step9000"] and asked == [PYTHIA]
