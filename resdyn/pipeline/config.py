"""Configuration: schema validation with defaults, semantic checks, and the DAG's lookups.

``validate_config`` is called by the Snakefile before any rule exists, by ``resdyn plan`` and by
the tests. Errors are collected and raised together as one :class:`ConfigError` whose lines each
name the key, the bad value and what is allowed.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from resdyn import io
from resdyn.cluster import gpu_kinds
from resdyn.lm import corpus, hub, revisions

# Package data, so that an installed (non-editable) resdyn validates configs too.
SCHEMA_PATH = io.CONFIG_SCHEMA_PATH


class ConfigError(ValueError):
    """A configuration that cannot run; the message lists every problem found."""


def load_schema() -> dict:
    """The JSON Schema of the configuration (resdyn/schemas/config.schema.yaml), the model
    family list filled from the family table (:data:`resdyn.lm.families.FAMILIES`) plus
    ``generic`` (any standard decoder layer, :mod:`resdyn.lm.generic`)."""
    from resdyn.lm.families import FAMILIES

    schema = io.read_config_schema()
    schema["$defs"]["model"]["properties"]["family"]["enum"] = [*FAMILIES, "generic"]  # generic: resdyn.lm.generic
    return schema


def _with_defaults(validator_class):
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_Validator = _with_defaults(jsonschema.Draft202012Validator)


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def _short(value: Any, limit: int = 80) -> str:
    """``repr`` of a config value cut to ``limit`` characters (a mapping is named, not dumped)."""
    if isinstance(value, dict):
        text = "{" + ", ".join(map(str, list(value)[:6])) + (", …" if len(value) > 6 else "") + "}"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _mapping_error(err) -> str:
    """An unknown or missing key, named by its full dotted key (the mapping is not quoted)."""
    prefix = _key(err.absolute_path) + "." if err.absolute_path else ""
    if err.validator == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        return f"config key '{prefix}{missing[0]}': required but missing"
    allowed = sorted(err.schema.get("properties", {}))
    unknown = sorted(k for k in err.instance if k not in allowed)
    return (
        f"config key '{prefix}{unknown[0]}': unknown key"
        + (f" (also unknown: {unknown[1:]})" if len(unknown) > 1 else "")
        + f"; allowed: {allowed}"
    )


def _schema_errors(config: dict, schema: dict) -> list[str]:
    errors = sorted(_Validator(schema).iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    out, seen = [], set()
    for err in errors:
        # One line per key: the same bad value can fail several schema branches (a family enum
        # in the model and again in the source-specific ``then``); the first error says it.
        key = _key(err.absolute_path)
        if key in seen:
            continue
        seen.add(key)
        if err.validator in ("additionalProperties", "required") and isinstance(err.instance, dict):
            out.append(_mapping_error(err))
            continue
        # For oneOf/anyOf the most specific sub-error is the useful one.
        best = jsonschema.exceptions.best_match([err]) if err.context else err
        desc = best.schema.get("description") if isinstance(best.schema, dict) else None
        reason = best.message
        if len(reason) > 200:  # jsonschema quotes the whole instance; cut it
            reason = reason[:199] + "…"
        msg = f"config key '{key}': value {_short(err.instance)} is invalid — {reason}"
        if desc:  # the schema's description, first sentence only: a hint, not a manual
            desc = desc.split(". ")[0]
            desc = desc if len(desc) <= 160 else desc[:159] + "…"
        out.append(msg + (f" ({desc})" if desc else ""))
    return out


def validate_config(config: dict, base_dir: str | Path = ".") -> dict:
    """Validate ``config`` in place against the schema, fill defaults, and check semantics.

    Returns the same (now completed) dict. Raises :class:`ConfigError` listing every problem.
    """
    problems = _schema_problems(config)
    if not problems:
        _inherit_seed(config)
        problems = _semantic_errors(config, Path(base_dir))
    if problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))
    for m in config["models"].values():  # zoo models (hf/local took their config.json's dtype)
        if m["dtype"] == "auto" and m["source"] == "train":
            m["dtype"] = "float32"
    if config["jacobian"]["store_first_n"] is None:  # default: keep every sample (the bootstrap's)
        config["jacobian"]["store_first_n"] = config["samples"]["n"]
    if config["causal"]["n_samples"] is None:
        config["causal"]["n_samples"] = min(16, config["samples"]["n"])
    _sort_keys(config)
    return config


def validate_schema(config: dict) -> dict:
    """Schema checks, defaults and training steps resolved to branch names, without the checks
    that read the hub cache or local files (``resdyn fetch`` runs before anything is cached)."""
    problems = _schema_problems(config)
    if problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))
    return config


def _schema_problems(config: dict) -> list[str]:
    """Schema errors (defaults filled in place); hub models' training steps resolved to branches."""
    if not isinstance(config, dict):
        raise ConfigError(f"config must be a mapping, got {type(config).__name__}")
    schema = load_schema()
    problems = _schema_errors(config, schema)
    if not problems:
        for name, model in config["models"].items():
            if model["source"] == "train":
                model.setdefault("train", {})
            if model["source"] == "hf":  # training steps -> branch names, before anything reads them
                try:
                    revisions.resolve_model(name, model)
                except hub.HubError as err:
                    problems.append(f"config key 'models.{name}.revisions': {err}")
        problems = problems or _schema_errors(config, schema)  # second pass fills defaults under $ref
    return problems


def _inherit_seed(config: dict) -> None:
    """Every stage seed that the config does not give takes the top-level ``seed``."""
    base = config["seed"]
    stages = [config[k] for k in SEEDED_SECTIONS]
    stages += list(config["datasets"].values())
    stages += [m["train"] for m in config["models"].values() if "train" in m]
    for stage in stages:
        stage.setdefault("seed", base)


#: Top-level sections with a ``seed`` of their own (datasets and zoo training have theirs too).
SEEDED_SECTIONS = ("samples", "topology", "lens", "bridge", "causal", "bootstrap")


def _sort_keys(node: Any) -> None:
    """Sort every mapping's keys in place.

    Snakemake compares ``params`` by their text, so the order of keys in the YAML (or in which
    defaults were filled in) would otherwise count as a change and rerun jobs.
    """
    if isinstance(node, dict):
        items = sorted(node.items(), key=lambda kv: str(kv[0]))
        node.clear()
        node.update(items)
        for value in node.values():
            _sort_keys(value)
    elif isinstance(node, list):
        for value in node:
            _sort_keys(value)


def _semantic_errors(config: dict, base: Path) -> list[str]:
    """Every error of a schema-valid ``config`` that needs more than its shape (files under ``base``,
    the Hub, cross-section consistency), in a fixed order: dataset paths, models, Hub datasets,
    section values, overrides, lens imports, scaling groups."""
    out: list[str] = []
    datasets = config["datasets"]
    for name, ds in datasets.items():
        for p in ds.get("paths", []) if ds["source"] == "text" else []:
            if not (base / p).is_file():
                out.append(f"config key 'datasets.{name}.paths': file {p!r} does not exist")
    for name, m in config["models"].items():
        out += _model_errors(config, name, m, base)
    for name, ds in datasets.items():
        if ds["source"] == "hf":
            out += _dataset_errors(f"datasets.{name}", ds, base)
    out += _section_errors(config)
    out += _override_errors(config)
    if not any(".overrides." in e for e in out):
        out += _lens_stream_errors(config)
    if not any(e.startswith("config key 'models.") and ".overrides." in e for e in out):
        out += _lens_import_errors(config, base)
    for group, members in config["scaling"]["groups"].items():
        unknown = [m for m in members if m not in config["models"]]
        if unknown:
            out.append(
                f"config key 'scaling.groups.{group}': unknown models {unknown}; allowed: {sorted(config['models'])}"
            )
    return out


def _model_errors(config: dict, name: str, m: dict, base: Path) -> list[str]:
    """Errors of model ``name``: its dataset, its source's checks, then (unless the Hub revisions
    are unusable) its sample length and checkpoint names."""
    key = f"models.{name}"
    out: list[str] = []
    datasets = config["datasets"]
    if m["dataset"] not in datasets:
        out.append(f"config key '{key}.dataset': {m['dataset']!r} is not a dataset; allowed: {sorted(datasets)}")
    if m["source"] == "train":
        out += _train_model_errors(key, m)
    if m["source"] == "local":
        out += _local_model_errors(key, m, base)
    if m["source"] == "hf":
        errors, usable = _hf_model_errors(key, m)
        out += errors
        if not usable:
            return out
    length = model_config(config, name)["samples"]["length"]
    if "max_position" in m and length > m["max_position"]:
        out.append(
            f"config key 'samples.length': {length} exceeds "
            f"{key}.max_position={m['max_position']} (the positions the model supports)"
        )
    ckpts = checkpoints(config, name)
    clashes = sorted({c for c in ckpts if ckpts.count(c) > 1})
    if clashes:
        out.append(f"config key '{key}.revisions': revisions map to the same checkpoint names {clashes}")
    bad = [c for c in ckpts if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", c)]
    if bad:
        out.append(f"config key '{key}': checkpoint names {bad} must match [A-Za-z0-9][A-Za-z0-9_.-]*")
    return out


def _train_model_errors(key: str, m: dict) -> list[str]:
    """A trained model's checkpoints within train.steps and heads that divide (d_model, n_heads)."""
    out: list[str] = []
    t = m["train"]
    late = [s for s in t["checkpoints"] if s > t["steps"]]
    if late:
        out.append(f"config key '{key}.train.checkpoints': steps {late} exceed train.steps={t['steps']}")
    if m["d_model"] % m["n_heads"]:
        out.append(f"config key '{key}.n_heads': {m['n_heads']} does not divide d_model={m['d_model']}")
    kv = m.get("n_kv_heads", m["n_heads"])
    if m["n_heads"] % kv:
        out.append(f"config key '{key}.n_kv_heads': {kv} does not divide n_heads={m['n_heads']}")
    return out


def _local_model_errors(key: str, m: dict, base: Path) -> list[str]:
    """A local model's folders (each with a config.json), then their shapes."""
    out: list[str] = []
    folders = m["paths"].values() if "paths" in m else [m["path"]]
    missing = [f for f in folders if not (base / f / "config.json").is_file()]
    for folder in missing:
        out.append(
            f"config key '{key}': local model folder {folder!r} does not exist or has no "
            "config.json (expected a Hugging Face model folder)"
        )
    if not missing:
        out += _shape_errors(key, m, [(f, base / f / "config.json") for f in folders])
    return out


def _hf_model_errors(key: str, m: dict) -> tuple[list[str], bool]:
    """(errors, usable) of a Hub model: its revisions in training order (else not usable: the
    remaining checks of the model are skipped), each revision's config and weights, then shapes."""
    try:
        order = hub.order_revisions(m["revisions"], m.get("steps"))
    except ValueError as err:
        return [f"config key '{key}.revisions': {err}; add a `steps:` map (revision -> training step)"], False
    if order != m["revisions"]:
        return [
            f"config key '{key}.revisions': {m['revisions']} is not in training order; by their "
            f"{'steps map' if m.get('steps') else 'step numbers'} it is {order} (step 0 first, final last)"
        ], False
    found, problems = [], []
    for rev in m["revisions"]:
        try:
            cfg_json, path = hub.hub_config_json(m["repo"], rev)
            found.append((f"{m['repo']}@{rev}", cfg_json))
            problems += _missing_weights(m["repo"], rev, path.parent)
        except hub.HubError as err:
            problems.append(f"config key '{key}.revisions': {err}")
    if problems:
        return problems, True
    return _shape_errors(key, m, found), True


def _section_errors(config: dict) -> list[str]:
    """Cross-key checks of the global sections: complex tolerances, bootstrap interval, stored
    samples, Jacobian positions, causal samples, skipped positions, smoothing window."""
    out: list[str] = []
    tols = config["spectra"]["complex_tolerances"]
    for section in ("bridge", "bootstrap"):
        tol = config[section]["complex_tol"]
        if not any(abs(tol - t) <= 1e-12 * max(1.0, t) for t in tols):
            out.append(f"config key '{section}.complex_tol': {tol} must be one of spectra.complex_tolerances {tols}")
    boot = config["bootstrap"]
    if boot["interval"] == "studentized" and boot["n_resamples"] < 2:
        out.append(
            f"config key 'bootstrap.n_resamples': {boot['n_resamples']} — bootstrap.interval studentized "
            "needs ≥ 2 resamples (its standard error has n_resamples − 1 degrees of freedom)"
        )
    n, length = config["samples"]["n"], config["samples"]["length"]
    first_n = config["jacobian"]["store_first_n"]
    if runs(config, "A") and first_n is not None and first_n < 2:
        out.append(
            f"config key 'jacobian.store_first_n': {first_n} — the bootstrap needs the "
            "per-sample Jacobians of at least 2 samples (leave it unset to keep all samples.n)"
        )
    elif first_n is not None and first_n > n:
        out.append(f"config key 'jacobian.store_first_n': {first_n} exceeds samples.n={n} (allowed 2..{n})")
    out += _group_errors(config)
    positions = config["jacobian"]["positions"]
    if isinstance(positions, list):
        outside = [q for q in positions if not -length <= q < length]
        if outside:
            out.append(
                f"config key 'jacobian.positions': {outside} outside samples.length={length} "
                f"(allowed {-length}..{length - 1}; negative counts from the end)"
            )
    if config["causal"]["n_samples"] is not None and config["causal"]["n_samples"] > n:
        out.append(
            f"config key 'causal.n_samples': {config['causal']['n_samples']} exceeds samples.n={n} "
            "(the causal test uses the first causal.n_samples held-out samples)"
        )
    if config["activations"]["skip_positions"] >= length:
        out.append(
            f"config key 'activations.skip_positions': {config['activations']['skip_positions']} leaves no "
            f"token of samples.length={length}"
        )
    window = config["phases"]["window"]
    if config["phases"]["smoothing"] != "none" and window % 2 == 0:
        out.append(f"config key 'phases.window': {window} must be odd for centred smoothing")
    return out


#: Sections a model may override (``models.<name>.overrides``), key by key over the global ones.
OVERRIDE_SECTIONS = ("lens", "samples", "jacobian")


def scaling_groups(config: dict) -> dict[str, list[str]]:
    """``scaling.groups`` for the scaling table (results/scaling/phase_widths.tsv), or
    :class:`ConfigError` in one line when there are none: the table fits phase width against depth
    within each group, so without a group there is nothing to fit."""
    groups = (config.get("scaling") or {}).get("groups") or {}
    if not groups:
        raise ConfigError(
            "config key 'scaling.groups' is empty, and results/scaling/phase_widths.tsv fits phase width against "
            "depth within each group: add one (scaling: {groups: {family: [model, ...]}}) or do not request the "
            "scaling table"
        )
    return groups


def _group_errors(config: dict) -> list[str]:
    """``jacobian.n_groups`` B divides each model's samples.n N into groups of at least 2 samples."""
    out = []
    for name in config["models"]:
        mc = model_config(config, name)
        B, n = mc["jacobian"].get("n_groups", 0), mc["samples"]["n"]
        if not B:
            continue
        where = "" if mc is config else f" (model {name!r}: samples.n {n})"
        if B > n or n % B:
            out.append(f"config key 'jacobian.n_groups': {B} does not divide samples.n={n} into equal groups{where}")
        elif n // B < 2:
            out.append(
                f"config key 'jacobian.n_groups': {B} makes groups of {n // B} sample of samples.n={n}{where}; "
                "each group needs at least 2"
            )
    return out


def model_config(config: dict, model: str) -> dict:
    """The config as ``model``'s jobs see it: its ``overrides`` merged key by key into the global
    ``lens``, ``samples`` and ``jacobian`` sections, and its ``device`` and ``gpu_kind``; the config
    itself for a model without overrides. The samples-derived counts stay within the model's
    samples: ``jacobian.store_first_n`` and ``causal.n_samples`` are at most its ``samples.n``."""
    over = config["models"][model].get("overrides")
    if not over:
        return config
    out = dict(config)
    for section in OVERRIDE_SECTIONS:
        if section in over:
            out[section] = {**config[section], **over[section]}
    out.update({k: over[k] for k in ("device", "gpu_kind") if k in over})
    n = out["samples"]["n"]
    for section, key in (("jacobian", "store_first_n"), ("causal", "n_samples")):
        if section in out and isinstance(out[section].get(key), int) and out[section][key] > n:
            out[section] = {**out[section], key: n}
    return out


def _override_errors(config: dict) -> list[str]:
    """Each model's overrides, merged into the global section, validated by that section's schema
    (errors name ``models.<name>.overrides.<section>.<key>``); ``gpu_kind`` must be a GPU kind."""
    schema = load_schema()
    out = []
    for name, m in config["models"].items():
        over = m.get("overrides") or {}
        for section in OVERRIDE_SECTIONS:
            if section not in over:
                continue
            merged = copy.deepcopy({**config[section], **over[section]})
            sub = {"$defs": schema["$defs"], **schema["properties"][section]}
            prefix = f"config key 'models.{name}.overrides.{section}."
            out += [
                e.replace("config key '", prefix, 1).replace(".<top level>'", "'") for e in _schema_errors(merged, sub)
            ]
        if "gpu_kind" in over:
            try:
                gpu_kinds.check_gpu_kind(over["gpu_kind"], f"config key 'models.{name}.overrides.gpu_kind'")
            except ValueError as err:
                out.append(str(err))
    return out


def _shape_errors(key: str, m: dict, configs: list) -> list[str]:
    """Fill family and shape keys of a hub/local model entry from its config.json file(s).

    ``configs``: (where, config.json dict or path) per checkpoint. Keys written in the entry are
    overrides that must agree with the file; every checkpoint must have the same architecture.
    """
    out, seen = [], None
    for where, cfg in configs:
        try:
            found = hub.architecture(
                cfg if isinstance(cfg, dict) else hub.read_config_json(cfg),
                generic=m.get("family") == "generic",
                source="config.json" if isinstance(cfg, dict) else str(cfg),
            )
        except hub.HubError as err:
            return [f"config key '{key}': {where}: {err}"]
        if seen is not None and found != seen[1]:
            diff = sorted(k for k in set(found) | set(seen[1]) if found.get(k) != seen[1].get(k))
            return [f"config key '{key}': checkpoints {seen[0]} and {where} differ in {diff} (config.json)"]
        seen = (where, found)
    where, found = seen
    for k, value in found.items():
        if k == "model_type":
            continue
        if k in m and m[k] != value:
            field = {"family": "model_type", "parallel_residual": "use_parallel_residual"}.get(k) or hub.SHAPE_FIELDS[k]
            shown = found["model_type"] if k == "family" else value
            out.append(
                f"config key '{key}.{k}': {m[k]!r} disagrees with config.json of {where} "
                f"({field} = {shown!r}); remove the key (it is read from config.json) or fix it"
            )
        m.setdefault(k, value)
    if "n_layers" not in m:
        out.append(f"config key '{key}': config.json of {where} has no num_hidden_layers; set n_layers")
    if m.get("dtype") == "auto":  # the final checkpoint's stored dtype
        cfg = configs[-1][1]
        m["dtype"] = hub.checkpoint_dtype(cfg if isinstance(cfg, dict) else hub.read_config_json(cfg))
    return out


def _missing_weights(repo: str, revision: str, snapshot: Path) -> list[str]:
    """Offline, a snapshot whose config.json is cached but whose weights are not is an error at validation."""
    if not hub.hub_offline() or any(next(snapshot.glob(p), None) for p in ("*.safetensors", "*.bin")):
        return []
    return [
        f"hub model {repo!r} at revision {revision!r}: the cache has its config.json but no weight files "
        f"(HF_HUB_OFFLINE=1); fetch them with `{hub.download_command(repo, revision)}`"
    ]


def _dataset_errors(key: str, ds: dict, base: Path) -> list[str]:
    """An hf dataset must be a readable local path, or (offline) be in the HF cache."""
    if "path" in ds:
        if not (base / ds["path"]).exists():
            return [
                f"config key '{key}.path': {ds['path']!r} does not exist (a save_to_disk folder or parquet file(s))"
            ]
        return []
    if hub.datasets_offline() and hub.cached_snapshot(ds["name"], ds.get("revision"), "dataset") is None:
        return [
            f"config key '{key}': dataset {ds['name']!r} (config {ds.get('config')!r}, revision "
            f"{ds.get('revision') or 'main'!r}) is not in the Hugging Face cache and downloads are off; "
            f"fetch it with `{hub.download_command(ds['name'], ds.get('revision'), 'dataset')}` "
            "(`resdyn fetch CONFIG` prints every download the config needs)"
        ]
    return []


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML loader that refuses a key written twice in one mapping (YAML's last-one-wins
    would silently drop the first). Keys brought in by a ``<<:`` merge may be overridden."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if key in first:
                    raise ConfigError(
                        f"{key_node.start_mark.name}:{line}: duplicate key {key!r} (first written at line "
                        f"{first[key]}); YAML would keep only the last — remove or rename one"
                    )
                first[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> Any:
    """Read a YAML file strictly (duplicate keys are an error); errors name the file and line."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as stream:  # a stream, so marks carry the file name
            return yaml.load(stream, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:  # (an unreadable file raises OSError, which names it)
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML ({where}{what})") from err


def check_config_files(paths: list[str | Path]) -> None:
    """Re-read every config file Snakemake loaded with the strict loader (duplicate keys)."""
    for path in paths:
        read_yaml(path)


def load_config(path: str | Path) -> dict:
    """Read a YAML config file and validate it (paths resolved relative to the working directory)."""
    config = read_yaml(path)
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a YAML mapping of config keys, got {type(config).__name__}")
    return validate_config(config)


# --- lookups used by the Snakefile -------------------------------------------------------------


def revision_name(revision: str) -> str:
    """A filesystem/wildcard-safe checkpoint name for a hub revision."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", revision)


def checkpoints(config: dict, model: str) -> list[str]:
    """Checkpoint names of a model, in training order (the last one is the final model)."""
    m = config["models"][model]
    if m["source"] == "train":
        return [f"step{s}" for s in sorted(m["train"]["checkpoints"])]
    if m["source"] == "hf":
        return [revision_name(r) for r in hub.order_revisions(m["revisions"], m.get("steps"))]
    return list(m["paths"]) if "paths" in m else ["local"]


def checkpoint_spec(config: dict, model: str, ckpt: str) -> dict:
    """Where checkpoint ``ckpt`` of ``model`` comes from: source, repo/revision or folder, dtype."""
    m = config["models"][model]
    spec: dict[str, Any] = {"model": model, "checkpoint": ckpt, "source": m["source"], "dtype": m["dtype"]}
    if m.get("family") == "generic":  # split by resdyn.lm.generic (self-checked at load time)
        spec["family"] = "generic"
    if m["source"] == "hf":
        spec.update(repo=m["repo"], revision={revision_name(r): r for r in m["revisions"]}[ckpt])
    elif m["source"] == "local":
        spec.update(path=m["paths"][ckpt] if "paths" in m else m["path"])
    else:
        spec.update(path=f"models/{model}/weights/{ckpt}", step=int(ckpt.removeprefix("step")))
    return spec


def dataset_inputs(config: dict, dataset: str) -> list[str]:
    """Local files a dataset's corpus is read from (text files, a local hf path), so editing one reruns the corpus."""
    ds = config["datasets"][dataset]
    if ds["source"] == "text":
        return list(ds["paths"])
    return [ds["path"]] if ds["source"] == "hf" and "path" in ds else []  # save_to_disk folder / parquet


def checkpoint_inputs(config: dict, model: str, ckpt: str) -> list[str]:
    """Files ``checkpoint.json`` is made from: a zoo model's weights folder, or every file of a local
    model folder (weights, config.json, tokenizer), so editing or swapping one redoes the
    checkpoint record and what depends on it. Hub snapshots are pinned by their revision."""
    m = config["models"][model]
    if m["source"] == "train":
        return [f"models/{model}/weights"]
    if m["source"] != "local":
        return []
    folder = Path(checkpoint_spec(config, model, ckpt)["path"])
    if not folder.is_dir():
        return []  # the config check reports the missing folder
    return sorted(
        str(p)
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def lens_checkpoints(config: dict, model: str) -> list[str]:
    """Checkpoints that get a tuned lens: the final one, or all (config lens.checkpoints, per model)."""
    ckpts = checkpoints(config, model)
    return ckpts if model_config(config, model)["lens"]["checkpoints"] == "all" else ckpts[-1:]


def lens_train_blocks(config: dict, model: str) -> int:
    """Training windows of the lens of ``model`` (its overrides count): ⌈lens.train_tokens /
    samples.length⌉ fresh ones, or lens.n_train_blocks cached ones (:func:`resdyn.lm.corpus.lens_train_blocks`)."""
    cfg = model_config(config, model)
    return corpus.lens_train_blocks(cfg["lens"], cfg["samples"]["length"])


def _lens_stream_errors(config: dict) -> list[str]:
    """A fresh-token lens (lens.train_tokens > 0) must not outrun its stream: every training token
    is used once, so lens.steps × lens.tokens_per_step ≤ lens.train_tokens (per model, overrides
    included; a lens imported with lens.source tuned_lens trains nothing)."""
    out: list[str] = []
    for name in config["models"] if runs(config, "B") else ():
        lens = model_config(config, name)["lens"]
        tokens = lens.get("train_tokens", 0)
        if not tokens or lens.get("source", "train") != "train":
            continue
        need = lens["steps"] * lens["tokens_per_step"]
        if need > tokens:
            out.append(
                f"config key 'lens.train_tokens': {tokens:,} (model {name}) is less than lens.steps × "
                f"lens.tokens_per_step = {lens['steps']} × {lens['tokens_per_step']} = {need:,} tokens; each "
                f"fresh token is used once: raise lens.train_tokens to ≥ {need:,} or lower lens.steps"
            )
    return out


def lens_import_spec(config: dict, model: str, ckpt: str) -> dict | None:
    """Where the lens of ``model``/``ckpt`` is imported from (config ``lens.source: tuned_lens``):
    {path, repo, repo_type, revision} with ``{model}`` (config key), ``{ckpt}`` (checkpoint name)
    and ``{repo}`` (the model's hub id, '' for other sources) filled in; None when trained.
    The model's own ``overrides.lens`` count (:func:`model_config`)."""
    lens = model_config(config, model)["lens"]
    if lens.get("source", "train") != "tuned_lens":
        return None
    repo = config["models"][model].get("repo", "")
    return {
        "path": lens["path"].format(model=model, ckpt=ckpt, repo=repo),
        "repo": lens.get("repo"),
        "repo_type": lens.get("repo_type", "space"),
        "revision": lens.get("revision"),
    }


def _lens_import_errors(config: dict, base: Path) -> list[str]:
    """A local tuned-lens folder (no lens.repo) must hold config.json and params.pt."""
    out: list[str] = []
    for name in config["models"]:
        if model_config(config, name)["lens"].get("source", "train") != "tuned_lens":
            continue
        try:
            ckpts = lens_checkpoints(config, name)
        except ValueError:  # unorderable revisions: reported by the checks above
            continue
        for ckpt in ckpts:
            try:
                spec = lens_import_spec(config, name, ckpt)
            except (KeyError, IndexError, ValueError) as err:
                return [
                    f"config key 'lens.path': {model_config(config, name)['lens']['path']!r} — only {{model}}, "
                    f"{{ckpt}} and {{repo}} may be "
                    f"substituted ({type(err).__name__}: {err})"
                ]
            if spec is None or (spec["repo"] and not hub.hub_offline()):
                continue  # online, a hub lens is fetched by the lens job
            if spec["repo"]:  # offline: it must already be in the HF cache
                snap = hub.cached_snapshot(spec["repo"], spec["revision"], spec["repo_type"])
                folder = None if snap is None else snap / spec["path"]
                missing = [f for f in ("config.json", "params.pt") if folder is None or not (folder / f).is_file()]
                if missing:
                    out.append(
                        f"config key 'lens.path': tuned lens {spec['repo']}:{spec['path']} (model {name}) is "
                        "not in the "
                        "HF cache (HF_HUB_OFFLINE is set); fetch it with "
                        f"`{hub.download_command(spec['repo'], spec['revision'], spec['repo_type'])} "
                        f"--include '{spec['path']}/*'`"
                    )
                continue
            missing = [f for f in ("config.json", "params.pt") if not (base / spec["path"] / f).is_file()]
            if missing:
                out.append(
                    f"config key 'lens.path': tuned-lens folder {spec['path']!r} (model {name}, checkpoint {ckpt}) "
                    f"lacks {', '.join(missing)} (expected config.json + params.pt)"
                )
    return out


def layer_blocks(config: dict, model: str) -> list[str]:
    """Names of the Jacobian/activation job blocks, ``layers{first:03d}-{last:03d}``.

    ``jacobian.layers_per_job`` layers each; 0: :func:`auto_layers_per_job`.
    """
    n = config["models"][model]["n_layers"]
    per = model_config(config, model)["jacobian"]["layers_per_job"] or auto_layers_per_job(config, model)
    return [f"layers{a:03d}-{min(a + per, n) - 1:03d}" for a in range(0, n, per)]


def auto_layers_per_job(config: dict, model: str) -> int:
    """Layers per Jacobian job for ``jacobian.layers_per_job: 0``: all n on a CPU; on a GPU the most
    that one GPU of the kind the jobs are priced for holds (the model's ``gpu_kind``, else
    ``RESDYN_GPU_KIND``; :func:`resdyn.cluster.cost.jacobian_block_size`), all n when they fit."""
    from resdyn.cluster import cost

    mc = model_config(config, model)
    kind = mc.get("gpu_kind") or gpu_kinds.gpu_kind()
    if not cost.uses_gpu(mc, "jacobians", kind):
        return int(config["models"][model]["n_layers"])
    return cost.jacobian_block_size(mc, cost.model_shape(mc, model), gpu_kinds.GPU_KINDS[kind].usable_bytes)


def block_layers(block: str) -> list[int]:
    """Layer indices of a block name made by :func:`layer_blocks`."""
    match = re.fullmatch(r"layers(\d{3})-(\d{3})", block)
    if not match:
        raise ValueError(f"block name {block!r} is not of the form layersAAA-BBB")
    return list(range(int(match[1]), int(match[2]) + 1))


# --- the study switch (config key ``studies``) --------------------------------------------------


def runs(config: dict, *studies: str) -> bool:
    """Whether every one of ``studies`` ("A", "B") is switched on by ``config['studies']``."""
    return set(studies) <= set(config.get("studies", ("A", "B")))
