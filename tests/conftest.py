"""Shared fixtures: repo paths, a small-thread torch, and process-group hygiene."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"

os.environ.setdefault("OMP_NUM_THREADS", "2")
# Spawned ranks inherit this: a rank that dies on a signal prints every thread's Python stack.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")
torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _destroy_process_group():
    """A test that leaves a process group behind must not leak it into the next test."""
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"
