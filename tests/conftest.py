"""Shared fixtures: repo paths, a small-thread torch, and process-group hygiene."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"

# This process (single-process tests) uses two threads; every process it starts (spawned ranks, torchrun
# workers, CLI subprocesses) inherits OMP_NUM_THREADS=1: two ranks on two cores, not four threads.
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
os.environ["OMP_NUM_THREADS"] = "1"
# Spawned ranks inherit this: a rank that dies on a signal prints every thread's Python stack.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")


@pytest.fixture(autouse=True)
def _destroy_process_group():
    """A test that leaves a process group behind must not leak it into the next test."""
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# What one test's launch leaves in os.environ and a later test's processes would inherit: seed_everything
# exports PL_GLOBAL_SEED (spawned ranks seed Lightning's DistributedSampler from it), and a spawn fit
# leaves MASTER_PORT behind (a later subprocess launch then rendezvoused on a stale port and hung).
LEAKY_ENV = (
    "PL_GLOBAL_SEED",
    "PL_SEED_WORKERS",
    "MASTER_PORT",
    "MASTER_ADDR",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
)


@pytest.fixture(autouse=True)
def _restore_launch_env():
    """Each test starts with the launch environment the session started with."""
    saved = {k: os.environ.get(k) for k in LEAKY_ENV}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"
