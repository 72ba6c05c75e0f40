"""Early stopping decided once (on rank 0) and obeyed by every rank; non-finite loss stops all ranks.

Lightning's EarlyStopping votes across ranks: ranks holding different values, or one lacking the metric, hang
(Lightning issue #19045). What rank 0 broadcasts, and the loss check of every step: docs/internals.md, "Callbacks".

YAML (same arguments as Lightning's EarlyStopping)::

    trainer:
      callbacks:
        - class_path: distlab.callbacks.SyncEarlyStopping
          init_args: {monitor: val_loss, patience: 5, mode: min}
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from lightning.pytorch.utilities import rank_zero_info

from distlab.callbacks.rank_zero_validation import RankZeroValidation
from distlab.compat import early_stopping_log, early_stopping_metric_ok, early_stopping_step
from distlab.distributed import all_reduce_sum, broadcast_object, world_info
from distlab.domains import Finite, NonEmptyText, NonNegative, NonNegativeInt, check_domains
from distlab.errors import ConfigError, DistlabError
from distlab.metric_direction import check_monitors_see_validation, mode_against_the_metric


class NonFiniteLossError(DistlabError):
    """The loss was NaN/Inf on at least one rank; every rank raises it at the same step."""


class EarlyStoppingError(DistlabError):
    """Rank 0 could not make the stop decision; every rank raises it at the same point (none waits)."""


def broadcast_from_rank_zero(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (identity on one process). Every rank must call it."""
    return broadcast_object(obj, src=0)


class SyncEarlyStopping(EarlyStopping):
    """Lightning's EarlyStopping arguments; one decision made on rank 0, broadcast to all ranks.

    Args (beyond Lightning's):
        check_finite_loss: every optimizer step, stop all ranks with :class:`NonFiniteLossError` if any
            rank's loss is not finite (checked before the weights are touched).
    """

    def __init__(
        self,
        monitor: NonEmptyText,
        min_delta: NonNegative = 0.0,
        patience: NonNegativeInt = 3,
        verbose: bool = False,
        mode: Literal["min", "max"] = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: Finite | None = None,
        divergence_threshold: Finite | None = None,
        check_on_train_epoch_end: bool | None = None,
        log_rank_zero_only: bool = True,
        check_finite_loss: bool = True,
    ) -> None:
        check_domains(SyncEarlyStopping.__init__, locals())
        if stopping_threshold is not None and divergence_threshold is not None:
            # min: stop when below `stopping`, diverge when above `divergence` (max: the other way round)
            sign = 1 if mode == "min" else -1
            if sign * divergence_threshold <= sign * stopping_threshold:
                raise ConfigError(
                    f"SyncEarlyStopping(mode={mode!r}): divergence_threshold={divergence_threshold} is on the wrong side "
                    f"of stopping_threshold={stopping_threshold}, so every value would stop the fit at the first check; "
                    f"set divergence_threshold {'above' if mode == 'min' else 'below'} stopping_threshold"
                )
        super().__init__(
            monitor=monitor,
            min_delta=min_delta,
            patience=patience,
            verbose=verbose,
            mode=mode,
            strict=strict,
            check_finite=check_finite,
            stopping_threshold=stopping_threshold,
            divergence_threshold=divergence_threshold,
            check_on_train_epoch_end=check_on_train_epoch_end,
            log_rank_zero_only=log_rank_zero_only,
        )
        self.check_finite_loss = check_finite_loss
        against = mode_against_the_metric("SyncEarlyStopping", monitor, mode)
        if against:
            rank_zero_info(f"distlab: note: {against}")
        self.stopped_step = 0
        self._bad_loss: float | None = None
        self._missing_said = False  # the monitored metric missing (strict=False): said once

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit":  # a new fit counts afresh (a resume's checkpoint restores its counts after this)
            self._check_validation_runs(trainer)
            self.wait_count = self.stopped_epoch = self.stopped_step = 0
            self.best_score = torch.tensor(torch.inf if self.monitor_op == torch.lt else -torch.inf)
            self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
            self.stopping_reason_message = None
            self._missing_said = False

    def _check_validation_runs(self, trainer: L.Trainer) -> None:
        """Under Lightning's own validation loop (RankZeroValidation checks its own): the metric must be reported
        at some point of this fit (validation on, and its first run within max_steps)."""
        if any(isinstance(cb, RankZeroValidation) for cb in trainer.callbacks):
            return
        if trainer.limit_val_batches == 0:
            check_monitors_see_validation(trainer, "trainer.limit_val_batches=0 turns validation off")
        interval, batches = trainer.val_check_interval, trainer.max_steps * trainer.accumulate_grad_batches
        if trainer.check_val_every_n_epoch is None and isinstance(interval, int) and 0 < batches < interval:
            check_monitors_see_validation(
                trainer,
                f"trainer.val_check_interval={interval} batches is beyond trainer.max_steps={trainer.max_steps} "
                f"({batches} batches), so validation never runs",
            )

    # ---- the metric decision ---------------------------------------------------------------------
    def _run_early_stopping_check(self, trainer: L.Trainer) -> None:
        if trainer.fast_dev_run:
            return
        decision: dict[str, Any] | None = None
        if trainer.is_global_zero:
            try:
                decision = self._decide(trainer)
            except ConfigError as e:  # the user's setting: the same one-line error on every rank
                decision = {"error": str(e), "config": True}
            except Exception as e:  # noqa: BLE001 - the others must hear of it, or they wait forever
                decision = {"error": f"{type(e).__name__}: {e}"}
        decision = broadcast_from_rank_zero(decision)  # every rank, unconditionally
        if "error" in decision:
            if decision.get("config"):
                raise ConfigError(decision["error"])
            raise EarlyStoppingError(f"early stopping on rank 0 failed: {decision['error']}")
        if decision.get("skip"):
            return
        self.wait_count = decision["wait_count"]
        self.best_score = decision["best_score"].to(self.best_score.device)
        self.stopping_reason = EarlyStoppingReason(decision["stopping_reason"])
        if decision["stop"]:
            trainer.should_stop = True
            self.stopped_epoch = trainer.current_epoch
            self.stopped_step = trainer.global_step
            self.stopping_reason_message = decision["reason"]
            rank_zero_info(  # a run cut short says why, verbose or not
                f"distlab: {type(self).__name__} stopped the fit at step {trainer.global_step}: "
                f"{' '.join(str(decision['reason'] or 'its criterion was met').split())}"
            )
        if decision["reason"] and self.verbose:
            early_stopping_log(self, trainer, decision["reason"], self.log_rank_zero_only)

    def _decide(self, trainer: L.Trainer) -> dict[str, Any]:
        """Rank 0 only: Lightning's criteria on rank 0's metric (local, no collectives)."""
        logged = ", ".join(k for k in trainer.callback_metrics if k not in ("epoch", "step")) or "none"
        if self.strict and self.monitor not in trainer.callback_metrics:
            raise ConfigError(
                f"SyncEarlyStopping(monitor={self.monitor!r}): no metric of that name was logged (logged: "
                f"{logged}); set monitor to one of them, or strict=False to skip while it is missing"
            )
        # not strict, and the metric is missing (Lightning: silent)
        if not early_stopping_metric_ok(self, trainer.callback_metrics):
            if not self._missing_said:
                self._missing_said = True
                rank_zero_info(
                    f"distlab: note: SyncEarlyStopping(monitor={self.monitor!r}, strict=False): no metric of that name "
                    f"was logged at step {trainer.global_step} (logged: {logged}); early stopping "
                    "does nothing until it is"
                )
            return {"skip": True}
        current = trainer.callback_metrics[self.monitor].squeeze()
        should_stop, reason = early_stopping_step(self, current)
        return {
            "stop": bool(should_stop),
            "reason": reason,
            "wait_count": self.wait_count,
            "best_score": self.best_score.detach().cpu(),
            "stopping_reason": self.stopping_reason.value,
        }

    # ---- non-finite loss on any rank ----------------------------------------------------------------
    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor
    ) -> None:
        if self.check_finite_loss and not bool(torch.isfinite(loss.detach()).all()):
            self._bad_loss = float(loss.detach().float().mean())  # with accumulation: any micro-batch counts

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if not self.check_finite_loss:
            return
        world, rank = world_info()
        flags = torch.zeros(world, dtype=torch.float32, device=pl_module.device)  # (world,) one-hot
        flags[rank] = float(self._bad_loss is not None)
        all_reduce_sum(flags)  # one tiny collective per step (nothing on one process)
        flags = flags.cpu()
        self._bad_loss = None
        if bool(flags.any()):
            ranks = [int(r) for r in torch.nonzero(flags).flatten()]
            trainer.should_stop = True
            raise NonFiniteLossError(
                f"non-finite loss on rank {', '.join(map(str, ranks))} at step {trainer.global_step}: all "
                f"{len(flags)} rank(s) stopped before the optimizer step; the last checkpoint written is the last good one"
            )

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "stopped_step": self.stopped_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The run's counters (checks without improvement, the best score) carry on; ``patience``, a setting,
        is the one configured now (Lightning's restore would bring back the checkpoint's: said when they differ)."""
        configured = self.patience
        super().load_state_dict(state_dict)
        if self.patience != configured:
            rank_zero_info(
                f"distlab: note: SyncEarlyStopping keeps patience={configured} as configured (the checkpoint's run had "
                f"{self.patience}); its {self.wait_count} check(s) without improvement so far carry on"
            )
            self.patience = configured
        self.stopped_step = state_dict.get("stopped_step", 0)
