"""RankZeroValidation asks the module for its validation data once per validation (and once when the fit starts,
to check it), not twice: a ``val_dataloader`` that builds or prints something does it once each time."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from distlab.callbacks import RankZeroValidation


class CountingModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.val_loader_calls = 0

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        self.log("val_loss", self.net(x).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=2)

    def val_dataloader(self):
        self.val_loader_calls += 1
        return DataLoader(TensorDataset(torch.randn(6, 4)), batch_size=2)


def test_val_dataloader_is_called_once_per_validation(tmp_path):
    module = CountingModule()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=6,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[validation := RankZeroValidation(every_n_steps=2)],
    )
    trainer.fit(module)
    assert [h["step"] for h in validation.history] == [2, 4, 6]
    assert module.val_loader_calls == 1 + 3  # the check at the fit's start, then one per validation
