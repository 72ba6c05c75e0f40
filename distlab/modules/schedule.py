"""Learning-rate multipliers: linear warmup, then cosine decay or constant + linear warmdown."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import torch

from distlab.errors import ConfigError

ScheduleName = Literal["cosine", "linear", "constant"]


def lr_multiplier(
    step: int,
    total_steps: int,
    warmup_steps: int = 0,
    schedule: ScheduleName = "linear",
    warmdown_ratio: float = 0.4,
    min_lr_ratio: float = 0.0,
) -> float:
    """Multiplier in [min_lr_ratio, 1] for optimizer step ``step`` (0-based) of ``total_steps``.

    - warmup: linear from 1/warmup to 1 over ``warmup_steps``;
    - "cosine": cosine from 1 to ``min_lr_ratio`` over the remaining steps;
    - "linear": constant 1, then linear to ``min_lr_ratio`` over the last ``warmdown_ratio`` of steps
      (the nanochat / modded-nanogpt "warmdown");
    - "constant": 1 after warmup.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "linear":
        warmdown = max(1, round(warmdown_ratio * total_steps))
        start = total_steps - warmdown
        if step < start:
            return 1.0
        progress = min(1.0, (step - start) / warmdown)
        return 1.0 - (1.0 - min_lr_ratio) * progress
    raise ConfigError(f"model.schedule must be one of cosine, linear, constant; got {schedule!r}")


def stepped_schedule(optimizer: torch.optim.Optimizer, max_steps: int | None, hparams: Mapping) -> dict:
    """Lightning's ``configure_optimizers`` answer: ``optimizer`` with :func:`lr_multiplier` applied at every
    optimizer step of ``max_steps``, its settings read from a module's ``hparams`` (those it has of warmup_steps,
    schedule, warmdown_ratio, min_lr_ratio)."""
    settings = ("warmup_steps", "schedule", "warmdown_ratio", "min_lr_ratio")
    kwargs = {name: hparams[name] for name in settings if name in hparams}
    if max_steps is None or max_steps < 1:
        raise ConfigError(
            f"trainer.max_steps must be a positive integer (the LR schedule needs it), got {max_steps}"
        )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, max_steps, **kwargs)
    )
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
