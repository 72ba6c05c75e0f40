"""A resumed fit trains with the optimizer settings its config gives, not those the checkpoint saved.

torch's ``Optimizer.load_state_dict`` restores every param group's settings as saved (lr, weight decay, betas,
momentum; the lr the old schedule reached). :class:`ConfiguredOptimizerSettings` puts the configured settings back
after the restore, the schedule's base rates with them, recomputes the rate from this run's schedule, and says in
one line what changed. The optimizer state proper (moments, buffers, step counts) stays the checkpoint's. The
``distlab`` command adds it to every fit.

Example::

    trainer = L.Trainer(callbacks=[ConfiguredOptimizerSettings()])
    trainer.fit(model, ckpt_path="last.ckpt")   # a changed lr in model's configure_optimizers takes effect
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

# the schedule's base rate where an LR scheduler keeps one (group["initial_lr"]); the rate itself otherwise
_RATES = ("lr", "initial_lr")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):  # (torch.equal: the same shape too)
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _shown(value: Any) -> str:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    return f"{value:.6g}" if isinstance(value, float) else repr(value)


def _scheduled_rates(scheduler: Any) -> list[float] | None:
    """The learning rates ``scheduler`` gives at its current step, from its closed form (LambdaLR: base rate x
    lambda(step); torch's own closed forms), or None for a scheduler that only knows how to take the next step
    from the current rate (ReduceLROnPlateau, chained ones): those keep the checkpoint's rate."""
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        return [
            base * f(scheduler.last_epoch)
            for f, base in zip(scheduler.lr_lambdas, scheduler.base_lrs, strict=True)
        ]
    from distlab.compat import closed_form_lr

    return closed_form_lr(scheduler)


class ConfiguredOptimizerSettings(L.Callback):
    """On a resume, every optimizer param group gets back the settings this run configured (see module docstring)."""

    def __init__(self) -> None:
        self._configured: list[list[dict[str, Any]]] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The optimizers are built and the checkpoint is not restored yet: note each group's settings."""
        self._configured = [
            [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
            for opt in trainer.optimizers
        ]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.ckpt_path or len(self._configured) != len(trainer.optimizers):
            return
        changes = []
        for opt, configured_groups in zip(trainer.optimizers, self._configured, strict=True):
            if len(opt.param_groups) != len(configured_groups):
                continue  # the optimizer's own load_state_dict refuses a mismatch
            schedulers = [c.scheduler for c in trainer.lr_scheduler_configs if c.scheduler.optimizer is opt]
            for i, (group, configured) in enumerate(zip(opt.param_groups, configured_groups, strict=True)):
                name = group.get("name", i)
                for key, value in configured.items():
                    if key in _RATES or key not in group or _same(group[key], value):
                        continue
                    changes.append(f"group {name!r} {key} {_shown(group[key])} -> {_shown(value)}")
                    group[key] = value
                rate = "initial_lr" if "initial_lr" in group and "initial_lr" in configured else "lr"
                old, new = group.get(rate), configured.get(rate)
                if new is None or old is None or _same(old, new):
                    continue
                group[rate] = new
                if rate == "initial_lr":  # the schedule's base: the current rate scales with it
                    group["lr"] = group["lr"] * (new / old) if old else new
                    for scheduler in schedulers:
                        if i < len(getattr(scheduler, "base_lrs", [])):
                            scheduler.base_lrs[i] = new
                what = "lr (the schedule's base)" if rate == "initial_lr" else "lr"
                changes.append(f"group {name!r} {what} {_shown(old)} -> {_shown(new)}")
        for config in trainer.lr_scheduler_configs:  # the rate of the first resumed step: this run's schedule
            scheduler = config.scheduler
            rates = _scheduled_rates(scheduler)
            for i, (group, rate) in enumerate(
                zip(scheduler.optimizer.param_groups, rates or (), strict=False)
            ):
                if not math.isclose(group["lr"], rate, rel_tol=1e-12, abs_tol=0.0):
                    changes.append(
                        f"group {group.get('name', i)!r} lr {_shown(group['lr'])} -> {_shown(rate)} (this run's "
                        f"schedule at step {scheduler.last_epoch})"
                    )
                    group["lr"] = rate
        if changes:
            rank_zero_info(
                "distlab: note: the resumed optimizer keeps its state but takes this run's settings over the "
                f"checkpoint's: {', '.join(changes)}"
            )
