"""The module's torchmetrics metrics during an exact evaluation: found wherever the module holds them, kept
rank-local while the engine runs (torchmetrics' own sync off), and synced once, exactly, by torchmetrics itself."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat, dim_zero_max, dim_zero_min, dim_zero_sum

from distlab.compat import (
    metric_defaults,
    metric_progress,
    metric_reductions,
    set_metric_progress,
    set_metric_sync,
)
from distlab.distributed import all_gather, all_reduce_sum
from distlab.errors import ConfigError

EXACT_STATE_REDUCTIONS = (dim_zero_sum, dim_zero_cat, dim_zero_max, dim_zero_min)


def find_metrics(pl_module: L.LightningModule) -> list[Metric]:
    """Every torchmetrics Metric the module holds: submodules (MetricCollection members too) and metrics in
    plain dict / list attributes. Same order on every rank."""
    roots = [pl_module]
    for value in vars(pl_module).values():
        members = (
            value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        )
        roots += [m for m in members if isinstance(m, Metric)]
    found = {id(m): m for root in roots for m in root.modules() if isinstance(m, Metric)}
    return list(found.values())


def snapshot(metrics: list[Metric]) -> list[dict[str, Any]]:
    out = []
    for m in metrics:
        states = {k: getattr(m, k) for k in metric_defaults(m)}
        states = {k: list(v) if isinstance(v, list) else v.clone() for k, v in states.items()}
        out.append({"states": states, "progress": metric_progress(m)})
    return out


def restore(metrics: list[Metric], snapshot: list[dict[str, Any]]) -> None:
    for m, snap in zip(metrics, snapshot, strict=True):
        for k, v in snap["states"].items():
            setattr(m, k, v)
        set_metric_progress(m, *snap["progress"])


@contextmanager
def local_metrics(metrics: list[Metric]) -> Iterator[None]:
    """torchmetrics' own cross-rank sync off (``distributed_available_fn`` and ``sync_on_compute`` are its
    switches): the engine decides when states are synced, and on one rank a sync would wait forever. With
    its private "to sync" flag off too, ``compute()`` on states the engine already synced does not sync again."""
    saved = [(m.distributed_available_fn, m.sync_on_compute) for m in metrics]
    for m in metrics:
        set_metric_sync(m, lambda: False, False)
    try:
        yield
    finally:
        for m, (fn, on_compute) in zip(metrics, saved, strict=True):
            set_metric_sync(m, fn, on_compute)


def gather_for_metrics(tensor: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    """``torchmetrics`` ``dist_sync_fn`` contract (every rank's tensor, shapes may differ in dim 0), through
    distlab's collectives (logical bytes counted, gloo release guard)."""
    flat = tensor if tensor.ndim else tensor.reshape(1)
    shape = torch.tensor(flat.shape, dtype=torch.int64, device=tensor.device)
    shapes = all_gather(shape.unsqueeze(0), group)  # (W, ndim)
    padded = flat.new_zeros((int(shapes[:, 0].max()), *flat.shape[1:]))
    padded[: flat.shape[0]] = flat
    gathered = all_gather(padded.unsqueeze(0), group)  # (W, rows, ...)
    return [
        gathered[r][: int(shapes[r, 0])] if tensor.ndim else gathered[r].reshape(())
        for r in range(len(shapes))
    ]


def sync_metrics(metrics: list[Metric], group: Any = None) -> list[Metric]:
    """Distributed mode: sum the update counts across ranks, then let torchmetrics sync (``Metric.sync``) every
    metric some rank updated, after checking its states reduce exactly. Returns the synced metrics."""
    if not metrics:
        return []
    states = [getattr(m, k) for m in metrics for k in metric_defaults(m)]
    device = next((s.device for s in states if isinstance(s, torch.Tensor)), "cpu")
    counts = torch.tensor([float(metric_progress(m)[0]) for m in metrics], dtype=torch.float64, device=device)
    all_reduce_sum(counts, group)
    synced = []
    for m, n in zip(metrics, counts.tolist(), strict=True):
        if n == 0:
            continue
        for state, fx in metric_reductions(m).items():
            if fx not in EXACT_STATE_REDUCTIONS:
                raise ConfigError(
                    f"{type(m).__name__}.{state} is reduced across ranks with {getattr(fx, '__name__', fx)}, which is not "
                    "the single-process value when shards differ in size; use RankZeroValidation(mode='rank_zero')"
                )
        m.sync(
            dist_sync_fn=gather_for_metrics,
            process_group=group,
            should_sync=True,
            distributed_available=lambda: True,
        )
        synced.append(m)
    return synced
