"""``self.log(..., logger=False)`` under RankZeroValidation does what it does in Lightning's own loop: the value
reaches ``trainer.callback_metrics`` (callbacks may monitor it) but not the loggers, nor the results ``validate``
returns; on 1 process against Lightning itself, and on 2 gloo ranks (rank-0 mode: the names travel with rank 0's
numbers)."""

from __future__ import annotations

import csv
from datetime import timedelta
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from distlab.callbacks import RankZeroValidation
from distlab.strategies import OptimizerSyncDDPStrategy


class HiddenValueModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        loss = self.net(x).pow(2).mean()
        self.log("val_loss", loss)
        self.log("val_hidden", 2 * loss, logger=False)

    def val_dataloader(self):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x), batch_size=2)


def validate(tmp_path: Path, world: int, callbacks: list) -> tuple[set[str], set[str], set[str]]:
    """(names validate returned, names the CSV logger wrote, names in callback_metrics; the last only in-process)."""
    strategy = (
        "auto"
        if world == 1
        else OptimizerSyncDDPStrategy(start_method="forkserver", timeout=timedelta(seconds=60))
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        logger=CSVLogger(tmp_path, name="", version=""),
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    torch.manual_seed(0)
    [results] = trainer.validate(HiddenValueModule(), verbose=False)
    with open(tmp_path / "metrics.csv") as f:
        columns = set(next(csv.reader(f))) - {"step", "epoch"}
    ours = {"val_time_s"}  # what RankZeroValidation adds
    return set(results) - ours, columns - ours, set(trainer.callback_metrics) - ours


def test_a_value_logged_with_logger_false_reaches_callbacks_not_loggers_as_in_lightning(tmp_path):
    want = validate(tmp_path / "lightning", 1, [])
    assert want == ({"val_loss"}, {"val_loss"}, {"val_loss", "val_hidden"})  # Lightning's own loop
    assert validate(tmp_path / "distlab", 1, [RankZeroValidation()]) == want


@pytest.mark.timeout(300)
def test_two_ranks_keep_a_logger_false_value_from_the_loggers(tmp_path):
    returned, written, _ = validate(tmp_path, 2, [RankZeroValidation()])
    assert (returned, written) == ({"val_loss"}, {"val_loss"})
