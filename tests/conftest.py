"""Shared fixtures: the repository root, small configs, torch threads, offline hub caches, a warm
code-version cache.

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
