"""Site settings of the SLURM profile (profiles/slurm/config.yaml), from ``RESDYN_SLURM_*`` variables.

The profile stays a link to the repository's file; what differs between clusters comes from the
environment (docs/slurm.md, "Site settings"). GPU jobs and CPU jobs get their own partition, QOS,
node constraint and extra sbatch flags, every rule may override each of them
(``RESDYN_SLURM_<RULE>_<SETTING>``, e.g. ``RESDYN_SLURM_LENS_QOS=long``), and the GPU constraint
may be picked from a site table by the memory of the GPU kind the run is priced for
(``RESDYN_SLURM_GPU_CONSTRAINTS``). Which rules are GPU jobs is the cost model's answer
(:func:`resdyn.cluster.cost.uses_gpu`): spectra and bootstrap are CPU jobs on a GPU kind with weak
FP64. How many GPUs a job gets is not a site setting: the rules ask the cost model (``gpu``).
Bad input (an sbatch option the plugin sets itself or that sbatch does not know, a malformed
table) is one ValueError line naming the variable.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from resdyn.cluster import cost as rcost
from resdyn.cluster import gpu_kinds

#: Settings of a job class, ``RESDYN_SLURM_[GPU_]<NAME>`` (GPU jobs: the GPU_ variant), and the
#: Snakemake resource each becomes (the SLURM plugin's names).
SETTINGS = {"PARTITION": "slurm_partition", "QOS": "qos", "CONSTRAINT": "constraint", "EXTRA": "slurm_extra"}
#: sbatch long options an EXTRA setting may carry. The plugin sets the others itself (job name,
#: output, account, partition, memory, CPUs, time, constraint, QOS, GPUs: see
#: snakemake_executor_plugin_slurm.validation.get_forbidden_slurm_options) or they are not sbatch's.
SBATCH_EXTRA_OPTIONS = (
    "begin",
    "chdir",
    "container",
    "core-spec",
    "cores-per-socket",
    "cpu-freq",
    "deadline",
    "delay-boot",
    "distribution",
    "exclude",
    "exclusive",
    "gpu-bind",
    "gpu-freq",
    "gpus-per-node",
    "gpus-per-socket",
    "gpus-per-task",
    "gres-flags",
    "hint",
    "licenses",
    "mail-type",
    "mail-user",
    "mcs-label",
    "mem-bind",
    "mincpus",
    "network",
    "nice",
    "nodelist",
    "no-requeue",
    "oversubscribe",
    "power",
    "prefer",
    "priority",
    "profile",
    "propagate",
    "requeue",
    "reservation",
    "signal",
    "sockets-per-node",
    "spread-job",
    "switches",
    "thread-spec",
    "threads-per-core",
    "tmp",
    "tres-per-task",
    "use-min-nodes",
    "wckey",
)


def env(name: str, default: str | None = None) -> str | None:
    """A variable's value; an empty one counts as unset."""
    return os.environ.get(name) or default


#: One word of an EXTRA setting: ``--name`` or ``--name=value``, the value free of spaces, quotes
#: and shell characters (``;``, ``|``, ``&``, ``$``, backquotes, redirections).
_EXTRA_WORD = re.compile(r"--([a-z][a-z0-9-]*)(?:=([A-Za-z0-9_.,:@%+/=\[\]^*-]*))?\Z")


def check_extra(flags: str, key: str) -> str:
    """The sbatch flags of ``flags``, each ``--name`` or ``--name=value`` with ``name`` in
    :data:`SBATCH_EXTRA_OPTIONS`, joined shell-quoted (the SLURM plugin appends the setting to an
    sbatch command run by a shell); anything else is one ValueError line naming ``key``."""
    try:
        words = shlex.split(flags)
    except ValueError as err:
        raise ValueError(f"{key}={flags!r}: not a list of sbatch flags ({err})") from err
    for word in words:
        m = _EXTRA_WORD.match(word)
        if m is None:
            raise ValueError(
                f"{key}={flags!r}: {word!r} is not an sbatch flag of the form --name or --name=value (values hold "
                "letters, digits and _.,:@%+/=[]^*- only: no spaces, quotes or shell characters); allowed: "
                f"--{', --'.join(SBATCH_EXTRA_OPTIONS)}"
            )
        if m.group(1) not in SBATCH_EXTRA_OPTIONS:
            raise ValueError(
                f"{key}={flags!r}: {word!r} is not an sbatch option resdyn passes on (the SLURM plugin "
                "sets account, partition, memory, CPUs, time, constraint, QOS and GPUs itself; use the "
                f"long form); allowed: --{', --'.join(SBATCH_EXTRA_OPTIONS)}"
            )
    return shlex.join(words)


def constraint_table(text: str, key: str = "RESDYN_SLURM_GPU_CONSTRAINTS") -> dict[float, str]:
    """GPU memory (GB, as sites name their cards: 40, 48, 80, 141) -> SLURM constraint, from
    ``40=a100_40g,80=a100_80g|h100`` or the path of a YAML mapping ``{40: a100_40g, 80: ...}``."""
    if Path(text).is_file():
        import yaml

        raw = yaml.safe_load(Path(text).read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"{key}={text!r}: expected a YAML mapping of GPU memory in GB -> constraint")
        items = [(str(k), str(v)) for k, v in raw.items()]
    else:
        items = [tuple(part.split("=", 1)) if "=" in part else (part, "") for part in text.split(",") if part.strip()]
    table = {}
    for memory, constraint in items:
        if not re.fullmatch(r"\d+(\.\d+)?", memory.strip()) or not constraint.strip():
            raise ValueError(
                f"{key}={text!r}: entry {memory!r}={constraint!r}; expected GB=constraint, e.g. "
                "40=a100_40g,80=a100_80g|h100 (or a YAML file of such a mapping)"
            )
        table[float(memory)] = constraint.strip()
    return table


def pick_constraint(table: Mapping[float, str], kind: str) -> str:
    """The constraint of the smallest table entry holding GPU kind ``kind``'s memory: its
    nvidia-smi total in GiB, less 5 % (a "48 GB" L40S reports 45 GiB, an "80 GB" H100 79.6)."""
    g = gpu_kinds.GPU_KINDS[kind]
    need = 0.95 * g.memory_mib / 1024
    fits = sorted(m for m in table if m >= need)
    if not fits:
        raise ValueError(
            f"RESDYN_SLURM_GPU_CONSTRAINTS: no entry of at least {need:.0f} GB for RESDYN_GPU_KIND={kind} "
            f"({g.name}); entries: {sorted(table)}"
        )
    return table[fits[0]]


def job_class_settings(gpu: bool) -> dict[str, str]:
    """Resources of every GPU (or CPU) job from ``RESDYN_SLURM_GPU_*`` (``RESDYN_SLURM_*``):
    partition, QOS, constraint (GPU jobs: else from the constraint table), extra sbatch flags;
    GPU jobs also ``gpu_model`` and ``cpus_per_gpu``."""
    prefix = "RESDYN_SLURM_GPU_" if gpu else "RESDYN_SLURM_"
    out = {res: env(prefix + name) for name, res in SETTINGS.items()}
    if gpu:
        table = env("RESDYN_SLURM_GPU_CONSTRAINTS")
        if not out["constraint"] and table:
            out["constraint"] = pick_constraint(constraint_table(table), gpu_kinds.gpu_kind())
        out["gpu_model"] = env("RESDYN_SLURM_GPU_MODEL")
        out["cpus_per_gpu"] = int(env("RESDYN_SLURM_CPUS_PER_GPU", str(gpu_kinds.GPU_HOST_THREADS)))
    if out["slurm_extra"]:
        out["slurm_extra"] = check_extra(out["slurm_extra"], prefix + "EXTRA")
    return {k: v for k, v in out.items() if v is not None}


def gpu_rules(zoo_gpu: bool = False, config: Mapping | None = None) -> list[str]:
    """Rules that run as GPU jobs on the priced GPU kind (:func:`resdyn.cluster.cost.uses_gpu`; the
    zoo's training too with ``RESDYN_SLURM_ZOO_GPU``)."""
    cfg = dict(config or {"device": "cuda"})
    rules = [r for r in (*rcost.GPU_RULES, *rcost.GPU_LINALG_RULES) if rcost.uses_gpu(cfg, r)]
    return rules + (["zoo_train"] if zoo_gpu else [])


def set_resources(zoo_gpu: bool = False) -> dict[str, dict]:
    """The profile's ``set-resources``: every rule that is submitted gets its job class's settings,
    then its own ``RESDYN_SLURM_<RULE>_<SETTING>`` overrides (checked like the class's)."""
    gpus = gpu_rules(zoo_gpu)
    rules = [r for r in rcost.RULES if r not in rcost.LOCALRULES]
    out = {}
    for rule in rules:
        res = job_class_settings(rule in gpus)
        for name, key in SETTINGS.items():
            var = f"RESDYN_SLURM_{rule.upper()}_{name}"
            value = env(var)
            if value is not None:
                res[key] = check_extra(value, var) if name == "EXTRA" else value
        if rule == "zoo_train" and zoo_gpu:
            res["gpu"] = 1  # the one GPU rule the cost model does not count GPUs for
        if res:
            out[rule] = res
    return out


def set_threads(zoo_gpu: bool = False) -> dict[str, int]:
    """The profile's ``set-threads``: a GPU job's threads are its ``cpus_per_gpu`` (the plugin asks
    for --cpus-per-gpu); zoo training on the CPU takes 4."""
    cpus = int(env("RESDYN_SLURM_CPUS_PER_GPU", str(gpu_kinds.GPU_HOST_THREADS)))
    out = {rule: cpus for rule in gpu_rules(zoo_gpu)}
    out.setdefault("zoo_train", 4)
    return out


def check_workdir(path: str | Path) -> None:
    """The working directory (``snakemake --directory DIR``: results, models, logs and benchmarks
    go there) must take a file; else one ValueError line naming it. Tried by writing and removing
    a temporary file: permission bits say nothing for root or on a read-only file system."""
    import tempfile

    try:
        handle, name = tempfile.mkstemp(prefix=".resdyn-write-test-", dir=path)
        os.close(handle)
        os.unlink(name)
    except OSError as err:
        raise ValueError(
            f"working directory (snakemake --directory) {str(path)!r} is not writable "
            f"({err.strerror or err}): results/, models/, logs/ and benchmarks/ go there; choose a "
            "folder you can write, e.g. on scratch"
        ) from None
