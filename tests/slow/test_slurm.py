"""SLURM on a CPU machine: the real batch script (scripts/slurm.sbatch) under simulated SLURM variables,
with `srun` and `scontrol` replaced by two small fakes (one node; requeue recorded). And the launcher
matching for both SLURM layouts: one srun task per process, and one torchrun per node.

Preemption: SIGUSR1 to the batch script (what `--signal=B:USR1@120` sends) -> every rank saves last.ckpt
and stops -> the script requeues the job -> the requeued job (SLURM_RESTART_COUNT=1) resumes by itself
and ends with the weights of an uninterrupted run, bit for bit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from distlab.errors import ConfigError
from distlab.launch import reconcile_trainer_config
from tests.helpers.callbacks import load_rank_weights
from tests.helpers.cli import CONFIGS, REPO, subprocess_env, write_yaml
from tests.helpers.dist import free_port

STEPS = 60
FAKE_SRUN = """#!/usr/bin/env bash
# fake srun, one node: drop srun's options, run the task with the variables srun would set
while [[ $# -gt 0 && "$1" == --* ]]; do shift; done
export SLURM_NTASKS=${SLURM_JOB_NUM_NODES:-1} SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_STEP_ID=0
exec "$@"
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
# fake scontrol: hostnames -> this machine; anything else (requeue) is recorded
case "$1 $2" in
  "show hostnames") echo 127.0.0.1 ;;
  *) echo "$*" >> "$FAKE_SLURM_LOG" ;;
esac
"""


def sbatch(tmp_path: Path, run: str, restart_count: int = 0, preempt_on: str | None = None):
    """Run scripts/slurm.sbatch as SLURM would on one node with 2 CPU processes; SIGUSR1 it once its
    output shows ``preempt_on``. Returns (exit code, output)."""
    bin_dir = tmp_path / "fake_slurm"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    extra = {
        "trainer": {
            "default_root_dir": str(tmp_path / run),
            "callbacks": [
                {
                    "class_path": "tests.helpers.callbacks.SaveRankWeights",
                    "init_args": {"dirpath": str(tmp_path / run / "weights")},
                },
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"filename": "last", "every_n_train_steps": 2, "save_top_k": 1},
                },
                {  # marks step 2 in the output: the test preempts the job there
                    "class_path": "tests.helpers.callbacks.PrintAtStep",
                    "init_args": {"step": 2, "text": "test: step 2 checkpointed"},
                },
            ],
        }
    }
    env = {
        **subprocess_env(),
        "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "node[1]",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NAME": "distlab",
        "SLURM_GPUS_ON_NODE": "1",
        "SLURM_RESTART_COUNT": str(restart_count),
        "NPROC": "2",
        "RDZV_PORT": str(free_port()),
        "DISTLAB_STOP_FILE": str(tmp_path / "stop_requested"),
        "FAKE_SLURM_LOG": str(tmp_path / "scontrol.log"),
    }
    args = ["bash", "scripts/slurm.sbatch", str(CONFIGS / "debug.yaml"), "--config"]
    args += [write_yaml(tmp_path / f"{run}.yaml", extra), f"--trainer.max_steps={STEPS}"]
    job = subprocess.Popen(
        args,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )

    killer = threading.Timer(200, lambda: os.killpg(job.pid, signal.SIGKILL))  # the hang bound
    killer.start()
    lines, signalled = [], False
    try:
        for line in job.stdout:  # the job's own output is the clock: no polling
            lines.append(line)
            if preempt_on and not signalled and preempt_on in line:
                job.send_signal(signal.SIGUSR1)  # the scheduler's warning, after that checkpoint
                signalled = True
        job.wait()
    finally:
        killer.cancel()
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return job.returncode, "".join(lines)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_preempted_job_is_requeued_and_resumes_bit_identically(tmp_path):
    code, out = sbatch(tmp_path, "uninterrupted")
    assert code == 0, out[-4000:]
    reference = load_rank_weights(tmp_path / "uninterrupted" / "weights", 2)

    run = tmp_path / "preempted"
    code, out = sbatch(tmp_path, "preempted", preempt_on="test: step 2 checkpointed")
    assert code == 0, out[-4000:]
    assert "stop requested (SIGUSR1)" in out and "a requeued job resumes from it" in out, out[-4000:]
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    stopped_at = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 2 <= stopped_at < STEPS

    code, out = sbatch(tmp_path, "preempted", restart_count=1)  # what SLURM runs after the requeue
    assert code == 0, out[-4000:]
    assert "restart 1 of this job: resuming from " in out
    ranks = load_rank_weights(run / "weights", 2)
    assert [len(r["losses"]) for r in ranks] == [STEPS - stopped_at] * 2  # it went on, not over
    for r, (got, want) in enumerate(zip(ranks, reference, strict=True)):
        for k, v in want["state"].items():
            assert torch.equal(got["state"][k], v), f"rank {r} differs from the uninterrupted run at {k}"


SRUN_PER_TASK = {"SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_JOB_NAME": "train"}
TORCHRUN_PER_NODE = {  # srun started one torchrun per node; torchrun started 4 workers on each
    "SLURM_NTASKS": "2",
    "SLURM_JOB_NAME": "train",
    "TORCHELASTIC_RUN_ID": "4242",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
}


@pytest.mark.parametrize(
    "env", [SRUN_PER_TASK, TORCHRUN_PER_NODE], ids=["srun-per-task", "torchrun-per-node"]
)
def test_both_slurm_layouts_match_the_trainer(env):
    config = {"devices": "auto", "num_nodes": 1, "strategy": "auto"}
    notes = reconcile_trainer_config(config, env)
    assert (config["devices"], config["num_nodes"], config["strategy"]) == (4, 2, "ddp_optimizer_sync")
    assert notes == ["devices=4", "num_nodes=2", "strategy=ddp_optimizer_sync"]
    said = (
        "SLURM says the job has 8 tasks .4 per node"
        if env is SRUN_PER_TASK
        else "started 8 processes .4 per node."
    )
    with pytest.raises(ConfigError, match=f"{said}.* but the trainer asks for devices=2"):
        reconcile_trainer_config({"devices": 2}, env)
