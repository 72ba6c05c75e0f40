"""Training speed you can see: tokens/s, step time, TFLOP/s, MFU, peak memory and time in collectives.

Add ``distlab.callbacks.SpeedMonitor`` to a fit's callbacks; every ``every_n_steps`` steps rank 0 prints one
line and logs the same numbers to the trainer's loggers (``perf/...``)::

    speed step 100: 9,671 tok/s (4,836/rank) | 212 ms/step | 0.054 TFLOP/s/rank | MFU 50.1% of 0.108
    (measured float32 matmul, 1 threads) | peak mem 1.05 GB | comm 31% of the step: all_gather 29 ms 3.1 MB

Each line covers every step since the previous line (warm-up stays out of the first). FLOPs are the module's
``flops_per_batch`` (a number, or a method called with the batch); the peak, MFU, the optimizer's FLOPs and the
bytes by mesh dimension: docs/guide.md, section 7. Communication is distlab's own collectives
(:data:`distlab.distributed.comm_stats`; a DDP wrapper's all-reduce is not in it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from distlab.callbacks.rank_zero_validation import RankZeroValidation
from distlab.compat import plugin_compute_dtype, should_accumulate
from distlab.distributed import comm_stats
from distlab.distributed.mesh_traffic import MeshTraffic
from distlab.domains import AtLeastTwo, PeakFlops, check_domains
from distlab.dtypes import dtype_name
from distlab.perf import device_peak_flops, peak_memory_bytes


def _first(batch: Any) -> Any:
    return batch[0] if isinstance(batch, (list, tuple)) else batch


def default_tokens(batch: Any) -> int | None:
    """``B*T`` for a batch whose first tensor is integer token ids ``(B, T)``; ``None`` otherwise."""
    first = _first(batch)
    if isinstance(first, torch.Tensor) and first.dim() == 2 and not first.is_floating_point():
        return first.numel()
    return None


class SpeedMonitor(L.Callback):
    """One line of training speed every ``every_n_steps`` steps, and the same numbers in the loggers.

    Args:
        every_n_steps: how often to print/log (and at max_steps); each line averages the steps since the previous one.
        peak_flops: one device's peak FLOP/s in the model's compute dtype, for MFU, when you know better than
            the table/measurement (a chip Lightning does not list, a CPU's datasheet value). An optimizer whose
            matmuls run in another dtype is measured against that dtype's peak, looked up or measured.
        tokens_fn: ``batch -> tokens in it`` (default: ``B*T`` for integer ``(B, T)`` ids).

    After fit, ``history`` holds every line's numbers (a list of dicts).
    """

    def __init__(
        self,
        every_n_steps: AtLeastTwo = 50,
        peak_flops: PeakFlops | None = None,
        tokens_fn: Callable[[Any], int | None] | None = None,
    ) -> None:
        check_domains(SpeedMonitor.__init__, locals())  # every_n_steps >= 2: a rate needs two points
        self.every_n_steps = every_n_steps
        self.peak_flops = peak_flops
        self.tokens_fn = tokens_fn or default_tokens
        self.history: list[dict[str, float]] = []
        self._traffic: MeshTraffic | None = None  # under fsdp2, while training: bytes by mesh dimension
        self.peak_source = "given" if peak_flops else None

    # ---- set-up ------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._compute_dtype = plugin_compute_dtype(trainer.precision_plugin)
        if self.peak_flops is None:
            self.peak_flops, self.peak_source = device_peak_flops(
                trainer.strategy.root_device, self._compute_dtype
            )
        self._totals = {"samples": 0, "tokens": 0, "flops": 0.0}
        self._has_tokens = self._has_flops = True
        self._excluded = 0.0  # seconds of Lightning's validation since on_train_start
        self._val_start: float | None = None
        self._t0: float | None = None
        self._mark: dict[str, Any] | None = None  # the point the next line measures from
        self._rzv = [cb for cb in trainer.callbacks if isinstance(cb, RankZeroValidation)]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The optimizers exist now: the peak of each dtype their matmuls run in (the model's is measured).
        self._peaks = {self._compute_dtype: (self.peak_flops, self.peak_source)}
        for dtype in self._optimizer_flops(trainer):
            if dtype not in self._peaks:
                self._peaks[dtype] = device_peak_flops(trainer.strategy.root_device, dtype)
        mesh = getattr(trainer.strategy, "dp_mesh", None) if trainer.world_size > 1 else None
        self._traffic = MeshTraffic(mesh).start() if mesh is not None else None  # FSDP2 / HSDP
        self._t0 = time.perf_counter()
        self._rzv_before = self._rank_zero_validation_seconds()  # an earlier fit's validations stay out

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_traffic()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._stop_traffic()  # (Lightning calls no on_train_end or teardown hook after a fit that raised)

    def _stop_traffic(self) -> None:
        if self._traffic is not None:
            self._traffic.stop()
            self._traffic = None

    # ---- validation time is not training time --------------------------------------------------------
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._val_start is not None:
            self._excluded += time.perf_counter() - self._val_start
            self._val_start = None

    def _rank_zero_validation_seconds(self) -> float:
        return sum(h.get("val_time_s", 0.0) for cb in self._rzv for h in cb.history)

    def _training_seconds(self) -> float:
        """Seconds since train start, less every validation (Lightning's loop and RankZeroValidation's)."""
        rzv = self._rank_zero_validation_seconds() - self._rzv_before
        return time.perf_counter() - self._t0 - self._excluded - rzv

    # ---- every step --------------------------------------------------------------------------------
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx
    ) -> None:
        if self._t0 is None or should_accumulate(trainer):
            return  # a step ends with the optimizer step; accumulated micro-batches join the next one
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        n_micro = trainer.accumulate_grad_batches  # the last micro-batch stands for each of them
        tokens = self.tokens_fn(batch)
        flops = getattr(pl_module, "flops_per_batch", None)
        flops = flops(batch) if callable(flops) else flops
        self._has_tokens &= tokens is not None
        self._has_flops &= flops is not None
        self._totals["samples"] += len(_first(batch)) * n_micro
        self._totals["tokens"] += (tokens or 0) * n_micro
        self._totals["flops"] += (flops or 0.0) * n_micro
        now = {
            "time": self._training_seconds(),
            "step": trainer.global_step,
            **self._totals,
            "optimizer_flops": self._optimizer_flops(trainer),
            "comm": comm_stats.snapshot(),
            "mesh": dict(self._traffic.bytes) if self._traffic is not None else {},
        }
        if self._mark is None:
            self._mark = now  # the first step (warm-up, compilation) stays out of every line
        elif trainer.global_step % self.every_n_steps == 0 or trainer.global_step == trainer.max_steps:
            self._report(trainer, self._mark, now, device)
            self._mark = now

    def _optimizer_flops(self, trainer: L.Trainer) -> dict[torch.dtype, float]:
        """dtype -> FLOPs the optimizers computed on this rank so far (those that count them: a ``flops``
        attribute, in ``flops_dtype``, else in the model's compute dtype)."""
        out: dict[torch.dtype, float] = {}
        for opt in trainer.strategy.optimizers:
            if getattr(opt, "flops", None) is not None:
                dtype = getattr(opt, "flops_dtype", None) or self._compute_dtype
                out[dtype] = out.get(dtype, 0.0) + float(opt.flops)
        return out

    def _report(self, trainer: L.Trainer, a: dict[str, Any], b: dict[str, Any], device: torch.device) -> None:
        steps, seconds, W = b["step"] - a["step"], b["time"] - a["time"], trainer.world_size
        step_s = seconds / steps
        out: dict[str, float] = {"step": b["step"], "step_ms": 1e3 * step_s}
        # every rank takes a batch per step
        out["samples_per_s"] = W * (b["samples"] - a["samples"]) / seconds
        if self._has_tokens:
            out["tokens_per_s_per_rank"] = (b["tokens"] - a["tokens"]) / seconds
            out["tokens_per_s"] = W * out["tokens_per_s_per_rank"]
        if self._has_flops:
            flops_per_s = (b["flops"] - a["flops"]) / seconds
            out["tflops_per_rank"] = flops_per_s / 1e12
            if self.peak_flops:
                out["mfu"] = flops_per_s / self.peak_flops
            by_dtype = {
                dtype: (n - a["optimizer_flops"].get(dtype, 0.0)) / seconds
                for dtype, n in b["optimizer_flops"].items()
            }
            if sum(by_dtype.values()) > 0:
                out["optimizer_tflops_per_rank"] = sum(by_dtype.values()) / 1e12
                peaks = [self._peaks.get(dtype, (None, ""))[0] for dtype in by_dtype]
                if self.peak_flops and all(peaks):
                    # each dtype's work as a fraction of its own peak: seconds at peak / seconds taken
                    out["hfu"] = flops_per_s / self.peak_flops + sum(
                        f / peak for f, peak in zip(by_dtype.values(), peaks, strict=True)
                    )
        out["peak_mem_gb"] = peak_memory_bytes(device) / 1e9
        comm = {}
        for op, entry in b["comm"].items():
            before = a["comm"].get(op, {"bytes": 0.0, "seconds": 0.0})
            sec = (entry["seconds"] - before["seconds"]) / steps
            nbytes = (entry["bytes"] - before["bytes"]) / steps
            if sec > 0 or nbytes > 0:
                comm[op] = (sec, nbytes)
                out[f"comm_{op}_ms"], out[f"comm_{op}_mb"] = 1e3 * sec, nbytes / 1e6
        out["comm_fraction"] = sum(sec for sec, _ in comm.values()) / step_s
        for dim, nbytes in b["mesh"].items():  # every collective (FSDP2's too) by the mesh dimension it spans
            out[f"comm_mesh_{dim}_mb"] = (nbytes - a["mesh"].get(dim, 0.0)) / steps / 1e6
        self.history.append(out)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(
                    {f"perf/{k}": v for k, v in out.items() if k != "step"}, step=trainer.global_step
                )
            rank_zero_info(self.line(out, comm))

    def line(self, out: dict[str, float], comm: dict[str, tuple[float, float]]) -> str:
        """The printed summary of one ``history`` entry (``comm``: op -> (seconds, bytes) per step)."""
        parts = [f"speed step {int(out['step'])}:"]
        if "tokens_per_s" in out:
            parts.append(f"{out['tokens_per_s']:,.0f} tok/s ({out['tokens_per_s_per_rank']:,.0f}/rank) |")
        else:
            parts.append(f"{out['samples_per_s']:,.1f} samples/s |")
        parts.append(f"{out['step_ms']:,.0f} ms/step |")
        if "tflops_per_rank" in out:
            parts.append(f"{out['tflops_per_rank']:.3g} TFLOP/s/rank |")
        if "mfu" in out:
            parts.append(
                f"MFU {100 * out['mfu']:.1f}% of {self.peak_flops / 1e12:.3g} ({self.peak_source}) |"
            )
            if "hfu" in out:
                own = "".join(  # an optimizer dtype other than the model's, against its own peak
                    f", {dtype_name(d)} ones vs {peak / 1e12:.3g} ({source})"
                    for d, (peak, source) in self._peaks.items()
                    if d != self._compute_dtype
                )
                parts.append(f"{100 * out['hfu']:.1f}% with the optimizer's matmuls{own} |")
        elif "tflops_per_rank" not in out:
            parts.append("no MFU (the module has no flops_per_batch) |")
        parts.append(f"peak mem {out['peak_mem_gb']:.2f} GB")
        if comm:
            shown = ", ".join(
                f"{op} {1e3 * s:.1f} ms {b / 1e6:.2g} MB" for op, (s, b) in sorted(comm.items())
            )
            parts.append(f"| comm {100 * out['comm_fraction']:.0f}% of the step: {shown}")
        # "comm_mesh_{dim}_mb" -> dim
        mesh = [f"{k[10:-3]} {v:.3g}" for k, v in sorted(out.items()) if k.startswith("comm_mesh_")]
        if mesh:
            parts.append("| MB/step by mesh dimension: " + ", ".join(mesh))
        return " ".join(parts)
