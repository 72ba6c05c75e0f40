"""Shrinking a recipe for tests: the same code paths, a model and a run small enough for seconds."""

from __future__ import annotations

from pathlib import Path

import yaml

from distlab.testing import TINY_GPT

# Per model class (by class_path); a recipe whose model is not listed runs at its own size.
SHRINK = {
    "distlab.modules.GPTLightningModule": [
        *(f"--model.{key}={value}" for key, value in TINY_GPT.items()),
        f"--data.seq_len={TINY_GPT['sequence_len']}",
        "--data.batch_size=2",
        "--data.max_val_windows=8",
    ],
}


def model_class(recipe: Path) -> str:
    """The class_path of a recipe's model (the GPT module when the recipe names none)."""
    model = (yaml.safe_load(recipe.read_text()) or {}).get("model") or {}
    return model.get("class_path", "distlab.modules.GPTLightningModule")


def quiet_cpu_trainer(**kwargs):
    """A one-process CPU Trainer that writes and prints nothing of its own (no logger, checkpoints, progress bar,
    model summary or sanity check); ``kwargs`` add to or override that."""
    import lightning as L

    quiet = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    return L.Trainer(**{**quiet, **kwargs})
