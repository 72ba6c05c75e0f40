"""Make one rank fail on purpose at one step, to see a job fail loudly or recover as it should.

Off unless configured. Kinds:
  crash    - the rank raises :class:`InjectedFault` (a Python exception on one rank only)
  sigkill  - the rank's process is killed with SIGKILL (no Python cleanup, as an OOM kill would)
  nan      - the rank's first parameter becomes NaN, so its loss is NaN from that step on

It fires in the first attempt of a job only (``TORCHELASTIC_RESTART_COUNT`` / ``SLURM_RESTART_COUNT``
unset or 0), so a job restarted by ``torchrun --max-restarts`` or a SLURM requeue runs on undisturbed.

From the environment, ``DISTLAB_FAULT=kind:rank:step`` (the global rank, the optimizer step about to run; the
``distlab`` CLI adds the callback: docs/guide.md, section 4, runs one), or in a config::

    trainer:
      callbacks:
        - class_path: distlab.callbacks.FaultInjection
          init_args: {kind: sigkill, rank: 1, step: 3}
"""

from __future__ import annotations

import os
import signal
from typing import Literal

import lightning as L
import torch

from distlab.domains import NonNegativeInt, check_domains
from distlab.errors import ConfigError, DistlabError
from distlab.launch import restart_count

FaultKind = Literal["crash", "sigkill", "nan"]
ENV_VAR = "DISTLAB_FAULT"


class InjectedFault(DistlabError):
    """The failure FaultInjection was asked for."""


class FaultInjection(L.Callback):
    """Fail ``rank`` at optimizer step ``step`` the way ``kind`` says (see the module docstring)."""

    def __init__(self, kind: FaultKind, rank: NonNegativeInt, step: NonNegativeInt) -> None:
        check_domains(FaultInjection.__init__, locals())
        self.kind, self.rank, self.step = kind, rank, step
        self._fired = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """A fault that could never fire is a one-line error on every rank, not a silent no-op."""
        if stage != "fit":
            return
        if self.rank >= trainer.world_size:
            raise ConfigError(
                f"FaultInjection rank={self.rank} is not in this job of {trainer.world_size} rank(s); set a rank "
                f"below {trainer.world_size}, or it never fires"
            )
        if trainer.max_steps >= 0 and self.step >= trainer.max_steps:
            raise ConfigError(
                f"FaultInjection step={self.step} is not before trainer.max_steps={trainer.max_steps}; set a step "
                "the job reaches, or it never fires"
            )

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> FaultInjection | None:
        """The callback ``DISTLAB_FAULT=kind:rank:step`` asks for, or None when it is unset."""
        spec = (os.environ if env is None else env).get(ENV_VAR, "").strip()
        if not spec:
            return None
        parts = spec.split(":")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            raise ConfigError(f"{ENV_VAR}={spec!r} is not kind:rank:step; set e.g. {ENV_VAR}=crash:1:3")
        return cls(parts[0], int(parts[1]), int(parts[2]))

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int
    ) -> None:
        if self._fired or trainer.global_rank != self.rank or trainer.global_step != self.step:
            return
        if restart_count() > 0:
            return  # the launcher restarted the job: let it recover
        self._fired = True
        if self.kind == "crash":
            raise InjectedFault(
                f"injected crash on rank {self.rank} at step {self.step} ({ENV_VAR} / FaultInjection)"
            )
        if self.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        with torch.no_grad():
            next(pl_module.parameters()).fill_(float("nan"))
