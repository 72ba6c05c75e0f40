"""What a module logs during an exact evaluation: :class:`LogRecorder` stands in for ``LightningModule.log`` while
:class:`~distlab.callbacks.exact_eval.ExactEvaluator` runs the module's hooks, and keeps Lightning's epoch aggregation
(the mean weighted by batch size, or reduce_fx sum / max / min; a logged torchmetrics Metric computed once), under
Lightning's names (``/dataloader_idx_i`` with several loaders)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.pytorch.utilities.data import extract_batch_size
from torchmetrics import Metric, MetricCollection

from distlab.errors import ConfigError

IDENTITY = {"mean": 0.0, "sum": 0.0, "max": -math.inf, "min": math.inf}


def _reduce_name(name: str, reduce_fx: Any) -> str:
    if isinstance(reduce_fx, str) and reduce_fx.lower() in ("mean", "avg", "sum", "max", "min"):
        return "mean" if reduce_fx.lower() == "avg" else reduce_fx.lower()
    fns = {"mean": (torch.mean,), "sum": (torch.sum, sum), "max": (torch.max, max), "min": (torch.min, min)}
    for reduce, candidates in fns.items():
        if any(reduce_fx is fn for fn in candidates):
            return reduce
    raise ConfigError(
        f"self.log({name!r}, reduce_fx={reduce_fx!r}): exact evaluation supports mean, sum, max and min; log a "
        "torchmetrics Metric for any other reduction"
    )


@dataclass
class _Logged:
    phase: str  # "step" or "epoch"
    reduce: str  # mean / sum / max / min ("metric" for a logged Metric object)
    total: Any = 0.0  # mean: sum of value * batch_size; else the running sum / max / min (float64, on device)
    count: float = 0.0  # mean: sum of batch sizes
    metric: Metric | None = None
    logger: bool = True  # False: self.log(..., logger=False), kept from the loggers as Lightning does


@dataclass
class LogRecorder:
    """Stands in for ``LightningModule.log`` while the engine runs the module's hooks (see module docstring)."""

    known_metrics: set[int]
    stage_hook: str
    phase: str | None = None  # "step", "epoch", or None (padding pass: ignore everything)
    batch: Any = None
    logged: dict[str, _Logged] = field(default_factory=dict)
    n_loaders: int = 1  # several: a step's names get Lightning's "/dataloader_idx_{i}"
    dataloader_idx: int = 0

    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: Any = "mean",
        batch_size: int | None = None,
        add_dataloader_idx: bool = True,
        **_ignored: Any,  # enable_graph, sync_dist(_group), metric_attribute, rank_zero_only
    ) -> None:
        if self.phase is None:
            return
        if self.phase == "step" and self.n_loaders > 1 and add_dataloader_idx:  # as Lightning names them
            name = f"{name}/dataloader_idx_{self.dataloader_idx}"
        if on_step or on_epoch is False:
            raise ConfigError(
                f"self.log({name!r}, on_step={on_step}, on_epoch={on_epoch}) in {self.stage_hook}: exact evaluation "
                "reports one value per evaluation, not one per step; "
                + (
                    "drop on_step (or set on_step=False)"
                    if on_step
                    else "drop on_epoch=False (on_epoch=True is the default)"
                )
            )
        if isinstance(value, Metric):
            if id(value) not in self.known_metrics:
                raise ConfigError(
                    f"self.log({name!r}, <{type(value).__name__}>): exact evaluation syncs the metrics the module "
                    "holds; make the metric an attribute of the LightningModule (or of a MetricCollection in it)"
                )
            entry = self._entry(name, "metric")
            entry.metric, entry.logger = value, logger is not False
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ConfigError(
                    f"self.log({name!r}, tensor of shape {tuple(value.shape)}): log a scalar (one element)"
                )
            value = value.detach().reshape(()).double()  # stays on its device: no sync per batch
        elif isinstance(value, (int, float)):
            value = torch.tensor(float(value), dtype=torch.float64)
        else:
            raise ConfigError(
                f"self.log({name!r}, {type(value).__name__}): log a scalar tensor, a number or a torchmetrics Metric"
            )
        entry = self._entry(name, _reduce_name(name, reduce_fx))
        entry.logger = logger is not False
        if entry.reduce == "mean":
            size = batch_size if batch_size is not None else self._batch_size()
            entry.total = entry.total + value * size
            entry.count += size
        elif entry.reduce == "sum":
            entry.total = entry.total + value
        else:
            total = torch.as_tensor(entry.total, dtype=torch.float64, device=value.device)
            entry.total = (torch.maximum if entry.reduce == "max" else torch.minimum)(total, value)

    def log_dict(self, dictionary: Any, **kwargs: Any) -> None:
        if isinstance(dictionary, MetricCollection):  # as LightningModule.log_dict iterates it
            items = dictionary.items(keep_base=False, copy_state=False)
        else:
            items = dictionary.items()
        for name, value in items:
            self.log(name, value, **kwargs)

    def _batch_size(self) -> int:
        return extract_batch_size(self.batch) if self.phase == "step" else 1

    def _entry(self, name: str, reduce: str) -> _Logged:
        entry = self.logged.get(name)
        if entry is None:
            entry = self.logged[name] = _Logged(self.phase, reduce, total=IDENTITY.get(reduce, 0.0))
        elif entry.phase != self.phase or entry.reduce != reduce:
            raise ConfigError(
                f"self.log({name!r}) is called in a step and at epoch end, or with two reductions; use one name each"
            )
        return entry
