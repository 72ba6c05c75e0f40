"""Exact evaluation of any LightningModule: the numbers one process would report over the whole set.

The engine behind :class:`distlab.callbacks.RankZeroValidation` (its modes: docs/internals.md, "Callbacks"). It
runs the module's own epoch and step hooks (validation or test) with ``self.log`` pointed at a :class:`LogRecorder`
(outside Lightning's loop, a ``self.log`` lands in the *training* results and reports one batch's value), which
aggregates as Lightning's epoch end does (:mod:`distlab.callbacks.eval_logging`).

Exactness: ``rank_zero`` batches exactly as a single process does, so every idiom is exact. In
``distributed`` mode the shards cut the set at other places, so a logged per-batch mean is exact
(weighted by batch size), a per-batch sum/max/min is exact when it is a sum/max/min over the batch's
samples, and torchmetrics metrics are exact (synced once, by ``Metric.sync``, only if their states reduce by sum,
cat, max or min); values logged at epoch end must then agree across ranks. Every rank runs the same number of
forwards (FSDP2's forward is collective); padding passes leave every metric and log untouched. What cannot be made
exact is refused in one line.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch.distributed.fsdp import FSDPModule
from torchmetrics import Metric

from distlab.callbacks.eval_data import EvalData, shard_indices
from distlab.callbacks.eval_logging import IDENTITY, LogRecorder
from distlab.callbacks.eval_metrics import find_metrics, local_metrics, restore, snapshot, sync_metrics
from distlab.compat import metric_is_synced, patched
from distlab.distributed import (
    all_gather,
    broadcast_buffers,
    broadcast_object,
    forbid_collectives,
    gather_objects,
    is_distributed,
    world_info,
)
from distlab.errors import ConfigError, DistlabError

__all__ = ["EvalData", "EvaluationError", "ExactEvaluator", "LogRecorder", "shard_indices"]

# stage -> the module's hook names, the precision plugin's step context, and the prefix of ``*_time_s``
STAGES: dict[str, dict[str, str]] = {
    stage: {
        "step": f"{stage}_step",
        "start": f"on_{stage}_epoch_start",
        "end": f"on_{stage}_epoch_end",
        "batch_start": f"on_{stage}_batch_start",
        "batch_end": f"on_{stage}_batch_end",
        "context": f"{prefix}_step_context",
        "prefix": prefix,
    }
    for stage, prefix in (("validation", "val"), ("test", "test"))
}
AGREEMENT_RTOL = 1e-6  # epoch-end values computed from the same synced states agree to rounding


class EvaluationError(DistlabError):
    """Exact evaluation failed on some rank; every rank raises it with the same one-line message."""


def _error_payload(error: BaseException) -> dict[str, Any]:
    """An error as sent to every rank (which raises it again, as a ConfigError if it was one)."""
    return {"__error__": f"{type(error).__name__}: {error}", "__config__": isinstance(error, ConfigError)}


# ---- running it ----------------------------------------------------------------------------------
@contextmanager
def _eval_mode(pl_module: L.LightningModule) -> Iterator[None]:
    """Eval mode without gradients for the evaluation. Afterwards: each module's training flag as it was; torch's
    random state as it was, so a validation never changes the draws of the training after it (dropout, noise, a
    loader's shuffle: Lightning's own validation does change them); and FSDP2's units resharded, since a forward
    leaves the root unit's parameters gathered, and what the module then writes into them (an EMA update in its
    ``on_train_batch_end``) would be dropped at the next gather."""
    modes = [(m, m.training) for m in pl_module.modules()]
    cuda = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        pl_module.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            for m, training in modes:
                m.training = training
            for m in pl_module.modules():
                if isinstance(m, FSDPModule):
                    m.reshard()


@contextmanager
def _rank_zero_buffers(pl_module: L.LightningModule, group: Any) -> Iterator[None]:
    """Every rank evaluates with rank 0's buffers (BatchNorm's running statistics differ per rank after a training
    step, under ``ddp`` as under FSDP2): the numbers are those of one process holding rank 0's state, which is what a
    checkpoint holds. Afterwards every rank holds rank 0's buffers as they were before the evaluation, in either mode:
    what Lightning's ``ddp`` leaves (its evaluation forward broadcasts rank 0's buffers; eval mode leaves BatchNorm's
    alone). A change an evaluation forward itself makes to a buffer (a counter) is not kept."""
    broadcast_buffers(pl_module, group)
    buffers = list(pl_module.buffers())
    saved = [b.clone() for b in buffers]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, old in zip(buffers, saved, strict=True):
                b.copy_(old)


class ExactEvaluator:
    """Runs one exact evaluation of ``pl_module`` on ``data`` (see the module docstring).

    Call :meth:`run` on every rank; it returns ``{name: value}``, the same on every rank.
    """

    def __init__(
        self,
        pl_module: L.LightningModule,
        stage: str,
        data: EvalData | list[EvalData],
        mode: str,
        trainer: L.Trainer | None = None,
        group: Any = None,
    ) -> None:
        if mode not in ("rank_zero", "distributed"):
            raise ValueError(f"mode must be 'rank_zero' or 'distributed', got {mode!r}")
        self.pl_module, self.stage, self.mode = pl_module, stage, mode
        self.data = data if isinstance(data, list) else [data]  # one per DataLoader (dataloader_idx)
        self.trainer, self.group = trainer, group
        self.hooks = STAGES[stage]
        self.metrics = find_metrics(pl_module)
        self.unlogged: set[str] = set()  # names logged with logger=False: for callback_metrics only

    # -- per-rank pieces ---------------------------------------------------------------------------
    def _hook(self, key: str, *args: Any) -> Any:
        return getattr(self.pl_module, self.hooks[key])(*args)

    def _to_device(self, batch: Any) -> Any:
        if self.trainer is None:
            return move_data_to_device(batch, self.pl_module.device)
        return self.trainer.strategy.batch_to_device(batch)

    def _context(self):
        if self.trainer is None:
            return torch.autocast("cpu", enabled=False)
        return getattr(self.trainer.precision_plugin, self.hooks["context"])()

    def _run_steps(
        self, recorder: LogRecorder, k: int, indices: range | None = None, n_forwards: int = 0
    ) -> None:
        """Every batch of loader ``k`` (its samples ``indices``; all by default) through the step hooks, with
        ``dataloader_idx`` as Lightning passes it (only with several loaders); then padding forwards (results
        discarded) up to ``n_forwards``."""
        first, n = None, 0
        extra = (k,) if len(self.data) > 1 else ()
        recorder.n_loaders, recorder.dataloader_idx = len(self.data), k
        with self._context():
            for i, batch in enumerate(self.data[k].loader(indices)):
                batch = self._to_device(batch)
                first = batch if first is None else first
                recorder.phase, recorder.batch = "step", batch
                self._hook("batch_start", batch, i, *extra)
                out = self._hook("step", batch, i, *extra)
                self._hook("batch_end", out, batch, i, *extra)
                n += 1
            if n < n_forwards:  # this rank's shard is shorter: keep FSDP2's collective forwards in step
                saved = snapshot(self.metrics)
                recorder.phase = None
                if first is None:
                    first = self._to_device(next(iter(self.data[k].loader(range(1)))))
                for i in range(n, n_forwards):
                    self._hook("step", first, i, *extra)
                restore(self.metrics, saved)
        recorder.phase, recorder.batch = None, None

    @contextmanager
    def _recording(self) -> Iterator[LogRecorder]:
        # Instance attributes shadow LightningModule.log / log_dict while the engine runs the module's hooks (outside
        # Lightning's loops, self.log has no result collection to write to; no public hook redirects it).
        module, recorder = self.pl_module, LogRecorder({id(m) for m in self.metrics}, self.hooks["step"])
        with patched(module, "log", recorder.log), patched(module, "log_dict", recorder.log_dict):
            yield recorder
        self.unlogged = {name for name, e in recorder.logged.items() if not e.logger}

    def _local_values(self, recorder: LogRecorder) -> dict[str, float]:
        """This rank's value of every logged name (step logs not yet reduced across ranks)."""
        values = {}
        for name, e in recorder.logged.items():
            if e.reduce == "metric":
                v = e.metric.compute()
                if isinstance(v, torch.Tensor) and v.numel() != 1:
                    raise ConfigError(
                        f"self.log({name!r}, <{type(e.metric).__name__}>) computes {tuple(v.shape)} values; log a scalar metric"
                    )
                values[name] = float(v)
            elif e.reduce == "mean":
                values[name] = float(e.total) / e.count if e.count else math.nan
            else:
                values[name] = float(e.total)
        return values

    def _reset_logged_metrics(self, recorder: LogRecorder, synced: list[Metric]) -> None:
        """As Lightning does at epoch end: metrics logged as objects are reset; any other synced metric returns to
        its local state (torchmetrics' unsync), so a module that accumulates across evaluations still can."""
        logged = {id(e.metric) for e in recorder.logged.values() if e.metric is not None}
        for m in self.metrics:
            if id(m) in logged:
                m.reset()
        for m in synced:
            if id(m) not in logged and metric_is_synced(m):
                m.unsync()

    # -- the two modes -----------------------------------------------------------------------------
    def run(self) -> dict[str, float]:
        t0 = time.perf_counter()
        with _eval_mode(self.pl_module), local_metrics(self.metrics):
            if not is_distributed():
                return self._evaluate_whole_set(t0)
            with _rank_zero_buffers(self.pl_module, self.group):
                if self.mode != "distributed":
                    return self._run_rank_zero(t0)
                values = self._run_distributed()
            t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=self.pl_module.device)
            values[f"{self.hooks['prefix']}_time_s"] = float(
                all_gather(t, self.group).max()
            )  # the slowest rank
            return values

    def _evaluate_whole_set(self, t0: float) -> dict[str, float]:
        with self._recording() as recorder:
            recorder.phase = "epoch"
            self._hook("start")
            for k in range(len(self.data)):
                self._run_steps(recorder, k)
            recorder.phase = "epoch"
            self._hook("end")
            recorder.phase = None
            values = self._local_values(recorder)
        self._reset_logged_metrics(recorder, [])
        return {**values, f"{self.hooks['prefix']}_time_s": time.perf_counter() - t0}

    def _run_rank_zero(self, t0: float) -> dict[str, float]:
        payload: dict[str, Any] | None = None
        if world_info()[1] == 0:
            try:
                with forbid_collectives(
                    f"rank-0 {self.stage} ({type(self.pl_module).__name__}.{self.hooks['step']} and its epoch hooks)",
                    hint="remove the collective (self.log(sync_dist=True) is fine), or set RankZeroValidation(mode='distributed')",
                ):
                    payload = {**self._evaluate_whole_set(t0), "__unlogged__": sorted(self.unlogged)}
            except Exception as e:  # noqa: BLE001 - every rank must hear of it, or they would wait forever
                payload = _error_payload(e)
        payload = broadcast_object(payload, src=0, group=self.group)  # every rank, unconditionally
        self._raise_if_error([payload])
        self.unlogged = set(payload.pop("__unlogged__"))  # every rank returns what rank 0's loggers get
        return payload

    def _run_distributed(self) -> dict[str, float]:
        world, rank = world_info()
        if any(data.drop_last for data in self.data):
            raise ConfigError(
                "the evaluation DataLoader has drop_last=True: shards would drop other samples than one process does; "
                "set drop_last=False or RankZeroValidation(mode='rank_zero')"
            )
        error = None
        synced: list[Metric] = []
        with self._recording() as recorder:
            try:
                recorder.phase = "epoch"
                self._hook("start")
                for k, data in enumerate(self.data):  # each loader cut into the ranks' contiguous shards
                    n, bs = len(data.dataset), data.batch_size
                    most = max(-(-len(shard_indices(n, r, world)) // bs) for r in range(world))
                    self._run_steps(recorder, k, shard_indices(n, rank, world), most)
            except Exception as e:  # noqa: BLE001
                error = e
            self._agree_on_errors(error)  # no rank goes on to a collective another rank will not reach
            try:
                synced = sync_metrics(self.metrics, self.group)
                recorder.phase = "epoch"
                self._hook("end")
                recorder.phase = None
            except Exception as e:  # noqa: BLE001
                error = e
            self._agree_on_errors(error)
        local: dict[str, float] = {}
        try:
            local = self._local_values(recorder)
        except Exception as e:  # noqa: BLE001
            error = e
        finally:
            self._reset_logged_metrics(recorder, synced)
        self._agree_on_errors(error)
        return self._combine(recorder, local)

    # -- agreement across ranks --------------------------------------------------------------------
    def _agree_on_errors(self, error: BaseException | None) -> None:
        self._raise_if_error(gather_objects(None if error is None else _error_payload(error), self.group))

    def _raise_if_error(self, payloads: list[Any]) -> None:
        for rank, p in enumerate(payloads):
            if isinstance(p, dict) and "__error__" in p:
                where = f"{self.stage} on rank {rank}" if len(payloads) > 1 else f"rank-0 {self.stage}"
                cls = ConfigError if p.get("__config__") else EvaluationError
                raise cls(f"{where} failed: {p['__error__']}")

    def _combine(self, recorder: LogRecorder, local: dict[str, float]) -> dict[str, float]:
        """Step logs: reduced across ranks by their reduction. Epoch-end logs and logged metrics: must agree."""
        entries = {name: (e.phase, e.reduce) for name, e in recorder.logged.items()}
        names: dict[str, tuple[str, str]] = {}
        for rank_entries in gather_objects(entries, self.group):
            for name, kind in rank_entries.items():
                if names.setdefault(name, kind) != kind:
                    raise EvaluationError(
                        f"{self.stage}: ranks logged {name!r} with different reductions ({names[name]} vs {kind})"
                    )
        step_names = sorted(
            k for k, (phase, reduce) in names.items() if phase == "step" and reduce != "metric"
        )
        values: dict[str, float] = {}
        for reduce, op in (("mean", "sum"), ("sum", "sum"), ("max", "max"), ("min", "min")):
            keys = [k for k in step_names if names[k][1] == reduce]
            if not keys:
                continue
            logged = [recorder.logged.get(k) for k in keys]  # None: a name this rank never logged
            rows = [[float(e.total), e.count] if e is not None else [IDENTITY[reduce], 0.0] for e in logged]
            t = torch.tensor(rows, dtype=torch.float64, device=self.pl_module.device)  # (keys, 2)
            everyone_t = all_gather(t.unsqueeze(0), self.group)  # (W, keys, 2)
            red = getattr(everyone_t, {"sum": "sum", "max": "amax", "min": "amin"}[op])(0)  # (keys, 2)
            for k, (total, count) in zip(keys, red.tolist(), strict=True):
                values[k] = (total / count if count else math.nan) if reduce == "mean" else total
        agreed = sorted(k for k in names if k not in values)
        # A rank whose shard was empty never logged a step's metric object: it has no value to compare.
        everyone_vals = gather_objects({k: local[k] for k in agreed if k in local}, self.group)
        for k in agreed:
            have = [(rank, vals[k]) for rank, vals in enumerate(everyone_vals) if k in vals]
            ref_rank, ref = have[0]
            for rank, v in have:
                same = (math.isnan(v) and math.isnan(ref)) or math.isclose(
                    v, ref, rel_tol=AGREEMENT_RTOL, abs_tol=1e-12
                )
                if not same:
                    raise EvaluationError(
                        f"{self.stage}: {k!r} logged at epoch end is {ref!r} on rank {ref_rank} but {v!r} on rank {rank}: it was "
                        "computed from rank-local data; log it per batch in the step, use a torchmetrics Metric, or set "
                        "RankZeroValidation(mode='rank_zero')"
                    )
            values[k] = ref
        return values
