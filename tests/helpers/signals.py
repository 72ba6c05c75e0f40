"""A callback that stops its own process with a signal at one optimizer step, as a scheduler or a user would."""

from __future__ import annotations

import os
import signal

import lightning as L


class SignalSelf(L.Callback):
    """Send ``name`` (``SIGTERM`` or ``SIGINT``) to this process after optimizer step ``step``."""

    def __init__(self, name: str, step: int) -> None:
        self.name, self.step = name, step

    def on_train_start(self, trainer: L.Trainer, *args: object) -> None:
        if (
            self.name == "SIGINT"
        ):  # Ctrl-C at a terminal: a job started in the background (`cmd &`, as a CI script
            # may run the suite) inherits SIGINT ignored, and Python then raises no KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), getattr(signal, self.name))
