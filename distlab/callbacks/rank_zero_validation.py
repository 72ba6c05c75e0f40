"""Validation with exact metrics, for any LightningModule, that never hangs the other ranks.

Lightning's loop pads the ranks' shards with duplicates, reports each rank's partial ``self.log`` value without
``sync_dist``, and hangs on rank-0-only code that reaches a collective. This callback runs validation itself
(:mod:`distlab.callbacks.exact_eval`) every ``every_n_steps`` optimizer steps on every rank, and under
``trainer.validate()`` / ``trainer.test()`` (``distlab validate|test``): see docs/internals.md, "Callbacks".

Your module needs nothing special: whatever its ``validation_step`` / ``on_validation_epoch_end`` log
with ``self.log`` / ``self.log_dict`` (tensors, numbers, torchmetrics ``Metric`` / ``MetricCollection``)
is reported under the names you logged, with Lightning's epoch aggregation, plus ``val_time_s``.
Modes: ``auto``, the default, is ``distributed`` when the parameters are sharded (FSDP2: a forward needs every
rank), ``rank_zero`` otherwise.

YAML::

    trainer:
      callbacks:
        - class_path: distlab.callbacks.RankZeroValidation
          init_args: {every_n_steps: 100, mode: auto}
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info

from distlab.callbacks.exact_eval import EvalData, ExactEvaluator
from distlab.compat import (
    check_early_stopping_on_validation,
    counting_this_batch,
    defer_epoch_end_checkpoint,
    eval_loop_data_source,
    patch,
    print_eval_results,
    unpatch,
)
from distlab.distributed import has_sharded_params, is_distributed, new_group, unshare_tensors
from distlab.domains import PositiveInt, TimeoutSeconds, check_domains
from distlab.errors import ConfigError
from distlab.log import sync_dist_advice_silenced
from distlab.metric_direction import check_monitors_see_validation

ValidationMode = Literal["auto", "rank_zero", "distributed"]
__all__ = ["RankZeroValidation", "ValidationMode"]


# The group waiting ranks block in while rank 0 validates: every rank, with its own generous timeout, so a long
# validation never trips the main process group's (collective: every rank calls it).
wait_group = new_group


class RankZeroValidation(L.Callback):
    """Exact validation every ``every_n_steps`` (and at the last step); see the module docstring.

    Args:
        every_n_steps: validate after every this many optimizer steps (and at ``max_steps``).
        mode: ``auto``, ``rank_zero`` (rank 0 does all the work) or ``distributed`` (disjoint shards, exact reductions).
        wait_timeout_s: how long waiting ranks may wait for rank 0's results (a dedicated process group).
    """

    # (a data module with an endless epoch asks whether some callback validates by steps)
    validates_on_steps = True

    def __init__(
        self,
        every_n_steps: PositiveInt = 100,
        mode: ValidationMode = "auto",
        wait_timeout_s: TimeoutSeconds = 6 * 3600.0,
    ) -> None:
        check_domains(RankZeroValidation.__init__, locals())
        self.every_n_steps, self.mode, self.wait_timeout_s = every_n_steps, mode, wait_timeout_s
        self._group = None
        self._last_step = -1
        self._nothing_logged_said = False  # a validation_step that logs no metric: said once per fit
        self._limit_val_batches: Any = None
        self._patched_loop: Any = None  # Lightning's validate/test loop whose run() this stands in for
        self._advance_end: Any = None  # Lightning's training epoch loop, whose on_advance_end validates first
        self.history: list[dict[str, float]] = []
        self._unlogged: set[str] = set()  # the last evaluation's names logged with logger=False
        self._samples: list[int] = []  # and its samples per loader

    # ---- set-up: every rank ----------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        unshare_tensors(pl_module)  # under Lightning's ddp_spawn too: metric states must be per rank
        if is_distributed() and self._group is None:
            self._group = wait_group(self.wait_timeout_s)
        key = "limit_test_batches" if stage == "test" else "limit_val_batches"
        limit = getattr(trainer, key)
        # (fast_dev_run: its own limit)
        whole = limit == 0 or (isinstance(limit, float) and limit == 1.0) or trainer.fast_dev_run
        if stage in ("fit", "validate", "test") and not whole:
            raise ConfigError(  # Lightning would print "N batches will be used", and the whole set would be
                f"trainer.{key}={limit}: RankZeroValidation evaluates the whole set exactly, so the limit would not "
                f"apply; remove trainer.{key} (or evaluate a smaller validation set)"
            )
        if stage == "fit":
            if limit == 0:
                check_monitors_see_validation(trainer, "trainer.limit_val_batches=0 turns validation off")
            # Lightning's own loop would validate a second time, with padding: turn it off for this fit, and
            # validate where it would have (after every on_train_batch_end hook, the module's included).
            self._limit_val_batches, trainer.limit_val_batches = trainer.limit_val_batches, 0
            self._advance_end = trainer.fit_loop.epoch_loop
            after_batch_hooks = self._advance_end.on_advance_end

            def validate_then_advance_end(*args: Any, **kwargs: Any) -> Any:
                self._validate_if_due(trainer, pl_module)
                return after_batch_hooks(*args, **kwargs)

            patch(self._advance_end, "on_advance_end", validate_then_advance_end)
            for cb in trainer.callbacks:  # act on our validations, not at train-epoch end
                if isinstance(cb, ModelCheckpoint):
                    defer_epoch_end_checkpoint(cb)
            return
        if stage in ("validate", "test"):  # trainer.validate / trainer.test: run the same exact evaluation
            self._patched_loop = trainer.validate_loop if stage == "validate" else trainer.test_loop
            patch(self._patched_loop, "run", lambda: self._run_loop(trainer, pl_module, stage))

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Lightning's loops and ``limit_val_batches`` as they were, for the Trainer's next fit or evaluation."""
        if self._limit_val_batches is not None:
            trainer.limit_val_batches, self._limit_val_batches = self._limit_val_batches, None
        if self._patched_loop is not None:
            unpatch(self._patched_loop, "run")
            self._patched_loop = None
        if self._advance_end is not None:
            unpatch(self._advance_end, "on_advance_end")
            self._advance_end = None

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self.teardown(trainer, pl_module, "")  # (Lightning calls no teardown hook after a fit that raised)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Early stopping decides after each of our validations (we call its on_validation_end), never at a
        # train-epoch end: there no new validation happened, and patience would count a stale value again.
        for cb in trainer.callbacks:
            if isinstance(cb, EarlyStopping):
                check_early_stopping_on_validation(cb)
        self._resolved_mode(pl_module)  # a refused mode fails now, before any training step
        self._data(trainer, "validation")
        self._last_step = trainer.global_step  # resumed runs do not re-validate the restored step
        self._nothing_logged_said = False

    # ---- trigger: every rank reaches the same global step ----------------------------------------
    def _validate_if_due(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Where Lightning's loop validates: after the callbacks' and the module's ``on_train_batch_end`` (an EMA
        the module updates there is validated as updated), before plateau schedulers step. A fit asked to stop in
        this step (a signal, a non-finite loss) ends without one."""
        step = trainer.global_step
        due = step % self.every_n_steps == 0 or (trainer.max_steps > 0 and step >= trainer.max_steps)
        if self._limit_val_batches == 0 or trainer.should_stop:  # turned off, or stopping
            return
        if step > self._last_step and due:
            self._last_step = step
            # a checkpoint this validation saves resumes at the next step
            with counting_this_batch(trainer):
                self.validate(trainer, pl_module)

    def validate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        """Run one validation on every rank (collectively); returns the metrics every rank received."""
        # before the evaluation, which leaves FSDP2's parameters unsharded
        mode = self._resolved_mode(pl_module)
        results = self._evaluate(trainer, pl_module, "validation", mode)
        self._publish(trainer, results)
        shown = ", ".join(f"{k} {v:.4f}" for k, v in results.items() if not k.endswith("_time_s"))
        if not shown and not self._nothing_logged_said:  # said once: the line below would be empty
            self._nothing_logged_said = True
            rank_zero_info(
                f"distlab: note: RankZeroValidation: {type(pl_module).__name__}.validation_step logged no metric "
                "(self.log), so each validation has nothing to report or to monitor; log one, e.g. "
                "self.log('val_loss', loss)"
            )
        rank_zero_info(
            f"step {trainer.global_step}: {shown} ({mode} validation of "
            f"{' + '.join(str(n) for n in self._samples)} samples, "
            f"{results['val_time_s']:.1f}s)"
        )
        self.history.append({"step": trainer.global_step, **results})
        # Let monitor-based callbacks react exactly as after Lightning's own validation loop, which refuses a
        # ModelCheckpoint whose monitor no validation logged (it would save nothing, with only a warning).
        for cb in trainer.callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.monitor and cb.monitor not in trainer.callback_metrics:
                raise ConfigError(
                    f"ModelCheckpoint(monitor={cb.monitor!r}): validation logged no {cb.monitor!r} (logged: "
                    f"{sorted(trainer.callback_metrics)}), so no checkpoint would be saved; self.log({cb.monitor!r}, "
                    "...) in validation_step, or monitor a metric it logs"
                )
        for cb in trainer.callbacks:
            if isinstance(cb, (ModelCheckpoint, EarlyStopping)):
                cb.on_validation_end(trainer, pl_module)
        return results

    # ---- the pieces ------------------------------------------------------------------------------
    def _resolved_mode(self, pl_module: L.LightningModule) -> str:
        sharded = has_sharded_params(pl_module)
        if self.mode == "auto":
            return "distributed" if sharded else "rank_zero"
        if self.mode == "rank_zero" and sharded and is_distributed():
            raise ConfigError(
                "RankZeroValidation mode 'rank_zero' cannot run with sharded parameters (FSDP2): a forward needs "
                "every rank's shards; set mode: distributed (or auto)"
            )
        return self.mode

    def _data(self, trainer: L.Trainer, stage: str) -> list[EvalData]:
        """The evaluation set from wherever Lightning would take it (DataModule, module hook, or loaders passed in)."""
        step = "validation_step" if stage == "validation" else "test_step"
        # none of its own (Lightning skips its loop without one; ours would report an empty evaluation)
        if getattr(type(trainer.lightning_module), step) is getattr(L.LightningModule, step):
            raise ConfigError(
                f"RankZeroValidation: {type(trainer.lightning_module).__name__} has no {step}, so there is nothing to "
                f"evaluate; define {step} (logging its metrics with self.log), or remove RankZeroValidation"
            )
        if stage == "test":
            loop = trainer.test_loop
        elif trainer.state.fn == TrainerFn.VALIDATING:
            loop = trainer.validate_loop
        else:
            loop = trainer.fit_loop.epoch_loop.val_loop
        source = eval_loop_data_source(loop)  # what Lightning's own loop would iterate
        hook = "val_dataloader" if stage == "validation" else "test_dataloader"
        if not source.is_defined():
            raise ConfigError(
                f"RankZeroValidation needs {stage} data: define {hook}() or pass the dataloader to the Trainer"
            )
        data = EvalData.from_loaders(source.dataloader(), f"the {hook}")
        # fast_dev_run, a quick check that everything runs: as many batches as Lightning's loop would
        if trainer.fast_dev_run:
            data = [d.first(int(trainer.fast_dev_run)) for d in data]
        return data

    def _evaluate(
        self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str, mode: str | None = None
    ) -> dict[str, float]:
        mode = mode or self._resolved_mode(pl_module)
        evaluator = ExactEvaluator(pl_module, stage, self._data(trainer, stage), mode, trainer, self._group)
        with sync_dist_advice_silenced():  # the values it would have the user sync are exact here
            results = evaluator.run()
        self._unlogged, self._samples = evaluator.unlogged, [len(d.dataset) for d in evaluator.data]
        return results

    def _publish(self, trainer: L.Trainer, results: dict[str, float]) -> dict[str, float]:
        """Identical on every rank (rank 0's numbers), so any callback may monitor any of them; the loggers get
        those not logged with ``logger=False`` (returned, as Lightning's loop returns them)."""
        for name, value in results.items():
            trainer.callback_metrics[name] = torch.tensor(value)
        logged = {k: v for k, v in results.items() if k not in self._unlogged}
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(logged, step=trainer.global_step)
        return logged

    def _run_loop(
        self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str
    ) -> list[dict[str, float]]:
        """Stands in for Lightning's validate/test loop ``run()``: the exact evaluation, printed and returned as Lightning does."""
        results = self._publish(
            trainer, self._evaluate(trainer, pl_module, "validation" if stage == "validate" else "test")
        )
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.save()
            if self._patched_loop is not None and self._patched_loop.verbose:
                print_eval_results([results], stage)
        return [results]

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self._last_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._last_step = state_dict.get("last_step", -1)
