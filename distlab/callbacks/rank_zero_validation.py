"""Validation with exact metrics that never hangs the other ranks.

Lightning's validation loop shards the set with a DistributedSampler that pads with duplicates
(biasing metrics when len % world != 0), and any rank-0-only code that touches a collective
(``self.log(sync_dist=True)``, a torchmetrics sync, a checkpoint barrier) hangs the job. This
callback runs validation itself, every ``every_n_steps`` optimizer steps, on every rank at the
same step, and lets the results land in every rank's ``trainer.callback_metrics`` *before*
ModelCheckpoint / EarlyStopping read them (Lightning issue #19045: those callbacks vote across ranks).

Modes (``auto``, the default: ``distributed`` when the parameters are sharded, e.g. FSDP2, where a
forward needs every rank; ``rank_zero`` otherwise):
- ``rank_zero``: rank 0 validates the full set (each window exactly once) with local reductions
  only; the other ranks do no work and wait in ONE broadcast of the results. The wait happens on a
  dedicated process group with a long timeout (``wait_timeout_s``), so a long validation does not
  trip the main process group's timeout.
- ``distributed``: every rank validates a disjoint contiguous shard (no padding, no duplicates);
  the metric's sum states are all-reduced. Same numbers, 1/N of the time. Every rank runs the same
  number of forward passes (a rank with a shorter shard runs one extra, uncounted batch), so models
  whose forward is itself collective (FSDP2) cannot go out of step.

Contract: the LightningModule's ``validation_step`` updates a torchmetrics Metric stored at
``metric_attr`` (default ``val_metrics``) whose states are all sums; ``compute()`` returns a tensor
or a dict of tensors, logged as ``{prefix}_{name}``. GPTLightningModule follows it.

YAML::

    trainer:
      callbacks:
        - class_path: distlab.callbacks.RankZeroValidation
          init_args: {every_n_steps: 100, mode: rank_zero}
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Literal

import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset, Subset
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_sum

from distlab.errors import ConfigError
from distlab.gloo import broadcast_object, hold_until_released

ValidationMode = Literal["auto", "rank_zero", "distributed"]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def shard_indices(n: int, rank: int, world: int) -> range:
    """Contiguous, disjoint, covering: rank r gets [r*n//W, (r+1)*n//W). No padding, no duplicates."""
    return range(rank * n // world, (rank + 1) * n // world)


def _has_sharded_params(module: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


@torch.no_grad()
def accumulate_metric(
    pl_module: L.LightningModule,
    loader: DataLoader,
    metric: Metric,
    trainer=None,
    n_batches: int | None = None,
) -> int:
    """Run ``validation_step`` over ``loader`` (eval mode, no grad) so it updates ``metric``; returns batches.

    ``n_batches`` larger than the loader's length adds uncounted passes over its first batch (the metric
    is restored afterwards), so every rank runs the same number of forwards.
    """
    was_training = pl_module.training
    pl_module.eval()
    ctx = (
        trainer.precision_plugin.val_step_context()
        if trainer is not None
        else torch.autocast("cpu", enabled=False)
    )
    n = 0
    try:
        with ctx:
            first = None
            for i, batch in enumerate(loader):
                batch = move_data_to_device(batch, pl_module.device)
                first = batch if first is None else first
                pl_module.validation_step(batch, i)
                n += 1
            for i in range(n, n_batches or 0):  # padding passes: run the forward, keep the metric unchanged
                saved = {name: getattr(metric, name).clone() for name in metric._defaults}
                if first is None:
                    first = move_data_to_device(next(iter(loader_of_one(loader))), pl_module.device)
                pl_module.validation_step(first, i)
                for name, value in saved.items():
                    setattr(metric, name, value)
    finally:
        pl_module.train(was_training)
    return n


def loader_of_one(loader: DataLoader) -> DataLoader:
    """A loader over the first sample of ``loader``'s dataset (for a rank whose shard is empty)."""
    base = loader.dataset.dataset if isinstance(loader.dataset, Subset) else loader.dataset
    return DataLoader(Subset(base, [0]), batch_size=1, collate_fn=loader.collate_fn)


def compute_local(metric: Metric) -> dict[str, float]:
    """``metric.compute()`` with torchmetrics' cross-rank sync switched off (it is a collective: on rank 0
    alone it would wait forever). ``distributed_available_fn`` is torchmetrics' documented switch."""
    available = metric.distributed_available_fn
    metric.distributed_available_fn = lambda: False
    try:
        metric._computed = None
        value = metric.compute()
    finally:
        metric.distributed_available_fn = available
    values = value if isinstance(value, dict) else {"": value}
    return {k: float(v) for k, v in values.items()}


def all_reduce_sum_states(metric: Metric, group=None) -> None:
    """Sum every state of ``metric`` across ranks in place (exact for sum-states)."""
    for name in metric._defaults:
        if metric._reductions[name] is not dim_zero_sum:
            raise ConfigError(
                f"distributed exact validation needs sum states, but {type(metric).__name__}.{name} is reduced with "
                f"{metric._reductions[name]}; use mode: rank_zero"
            )
        state = getattr(metric, name)
        reduced = state.detach().clone()
        with hold_until_released(reduced, group=group):
            dist.all_reduce(reduced, group=group)
        setattr(metric, name, reduced)


class RankZeroValidation(L.Callback):
    """Exact validation every ``every_n_steps`` (and at the last step); see the module docstring.

    Args:
        every_n_steps: validate after every this many optimizer steps (and at ``max_steps``).
        mode: ``auto``, ``rank_zero`` (rank 0 does all the work) or ``distributed`` (disjoint shards, sums reduced).
        metric_attr: attribute of the LightningModule holding the torchmetrics Metric validation_step updates.
        prefix: logged names are ``{prefix}_{name}`` (e.g. ``val_bpb``).
        wait_timeout_s: how long waiting ranks may wait for rank 0's results (a dedicated process group).
    """

    def __init__(
        self,
        every_n_steps: int = 100,
        mode: ValidationMode = "auto",
        metric_attr: str = "val_metrics",
        prefix: str = "val",
        wait_timeout_s: float = 6 * 3600.0,
    ) -> None:
        if every_n_steps < 1:
            raise ConfigError(f"RankZeroValidation.every_n_steps must be >= 1, got {every_n_steps}")
        if mode not in ("auto", "rank_zero", "distributed"):
            raise ConfigError(
                f"RankZeroValidation.mode must be 'auto', 'rank_zero' or 'distributed', got {mode!r}"
            )
        self.every_n_steps, self.mode = every_n_steps, mode
        self.metric_attr, self.prefix, self.wait_timeout_s = metric_attr, prefix, wait_timeout_s
        self._group = None
        self._dataset: Dataset | None = None
        self._loader_kwargs: dict[str, Any] = {}
        self._last_step = -1
        self.history: list[dict[str, float]] = []

    # ---- set-up: every rank, before training ---------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.limit_val_batches != 0:
            rank_zero_info(
                "RankZeroValidation runs validation itself: Lightning's validation loop is turned off"
            )
            trainer.limit_val_batches = 0
        if _distributed() and self._group is None:
            # Waiting ranks block here while rank 0 validates: give them their own generous timeout.
            self._group = dist.new_group(
                backend=dist.get_backend(), timeout=timedelta(seconds=self.wait_timeout_s)
            )

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not isinstance(getattr(pl_module, self.metric_attr, None), Metric):
            raise ConfigError(
                f"RankZeroValidation needs a torchmetrics Metric at {type(pl_module).__name__}.{self.metric_attr}; "
                "set metric_attr to the metric your validation_step updates"
            )
        dm = trainer.datamodule
        if dm is None or not hasattr(dm, "val_dataloader"):
            raise ConfigError("RankZeroValidation needs a LightningDataModule with val_dataloader()")
        loader = dm.val_dataloader()
        if not hasattr(loader.dataset, "__len__"):
            raise ConfigError("RankZeroValidation needs a map-style validation dataset (with __len__)")
        sharded = _has_sharded_params(pl_module)
        if self.mode == "auto":
            self.mode = "distributed" if sharded else "rank_zero"
        elif self.mode == "rank_zero" and sharded and _distributed():
            raise ConfigError(
                "RankZeroValidation mode 'rank_zero' cannot run with sharded parameters (FSDP2): a forward needs "
                "every rank's shards; set mode: distributed (or auto)"
            )
        self._dataset = loader.dataset
        self._loader_kwargs = dict(batch_size=loader.batch_size, collate_fn=loader.collate_fn, num_workers=0)
        self._last_step = trainer.global_step  # resumed runs do not re-validate the restored step

    # ---- trigger: every rank reaches the same global step ------------------------------------
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx
    ) -> None:
        step = trainer.global_step
        due = step % self.every_n_steps == 0 or (trainer.max_steps > 0 and step >= trainer.max_steps)
        if step > self._last_step and due:
            self._last_step = step
            self.validate(trainer, pl_module)

    def validate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        """Run one validation on every rank (collectively); returns the metrics every rank received."""
        results = self._evaluate(pl_module, trainer)
        for name, value in results.items():
            trainer.callback_metrics[name] = torch.tensor(value)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(results, step=trainer.global_step)
            shown = ", ".join(f"{k} {v:.4f}" for k, v in results.items() if not k.endswith("_time_s"))
            n = len(self._eval_dataset(trainer)) if self._dataset is not None else 0
            rank_zero_info(
                f"step {trainer.global_step}: {shown} ({self.mode} validation of {n} samples, "
                f"{results[f'{self.prefix}_time_s']:.1f}s)"
            )
        self.history.append({"step": trainer.global_step, **results})
        # Let monitor-based callbacks react exactly as after Lightning's own validation loop.
        for cb in trainer.callbacks:
            if isinstance(cb, (ModelCheckpoint, EarlyStopping)):
                cb.on_validation_end(trainer, pl_module)
        return results

    def _eval_dataset(self, trainer: L.Trainer | None) -> Dataset:
        """The validation set; under ``fast_dev_run=n`` only its first n batches, as Lightning's own loop does."""
        n = getattr(trainer, "fast_dev_run", False) if trainer is not None else False
        if not n:
            return self._dataset
        keep = int(n) * self._loader_kwargs["batch_size"]  # fast_dev_run=True means 1 batch
        return Subset(self._dataset, range(min(keep, len(self._dataset))))

    def _evaluate(self, pl_module: L.LightningModule, trainer: L.Trainer | None = None) -> dict[str, float]:
        metric: Metric = getattr(pl_module, self.metric_attr)
        assert self._dataset is not None, "validate() called before on_fit_start (or set_dataset)"
        dataset = self._eval_dataset(trainer)
        metric.reset()
        t0 = time.perf_counter()
        if self.mode == "distributed" and _distributed():
            world, bs = dist.get_world_size(), self._loader_kwargs["batch_size"]
            indices = shard_indices(len(dataset), dist.get_rank(), world)
            # Every rank runs as many forwards as the longest shard needs (FSDP2's forward is collective).
            most = max(-(-len(shard_indices(len(dataset), r, world)) // bs) for r in range(world))
            loader = DataLoader(Subset(dataset, indices), **self._loader_kwargs)
            accumulate_metric(pl_module, loader, metric, trainer, n_batches=most)
            all_reduce_sum_states(metric, self._group)
            values = compute_local(metric)
            elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=pl_module.device)
            with hold_until_released(elapsed, group=self._group):  # the slowest shard sets the cost
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=self._group)
            values["time_s"] = float(elapsed)
        else:
            payload: list[Any] = [None]
            if not _distributed() or dist.get_rank() == 0:
                try:
                    accumulate_metric(pl_module, DataLoader(dataset, **self._loader_kwargs), metric, trainer)
                    payload[0] = {**compute_local(metric), "time_s": time.perf_counter() - t0}
                except Exception as e:  # noqa: BLE001 - every rank must learn of it, or they would wait forever
                    payload[0] = {"__error__": f"{type(e).__name__}: {e}"}
            if _distributed():  # every rank, unconditionally
                payload[0] = broadcast_object(payload[0], src=0, group=self._group)
            if "__error__" in payload[0]:
                raise RuntimeError(f"rank-0 validation failed: {payload[0]['__error__']}")
            values = payload[0]
        metric.reset()
        # Identical on every rank (rank 0's numbers), so any callback may monitor any of them.
        return {(f"{self.prefix}_{k}" if k else self.prefix): v for k, v in values.items()}

    def set_dataset(self, dataset: Dataset, batch_size: int) -> None:
        """Use ``dataset`` without a Trainer (tests, notebooks); on_fit_start does this from the DataModule."""
        self._dataset = dataset
        self._loader_kwargs = dict(batch_size=batch_size, num_workers=0)

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self._last_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._last_step = state_dict.get("last_step", -1)
