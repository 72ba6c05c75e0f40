"""Test-only callbacks, referenced from configs by class path (tests.helpers.callbacks.X)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch


class SaveRankWeights(L.Callback):
    """At the end of fit every rank writes its weights and world size to ``dirpath/rank{r}.pt``.

    ddp_spawn returns only rank 0's model to the parent; this lets a test compare all ranks.
    FSDP2 shards are gathered into full tensors first.
    """

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath
        self.losses: list[float] = []
        self.grad_norms: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))
        norm = getattr(trainer.optimizers[0], "last_grad_norm", None) if trainer.optimizers else None
        if norm is not None:  # the synced gradient's global norm (the optimizer computes it when it clips)
            self.grad_norms.append(float(norm))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        Path(self.dirpath).mkdir(parents=True, exist_ok=True)
        from torch.distributed.tensor import DTensor

        # FSDP2 params are DTensor shards: gather full tensors (a collective, every rank takes part).
        state = {
            k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
            for k, v in pl_module.state_dict().items()
        }
        from tests.helpers.shards import local_shards

        out = {
            "state": state,
            "shards": local_shards(pl_module.state_dict()),  # FSDP2: this rank's own rows
            "world_size": trainer.world_size,
            "rank": trainer.global_rank,
            "global_step": trainer.global_step,
            "strategy": type(trainer.strategy).__name__,
            "losses": self.losses,
            "grad_norms": self.grad_norms,
            # a SpeedMonitor's lines on this rank, if the fit has one
            "speed": [
                h for cb in trainer.callbacks if type(cb).__name__ == "SpeedMonitor" for h in cb.history
            ],
        }
        torch.save(out, Path(self.dirpath) / f"rank{trainer.global_rank}.pt")


def load_rank_weights(dirpath: str | Path, world_size: int) -> list[dict]:
    return [torch.load(Path(dirpath) / f"rank{r}.pt", weights_only=True) for r in range(world_size)]


class RecordEnd(L.Callback):
    """Each rank writes where it ended: at fit end or on an exception (step, message, val metrics)."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath

    def _write(self, trainer: L.Trainer, error: str | None) -> None:
        Path(self.dirpath).mkdir(parents=True, exist_ok=True)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val")}
        out = {
            "rank": trainer.global_rank,
            "global_step": trainer.global_step,
            "error": error,
            "metrics": metrics,
        }
        torch.save(out, Path(self.dirpath) / f"end{trainer.global_rank}.pt")

    def on_fit_end(self, trainer, pl_module) -> None:
        self._write(trainer, None)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # Runs in the rank itself (under ddp_spawn, on_exception runs in the parent process instead).
        Path(self.dirpath).mkdir(parents=True, exist_ok=True)
        torch.save(
            {"last_step_started": trainer.global_step}, Path(self.dirpath) / f"seen{trainer.global_rank}.pt"
        )

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._write(trainer, str(exception))


def load_last_steps_started(dirpath: str | Path, world_size: int) -> list[int]:
    files = [Path(dirpath) / f"seen{r}.pt" for r in range(world_size)]
    return [torch.load(f, weights_only=True)["last_step_started"] for f in files]


def load_ends(dirpath: str | Path, world_size: int) -> list[dict]:
    return [torch.load(Path(dirpath) / f"end{r}.pt", weights_only=True) for r in range(world_size)]


class PrintAtStep(L.Callback):
    """Rank 0 prints ``text`` (flushed) after optimizer step ``step``: a point in the output a test can wait for."""

    def __init__(self, step: int, text: str) -> None:
        self.step, self.text = step, text

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.is_global_zero:
            print(self.text, flush=True)


def set_read_only(folder: Path, read_only: bool = True) -> None:
    """Make ``folder`` refuse new files, also for root (``chattr +i``; ``chmod`` does not stop root), or undo it."""
    import os
    import subprocess

    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i" if read_only else "-i", str(folder)], check=True, capture_output=True)
    else:
        folder.chmod(0o555 if read_only else 0o755)


def can_make_read_only(tmp: Path) -> bool:
    """Whether :func:`set_read_only` works here (chattr needs a file system that supports it)."""
    probe = tmp / "probe_read_only"
    probe.mkdir(exist_ok=True)
    try:
        set_read_only(probe)
    except Exception:  # noqa: BLE001
        return False
    try:
        (probe / "x").write_text("x")
        return False
    except OSError:
        return True
    finally:
        set_read_only(probe, False)


class FreezeFolderAt(L.Callback):
    """At optimizer step ``step``, make ``folder`` read-only (a disk that fills or a mount that turns read-only
    mid-run); the test undoes it."""

    def __init__(self, folder: str, step: int) -> None:
        self.folder, self.step = Path(folder), step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            self.folder.mkdir(parents=True, exist_ok=True)
            set_read_only(self.folder)


class EpochEndOnly(L.Callback):
    """A user's callback that acts only when a training epoch ends (never, on the endless text stream)."""

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.print("epoch ended")


class WrongHookSignature(L.Callback):
    """A user's callback whose hook leaves out arguments Lightning passes (outputs, batch, batch_idx)."""

    def on_train_batch_end(self, trainer, pl_module) -> None:  # type: ignore[override]
        pl_module.print("step", trainer.global_step)


class RecordMetricStates(L.Callback):
    """After each validation / test batch, each rank notes how many tokens its metrics hold and whether any metric
    state lies in shared memory; at the end it writes them to ``dirpath/{stage}-rank{r}.pt``. A rank's count is its
    own batches' tokens, unless the ranks' states share one storage (the other rank's updates land in it too)."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath
        self.seen: list[dict] = []

    def _note(self, pl_module, batch) -> None:
        from torchmetrics import Metric

        from distlab.compat import metric_defaults

        metrics = [m for m in pl_module.modules() if isinstance(m, Metric)]
        self.seen.append(
            {
                "batch_tokens": int(batch[1].numel()),
                "tokens": {type(m).__name__ + str(i): float(m.tokens) for i, m in enumerate(metrics)},
                "shared": any(
                    isinstance(getattr(m, k), torch.Tensor) and getattr(m, k).is_shared()
                    for m in metrics
                    for k in metric_defaults(m)
                ),
            }
        )

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        self._note(pl_module, batch)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._note(pl_module, batch)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        Path(self.dirpath).mkdir(parents=True, exist_ok=True)
        torch.save(
            self.seen, Path(self.dirpath) / f"{getattr(stage, 'value', stage)}-rank{trainer.global_rank}.pt"
        )
        self.seen = []


class KillDuringBackgroundSave(L.Callback):
    """Every rank: the background write of the checkpoint whose path holds ``slow`` sleeps first (a large
    checkpoint on a slow disk), and the rank kills itself (SIGKILL, no cleanup) when batch ``kill_at_step``
    starts, while that write is still in flight."""

    def __init__(self, slow: str = "step=4", kill_at_step: int = 4) -> None:
        self.slow, self.kill_at_step = slow, kill_at_step

    def setup(self, trainer, pl_module, stage) -> None:
        import time

        from torch.distributed.checkpoint import FileSystemWriter

        original, slow = FileSystemWriter.write_data, self.slow

        def write_data(writer, plan, planner):
            if slow in str(writer.path):
                time.sleep(60)
            return original(writer, plan, planner)

        FileSystemWriter.write_data = write_data

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        import os
        import signal

        if trainer.global_step == self.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
