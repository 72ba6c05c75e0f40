"""A run stopped from outside (a scheduler's SIGTERM, a user's Ctrl-C) exits with the signal's status, never 0,
says so in one line, and loses no finished step: the steps after the last checkpoint are saved first."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.helpers.cli import CONFIGS, run_subprocess, write_yaml


def stop_config(tmp_path, run, signal_self: dict) -> str:
    """A config for a 50-step debug fit in ``run`` (one validation, at the end) with ``SignalSelf(**signal_self)``."""
    trainer = {"default_root_dir": str(run), "max_steps": 50, "val_check_interval": 50}
    trainer["callbacks"] = [{"class_path": "tests.helpers.signals.SignalSelf", "init_args": signal_self}]
    return write_yaml(tmp_path / "stop.yaml", {"trainer": trainer})


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("name", "code", "said"), [("SIGTERM", 143, "SIGTERM"), ("SIGINT", 130, "Ctrl-C")])
def test_a_stopped_fit_exits_with_the_signals_status_and_saves_its_steps(tmp_path, name, code, said):
    run = tmp_path / "run"
    extra = stop_config(tmp_path, run, {"name": name, "step": 3})
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
    # it stops at once: no validation first (Lightning validates on should_stop; a grace period is short)
    import csv

    with open(run / "metrics.csv", newline="") as f:
        validated = [
            row for row in csv.DictReader(f) if any(k.startswith("val_") and v for k, v in row.items())
        ]
    assert not validated, validated


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


def _spawned_fit_stopped_by(tmp_path, signal_self: dict, launcher_sigint: bool = False):
    """A 2-rank spawned fit (debug recipe, 50 steps, one validation at the end) with ``SignalSelf(**signal_self)``."""
    import signal
    import subprocess

    from tests.helpers.cli import REPO, subprocess_env

    extra = stop_config(tmp_path, tmp_path / "run", signal_self)
    args = [sys.executable, "-m", "distlab", "fit", "--config", str(CONFIGS / "debug.yaml"), "--config"]
    args += [str(CONFIGS / "trainer" / "ddp_optimizer_sync_spawn_cpu.yaml"), "--config", extra]
    # Ctrl-C reaches a command started at a terminal; a background job (as CI may run the suite) has SIGINT ignored
    restore = (lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if launcher_sigint else None
    return subprocess.run(
        args, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=240, preexec_fn=restore
    )


def _saved_step(out, code: int, said: str) -> int:
    assert out.returncode == code, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"distlab: error: stopped by {said}") and "resume with --ckpt_path" in last, last
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    saved, step = last.split("saved ", 1)[1].split(";")[0].split(" at step ")
    assert torch.load(saved, map_location="cpu", weights_only=True)["global_step"] == int(step), last
    return int(step)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("name", "code", "said"), [("SIGTERM", 143, "SIGTERM"), ("SIGINT", 130, "Ctrl-C")])
def test_a_stop_sent_to_the_process_that_spawned_the_ranks_saves_their_steps(tmp_path, name, code, said):
    """`kill PID` / Ctrl-C of a spawn-preset fit reaches the launching process, not the ranks: it passes the stop
    on, the ranks agree on a step, save it and end; nothing trained is lost (the launcher used to die at once and
    take the ranks with it)."""
    out = _spawned_fit_stopped_by(
        tmp_path, {"name": name, "step": 3, "to": "launcher", "rank": 1}, launcher_sigint=name == "SIGINT"
    )
    assert 3 <= _saved_step(out, code, said) < 50


@pytest.mark.timeout(300)
def test_a_stop_signal_that_reaches_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """SIGTERM to rank 1 alone: the ranks agree at the end of that step, every rank saves and stops there (Lightning's
    own handler broadcast inside the signal handler, and the rank that got it left alone: the others hung)."""
    out = _spawned_fit_stopped_by(tmp_path, {"name": "SIGTERM", "step": 3, "rank": 1})
    assert _saved_step(out, 143, "SIGTERM") == 3
