"""Test-only LightningModules."""

from __future__ import annotations

import torch

from distlab.modules import GPTLightningModule


class PlainAdamWModule(GPTLightningModule):
    """Returns a plain torch.optim.AdamW, which does not synchronise gradients itself."""

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class ScriptedValLossModule(GPTLightningModule):
    """Logs a scripted ``val_loss`` that differs per rank, to test rank-consistent early stopping.

    Rank 0 logs ``script[i]`` at its i-th validation (i = global_step // every - 1); rank 1 logs nothing
    (the metric is missing there, as with rank-0-only validation); rank >= 2 logs an always-improving value.
    """

    def __init__(self, script: list[float], every: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.script, self.every = list(script), every

    def validation_step(self, batch, batch_idx: int) -> None:
        return None

    def on_validation_epoch_end(self) -> None:
        i = self.trainer.global_step // self.every - 1
        if self.global_rank == 0:
            value = self.script[min(i, len(self.script) - 1)]
        elif self.global_rank == 1:
            return
        else:
            value = -float(i)
        self.log("val_loss", float(value), sync_dist=False, rank_zero_only=False)


class NaNOnRankModule(GPTLightningModule):
    """Returns a NaN loss on ``bad_rank`` at optimizer step ``bad_step``."""

    def __init__(self, bad_rank: int, bad_step: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.bad_rank, self.bad_step = bad_rank, bad_step

    def training_step(self, batch, batch_idx: int):
        loss = super().training_step(batch, batch_idx)
        if self.global_rank == self.bad_rank and self.global_step == self.bad_step:
            loss = loss * float("nan")
        return loss


class SlowValidationModule(GPTLightningModule):
    """Validation that keeps rank 0 busy for ``seconds`` (real work, not a sleep) before the first batch."""

    def __init__(self, seconds: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.seconds = seconds

    def validation_step(self, batch, batch_idx: int) -> None:
        if batch_idx == 0:
            import time

            end = time.monotonic() + self.seconds
            x = torch.randn(64, 64)
            while time.monotonic() < end:
                x = torch.tanh(x @ x.T / 64)
        super().validation_step(batch, batch_idx)


class OptimizerIndexModule(PlainAdamWModule):
    """Lightning 1.x style: training_step takes optimizer_idx, which Lightning 2 refuses under automatic
    optimization (its own check, before the first step)."""

    def training_step(self, batch, batch_idx: int, optimizer_idx: int = 0):
        return super().training_step(batch, batch_idx)
