"""The real launch path: `torchrun --standalone --nproc_per_node=2 -m distlab fit ...` on CPU."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.helpers.callbacks import load_rank_weights
from tests.helpers.cli import CONFIGS, rank_weights_config, run_subprocess

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_two_processes_train_one_model(tmp_path):
    weights = tmp_path / "weights"
    extra = rank_weights_config(
        tmp_path, weights
    )  # devices/strategy left at "auto": the CLI must match torchrun
    out = run_subprocess(
        [
            *TORCHRUN,
            "-m",
            "distlab",
            "fit",
            "--config",
            str(CONFIGS / "debug.yaml"),
            "--config",
            extra,
            "--trainer.devices=auto",
            "--trainer.max_steps=5",
        ],
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "matched the launcher: devices=2, strategy=ddp_optimizer_sync" in out.stdout + out.stderr
    ranks = load_rank_weights(weights, 2)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert [r["strategy"] for r in ranks] == ["OptimizerSyncDDPStrategy"] * 2
    for k, v in ranks[0]["state"].items():
        assert torch.equal(v, ranks[1]["state"][k]), f"ranks differ at {k}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_with_mismatched_devices_fails_in_one_line(tmp_path):
    out = run_subprocess(
        [
            *TORCHRUN,
            "-m",
            "distlab",
            "fit",
            "--config",
            str(CONFIGS / "debug.yaml"),
            "--trainer.devices=1",
            f"--trainer.default_root_dir={tmp_path}",
        ],
        timeout=240,
    )
    assert out.returncode != 0
    assert (
        "distlab: error: torchrun started 2 processes (2 per node) but the trainer asks for devices=1"
        in out.stderr
    )
