"""A run stopped from outside (a scheduler's SIGTERM, a user's Ctrl-C) exits with the signal's status, never 0,
says so in one line, and loses no finished step: the steps after the last checkpoint are saved first."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.helpers.cli import CONFIGS, run_subprocess, write_yaml


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("name", "code", "said"), [("SIGTERM", 143, "SIGTERM"), ("SIGINT", 130, "Ctrl-C")])
def test_a_stopped_fit_exits_with_the_signals_status_and_saves_its_steps(tmp_path, name, code, said):
    run = tmp_path / "run"
    extra = write_yaml(
        tmp_path / "stop.yaml",
        {
            "trainer": {
                "default_root_dir": str(run),
                "max_steps": 50,
                "val_check_interval": 50,
                "callbacks": [
                    {"class_path": "tests.helpers.signals.SignalSelf", "init_args": {"name": name, "step": 3}}
                ],
            }
        },
    )
    out = run_subprocess(
        [sys.executable, "-m", "distlab", "fit", "--config", str(CONFIGS / "debug.yaml"), "--config", extra],
        timeout=240,
    )
    assert out.returncode == code, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"distlab: error: stopped by {said}") and "resume with --ckpt_path" in last, last
    assert "Traceback" not in out.stderr
    saved = last.split("saved ", 1)[1].split(" at step ")[0]
    assert torch.load(saved, map_location="cpu", weights_only=True)["global_step"] == 3, last


@pytest.mark.timeout(200)
def test_a_rank_killed_by_a_signal_ends_the_job_in_one_line_without_tracebacks(tmp_path):
    """Rank 1 of a spawned fit is SIGKILLed (as the out-of-memory killer does): one line names the rank and the
    signal, exit 1, and no traceback (rank 0, stopped by the launcher while it drains gloo at exit, stays quiet)."""
    import os
    import subprocess

    from tests.helpers.cli import subprocess_env

    args = [sys.executable, "-m", "distlab", "fit", "--config", str(CONFIGS / "debug.yaml"), "--config"]
    args += [str(CONFIGS / "trainer" / "ddp_optimizer_sync_spawn_cpu.yaml"), "--trainer.max_steps=3"]
    args += [f"--trainer.default_root_dir={tmp_path / 'run'}"]
    env = {**subprocess_env(), "DISTLAB_FAULT": "sigkill:1:1"}
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=180, cwd=os.getcwd())
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1, out.stderr[-3000:]
    assert last.startswith("distlab: error: rank 1 was stopped by SIGKILL"), last
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
