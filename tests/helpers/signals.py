"""A callback that sends a stop signal at one optimizer step, as a scheduler, a launcher or a user would."""

from __future__ import annotations

import os
import signal

import lightning as L


class SignalSelf(L.Callback):
    """Send ``name`` (``SIGTERM`` or ``SIGINT``) after optimizer step ``step``: to this process, or with
    ``to="launcher"`` to the process that spawned the ranks (as ``kill PID`` of the command a user started does);
    ``rank``: only on that global rank (a signal that reaches one rank only), else on every rank."""

    def __init__(self, name: str, step: int, to: str = "self", rank: int | None = None) -> None:
        self.name, self.step, self.to, self.rank = name, step, to, rank

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if (
            self.name == "SIGINT"
        ):  # Ctrl-C at a terminal: a job started in the background (`cmd &`, as a CI script
            # may run the suite) inherits SIGINT ignored, and Python then raises no KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            os.kill(launcher_pid() if self.to == "launcher" else os.getpid(), getattr(signal, self.name))


def launcher_pid() -> int:
    """The process that started this rank: its parent, or a forkserver rank's parent's parent."""
    parent = os.getppid()
    with open(f"/proc/{parent}/cmdline", "rb") as f:
        if b"forkserver" not in f.read():
            return parent
    with open(f"/proc/{parent}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])  # the field after the state: its parent's pid
