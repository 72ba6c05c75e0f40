"""Save and stop when the scheduler asks (a SLURM job near its time limit, a preemption), so that the
requeued job resumes where this one stopped.

The batch script turns the scheduler's signal into a file (``scripts/slurm.sbatch``: SIGUSR1 ->
``touch $DISTLAB_STOP_FILE``), because under torchrun the signal reaches the batch shell, not the
training processes. Every ``every_n_steps`` optimizer steps each rank looks for the file and the ranks
agree (one tiny all_reduce, so they stop at the same step even if the file shows up on one node
first); then every rank saves ``last.ckpt`` in the checkpoint folder and training stops. The requeued
job sees ``SLURM_RESTART_COUNT`` > 0 and the ``distlab`` CLI resumes from that checkpoint.

The CLI adds this callback when ``DISTLAB_STOP_FILE`` is set; in a config::

    trainer:
      callbacks:
        - class_path: distlab.callbacks.CheckpointOnStopRequest
          init_args: {stop_file: runs/x/STOP}
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from distlab.distributed import all_reduce

ENV_VAR = "DISTLAB_STOP_FILE"


class CheckpointOnStopRequest(L.Callback):
    """When ``stop_file`` exists on any rank: all ranks save ``last.ckpt`` and stop (see the module docstring)."""

    def __init__(self, stop_file: str, every_n_steps: int = 1) -> None:
        self.stop_file, self.every_n_steps = str(stop_file), max(1, int(every_n_steps))
        self.saved_path: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> CheckpointOnStopRequest | None:
        path = (os.environ if env is None else env).get(ENV_VAR, "").strip()
        return cls(path) if path else None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx
    ) -> None:
        if trainer.global_step % self.every_n_steps or self.saved_path is not None:
            return
        asked = torch.tensor([float(os.path.exists(self.stop_file))], device=pl_module.device)
        if all_reduce(asked, "max").item() == 0:  # every rank takes part: one decision for all
            return
        folder = Path(trainer.checkpoint_callback.dirpath) if trainer.checkpoint_callback else None
        folder = folder or Path(trainer.default_root_dir) / "checkpoints"
        self.saved_path = str(folder / "last.ckpt")
        trainer.save_checkpoint(self.saved_path)  # collective: the optimizer's shards are gathered
        trainer.should_stop = True
        rank_zero_info(
            f"distlab: stop requested ({self.stop_file}): saved {self.saved_path} at step {trainer.global_step}; "
            "a requeued job resumes from it"
        )
