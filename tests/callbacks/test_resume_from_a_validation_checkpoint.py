"""A checkpoint written by RankZeroValidation's validation (inside Lightning's ``on_advance_end``, before Lightning
counts the batch for its loggers) resumes at the next step: the logged steps of the fit and its resume are those
of one uninterrupted fit, each once (a resume once logged the checkpoint's step twice)."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from distlab.callbacks import RankZeroValidation
from tests.helpers.tiny import quiet_cpu_trainer


class Logged(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        loss = nn.functional.cross_entropy(self.net(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", nn.functional.cross_entropy(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def _loader(self, n: int) -> DataLoader:
        x = torch.randn(n, 4, generator=torch.Generator().manual_seed(n))
        return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=2)

    def train_dataloader(self):
        return self._loader(40)

    def val_dataloader(self):
        return self._loader(4)


def _fit(root: Path, max_steps: int, accumulate: int, ckpt_path: str | None = None) -> list[int]:
    """The steps train_loss was logged at."""
    trainer = quiet_cpu_trainer(
        max_steps=max_steps,
        accumulate_grad_batches=accumulate,
        logger=CSVLogger(root, name="", version=""),
        log_every_n_steps=1,
        enable_checkpointing=True,
        callbacks=[
            RankZeroValidation(every_n_steps=2),
            ModelCheckpoint(dirpath=root / "ckpt", save_top_k=-1),
        ],
    )
    trainer.fit(Logged(), ckpt_path=ckpt_path)
    with open(root / "metrics.csv") as f:
        return [int(r["step"]) for r in csv.DictReader(f) if r.get("train_loss")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_resume_from_a_checkpoint_saved_in_validation_logs_each_step_once(tmp_path, accumulate):
    torch.manual_seed(0)
    whole = _fit(tmp_path / "whole", 4, accumulate)
    first = _fit(tmp_path / "part", 2, accumulate)
    [ckpt] = (tmp_path / "part" / "ckpt").glob("*step=2.ckpt")
    resumed = _fit(tmp_path / "resumed", 4, accumulate, ckpt_path=str(ckpt))  # its own metrics.csv
    assert sorted(set(whole)) == list(range(4)), whole
    assert sorted(set(first)) == [0, 1] and sorted(set(resumed)) == [2, 3], (first, resumed)
