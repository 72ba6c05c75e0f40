"""Every recipe's checkpoint callbacks: last.ckpt is the latest state and best-*.ckpt the best one.

Lightning 2.6 writes ``save_last=True``'s last.ckpt only when a top-k checkpoint is saved in that
step; with ``save_top_k: 1`` it is a copy of the best, and resuming from it would silently drop the
steps since. Here a scripted module makes every monitored metric better at step 2 than at step 4, the
recipe's own checkpoint callbacks run, and the files must say: best at step 2, last at step 4.
"""

from __future__ import annotations

import importlib

import lightning as L
import pytest
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

from distlab.callbacks import RankZeroValidation
from tests.helpers.cli import CONFIGS

RECIPES = sorted(CONFIGS.glob("*.yaml"))


def checkpoint_callbacks(recipe) -> list[dict]:
    callbacks = ((yaml.safe_load(recipe.read_text()) or {}).get("trainer") or {}).get("callbacks") or []
    return [c.get("init_args") or {} for c in callbacks if c["class_path"].endswith("ModelCheckpoint")]


class Scripted(L.LightningModule):
    """Logs each monitored metric: good at the first validation (step 2), worse at the second (step 4)."""

    def __init__(self, monitors: dict[str, str]) -> None:
        super().__init__()
        self.monitors, self.net = monitors, torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).square().mean()

    def validation_step(self, batch, batch_idx):
        later = self.global_step > 2
        for name, mode in self.monitors.items():
            good, bad = (1.0, 2.0) if mode == "min" else (2.0, 1.0)
            self.log(name, bad if later else good)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_last_is_the_latest_and_best_is_the_best(recipe, tmp_path):
    specs = checkpoint_callbacks(recipe)
    if not specs:
        pytest.skip(
            f"{recipe.name} configures no ModelCheckpoint (Lightning's default saves the latest only)"
        )
    cls = importlib.import_module("lightning.pytorch.callbacks").ModelCheckpoint
    ckpts = [cls(**{**spec, "dirpath": tmp_path / "ckpt"}) for spec in specs]
    monitors = {s["monitor"]: s.get("mode", "min") for s in specs if s.get("monitor")}
    data = TensorDataset(torch.randn(16, 2))
    trainer = L.Trainer(
        max_steps=4,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[RankZeroValidation(every_n_steps=2), *ckpts],
    )
    trainer.fit(Scripted(monitors), DataLoader(data, batch_size=2), DataLoader(data, batch_size=4))
    steps = {
        p.name: torch.load(p, weights_only=True)["global_step"] for p in (tmp_path / "ckpt").glob("*.ckpt")
    }
    assert steps.get("last.ckpt") == 4, f"{recipe.name}: last.ckpt should hold the latest step: {steps}"
    best = {name: step for name, step in steps.items() if name.startswith("best")}
    if monitors:
        assert best and set(best.values()) == {2}, f"{recipe.name}: the best checkpoint is step 2's: {steps}"
