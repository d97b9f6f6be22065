"""Shared fixtures: the repository root and small configs."""

import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture
def smoke_config() -> dict:
    return copy.deepcopy(yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text()))
