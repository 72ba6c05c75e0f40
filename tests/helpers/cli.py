"""Helpers to run the distlab CLI in-process or as a subprocess, in a temporary run directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
LAUNCH_VARS = (
    "MASTER_PORT",
    "MASTER_ADDR",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
)


def write_yaml(path: Path, data: dict) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return str(path)


def rank_weights_config(tmp_path: Path, weights_dir: Path, extra_trainer: dict | None = None) -> str:
    """A config fragment that adds SaveRankWeights (and a private run dir) to a fit."""
    trainer = {
        "default_root_dir": str(tmp_path / "run"),
        "callbacks": [
            {
                "class_path": "tests.helpers.callbacks.SaveRankWeights",
                "init_args": {"dirpath": str(weights_dir)},
            }
        ],
        **(extra_trainer or {}),
    }
    return write_yaml(tmp_path / "extra.yaml", {"trainer": trainer})


def subprocess_env() -> dict:
    """This environment minus any launcher's rendezvous variables: a child process starts its own job."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith("TORCHELASTIC_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_subprocess(args: list[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, cwd=cwd or REPO, env=subprocess_env(), capture_output=True, text=True, timeout=timeout
    )


def distlab_exe() -> list[str]:
    exe = Path(sys.executable).parent / "distlab"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "distlab"]
