"""Short single-process fits on CPU that guard what happens between training steps (audit 24).

- After a mid-fit RankZeroValidation, training resumes in train mode (Dropout / BatchNorm active).
- The GPT module's LR schedule advances every optimizer step (warmup, then warmdown) on the text stream.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from distlab.callbacks import RankZeroValidation
from tests.helpers.tiny import quiet_cpu_trainer

STEPS = 4


class DropoutBatchNormModule(L.LightningModule):
    """A user's classifier with Dropout and BatchNorm that records every module's mode at each training step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2))
        self.modes: list[tuple[int, bool, bool, bool]] = []  # (step, module, batchnorm, dropout)

    def training_step(self, batch, batch_idx):
        self.modes.append((self.global_step, self.training, self.net[1].training, self.net[2].training))
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def _loader(self, n: int, seed: int) -> DataLoader:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 4, generator=g)
        return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=4)

    def train_dataloader(self):
        return self._loader(4 * STEPS, 0)

    def val_dataloader(self):
        return self._loader(6, 1)


@pytest.mark.timeout(60)
def test_training_after_a_mid_fit_validation_is_in_train_mode():
    """RankZeroValidation evaluates in eval mode and gives every module its training flag back.

    Catches the exact-evaluation engine leaving the module in eval mode after it validated mid-fit: the rest
    of the fit would then train without Dropout and with frozen BatchNorm statistics, silently. Validation
    runs after every step, so steps 1.. each follow one.
    """
    module = DropoutBatchNormModule()
    validation = RankZeroValidation(every_n_steps=1)
    quiet_cpu_trainer(max_steps=STEPS, callbacks=[validation]).fit(module)
    assert [h["step"] for h in validation.history] == list(range(1, STEPS + 1))  # it did validate mid-fit
    assert [m[0] for m in module.modes] == list(range(STEPS))
    assert all(all(m[1:]) for m in module.modes), module.modes


class FrozenBackboneModule(DropoutBatchNormModule):
    """A fine-tune that keeps its backbone (BatchNorm, Dropout) in eval mode for the whole fit, as users do with
    ``self.backbone.eval()`` in ``on_fit_start``; the head trains."""

    def on_fit_start(self) -> None:
        self.net[1].eval()
        self.net[2].eval()


@pytest.mark.timeout(60)
def test_a_submodule_kept_in_eval_mode_stays_so_after_each_validation():
    """Validation gives every submodule its own flag back, not the module's: a backbone the user froze in eval mode
    stays frozen (its BatchNorm statistics unchanged, Dropout off), exactly as in the same fit without validation."""

    def fit(validate: bool) -> FrozenBackboneModule:
        torch.manual_seed(0)
        module = FrozenBackboneModule()
        if validate:
            quiet_cpu_trainer(max_steps=STEPS, callbacks=[RankZeroValidation(every_n_steps=1)]).fit(module)
        else:
            quiet_cpu_trainer(max_steps=STEPS, limit_val_batches=0).fit(module)
        return module

    validated, plain = fit(True), fit(False)
    assert validated.modes == plain.modes and not any(m[2] or m[3] for m in plain.modes), validated.modes
    for name, buf in plain.named_buffers():
        assert torch.equal(dict(validated.named_buffers())[name], buf), name
    for name, p in plain.named_parameters():
        assert torch.equal(dict(validated.named_parameters())[name], p), name


def _expected_multiplier(step: int, total: int, warmup: int, warmdown_ratio: float) -> float:
    """The documented "linear" schedule: warmup from 1/warmup to 1, flat, then down to 0 over the last
    ``warmdown_ratio`` of the steps (min_lr_ratio 0). Written out here, not imported."""
    if step < warmup:
        return (step + 1) / warmup
    warmdown = round(warmdown_ratio * total)
    start = total - warmdown
    return 1.0 if step < start else 1.0 - (step - start) / warmdown


class RecordLR(L.Callback):
    """Each optimizer step's learning rate as a fraction of its group's peak, as the step is taken."""

    def __init__(self) -> None:
        self.ratios: list[list[float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        groups = trainer.optimizers[0].param_groups
        self.ratios.append([g["lr"] / g["initial_lr"] for g in groups])


@pytest.mark.timeout(60)
def test_gpt_lr_schedule_advances_every_step_on_the_text_stream():
    """The GPT module's learning rate follows warmup then warmdown step by step during a fit.

    Catches a scheduler stepped per epoch (``interval: "epoch"``): the endless text stream never ends an
    epoch, so the lr would stay at the first warmup value for the whole run. 6 steps, warmup 3, warmdown
    over the last half: every group's lr / peak must be 1/3, 2/3, 1, 1, 2/3, 1/3.
    """
    from distlab.data import TextDataModule
    from distlab.modules import GPTLightningModule
    from distlab.testing import TINY_GPT

    total, warmup, warmdown_ratio = 6, 3, 0.5
    torch.manual_seed(0)
    module = GPTLightningModule(
        **TINY_GPT, schedule="linear", warmup_steps=warmup, warmdown_ratio=warmdown_ratio
    )
    data = TextDataModule(seq_len=TINY_GPT["sequence_len"], batch_size=2, max_val_windows=8)
    record = RecordLR()
    quiet_cpu_trainer(max_steps=total, callbacks=[record], limit_val_batches=0).fit(module, datamodule=data)
    expected = [_expected_multiplier(s, total, warmup, warmdown_ratio) for s in range(total)]
    assert len(record.ratios) == total
    for step, (ratios, want) in enumerate(zip(record.ratios, expected, strict=True)):
        assert ratios == pytest.approx([want] * len(ratios), rel=1e-9), (step, record.ratios)
