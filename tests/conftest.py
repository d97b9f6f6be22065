"""Shared fixtures: the repository root, small configs, torch threads, offline hub caches; the
order in which `make test` hands the files to its workers.

Shared helpers (no fixtures) are modules of tests/helpers/."""

import copy
import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

# The cost model's numbers under test are the table's: a user rates file (`resdyn calibrate`,
# ~/.config/resdyn/gpus.yaml) on the test machine must not change them.
os.environ.setdefault("RESDYN_GPU_RATES", "none")
# One BLAS/OpenMP thread in the test processes and the processes they start (a workflow job sets
# its own from its `threads`): two workers share two cores, and OpenBLAS threads spin-waiting for a
# busy core doubled the CPU time of the numpy tests (test_rotation: 23 s CPU for 12 s of work).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

#: Seconds each file's slow and unmarked tests took (serial, on the 2-core CI machine, fixtures
#: included); files not listed take a few seconds. `make test` and `make test-fast` hand whole
#: files to two workers (--dist loadfile --no-loadscope-reorder) in collection order, so the files
#: are collected longest first: the long runs start at once, side by side, and the short files fill
#: in around them instead of one long file starting last on one worker while the other idles.
FILE_SECONDS = {  # file: (slow, unmarked)
    "test_pipeline.py": (372, 0),
    "test_slurm_mini.py": (234, 0),
    "test_tamper.py": (212, 0),
    "test_user_configs.py": (197, 0),
    "test_pythia.py": (118, 0),
    "test_slurm.py": (85, 16),
    "test_dag_plan.py": (66, 24),
    "test_rotation.py": (48, 2),
    "test_requeue.py": (40, 0),
    "test_badconfig.py": (31, 6),
    "test_integrity.py": (20, 1),
    "test_package.py": (13, 0),
    "test_workdir.py": (12, 0),
    "test_hub.py": (10, 7),
    "test_cost.py": (7, 2),
    "test_reach.py": (7, 1),
    "test_overrides.py": (5, 3),
    "test_lens.py": (0, 55),
    "test_jacobian.py": (0, 40),
    "test_plots.py": (0, 26),
    "test_calibrate.py": (0, 12),
    "test_codeversion.py": (0, 11),
    "test_data.py": (0, 11),
    "test_gpu_check.py": (0, 11),
    "test_config.py": (0, 10),
    "test_cli.py": (0, 8),
}


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(config, items):
    """Longest files first (FILE_SECONDS: the selected tiers' seconds), each file's tests kept
    together and in their order."""
    cost: dict[str, float] = {}
    for name, (slow, unmarked) in FILE_SECONDS.items():
        selected = [item for item in items if item.path.name == name]
        cost[name] = slow * any(i.get_closest_marker("slow") for i in selected) + unmarked * any(
            not i.get_closest_marker("slow") for i in selected
        )
    items.sort(key=lambda item: -cost.get(item.path.name, 0))


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Tiny models on two shared cores: OpenMP spinning under contention makes small matmuls
    10-100x slower, so every test runs torch on one thread."""
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1):  # numpy's OpenBLAS too, should it be loaded before the variables were set
        yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def single_thread():
    """Tiny models gain nothing from threads, and on a shared machine the OpenMP threads'
    spin-waiting under oversubscription slows the many tiny ops by orders of magnitude.

    Module-scoped: it resets torch to one thread at the start of each module that asks for it
    (``pytestmark = pytest.mark.usefixtures("single_thread")``), whatever an earlier module's
    in-process job set (resdyn.provenance.sidecars sets a job's threads)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture
def smoke_config() -> dict:
    return copy.deepcopy(yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text()))


@pytest.fixture(scope="session")
def code_cache_seed(tmp_path_factory) -> Path:
    """The code versions of every rule script of this checkout, for no family and each family: a
    warm ``.snakemake/resdyn/code`` for the tests' workflow runs (tests/helpers/codecache.py)."""
    from helpers import codecache

    return codecache.seed(tmp_path_factory.mktemp("code-cache"))


@pytest.fixture(scope="session")
def paper_hub_cache(tmp_path_factory) -> Path:
    """An HF hub cache with config.json stand-ins of every model (and dataset) of the paper
    presets, so that they validate and dry-run offline (tests/helpers/hubcache.py)."""
    from helpers import hubcache

    return hubcache.build_paper_standins(
        tmp_path_factory.mktemp("paper-hub"),
        [ROOT / "configs" / f for f in ("paper-a.yaml", "paper-b.yaml", "paper-b-extended.yaml", "pythia.yaml")],
    )


@pytest.fixture(scope="session")
def mini_hf_home(tmp_path_factory) -> Path:
    """HF_HOME holding the tiny models and dataset of configs/paper-mini.yaml (tests/helpers/hubcache.py)."""
    from helpers import hubcache

    home = tmp_path_factory.mktemp("mini-hf")
    hubcache.build(home)
    return home
