"""The 8x8 handwritten digits (1797 images, shipped inside distlab: no download, no extra dependency).

The data is the test set of E. Alpaydin and C. Kaynak's "Optical Recognition of Handwritten Digits" (UCI Machine
Learning Repository, 1998, https://doi.org/10.24432/C50P49, licensed CC BY 4.0), in the row order scikit-learn's
``load_digits`` has: ``digits.csv.gz`` holds one image per line, 64 pixel counts in 0..16 and then the label.

A fixed, seeded split into training and validation images. The validation set is evaluated whole
(RankZeroValidation); the training loader is shuffled (Lightning shards it across ranks).

Example YAML::

    data:
      class_path: distlab.data.DigitsDataModule
      init_args: {batch_size: 64, val_fraction: 0.2}
"""

from __future__ import annotations

import gzip
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from distlab.domains import OpenUnitInterval, PositiveInt, Seed, check_domains

N_DIGIT_CLASSES = 10  # labels 0-9


class DigitsDataModule(L.LightningDataModule):
    """8x8 digits, 10 classes.

    Args:
        batch_size: images per rank per step (the global batch is batch_size x world size).
        val_batch_size: images per validation batch (default: batch_size).
        val_fraction: share of the 1797 images held out for validation (a seeded split).
        seed: the split's seed.
    """

    def __init__(
        self,
        batch_size: PositiveInt = 64,
        val_batch_size: PositiveInt | None = None,
        val_fraction: OpenUnitInterval = 0.2,
        seed: Seed = 0,
    ) -> None:
        check_domains(DigitsDataModule.__init__, locals())
        super().__init__()
        self.save_hyperparameters()
        self.batch_size, self.val_batch_size = batch_size, val_batch_size or batch_size
        self.val_fraction, self.seed = val_fraction, seed
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None

    def setup(self, stage: str) -> None:
        """Split the images by ``seed`` (idempotent)."""
        if self.train_set is not None:
            return
        with gzip.open(Path(__file__).with_name("digits.csv.gz"), "rt") as f:
            rows = torch.from_numpy(np.loadtxt(f, delimiter=",", dtype=np.int64))  # (N, 65)
        images, labels = rows[:, :64].reshape(-1, 1, 8, 8) / 16.0, rows[:, 64]  # (N, 1, 8, 8) in [0, 1], (N,)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.seed))
        n_val = round(self.val_fraction * len(labels))
        self.train_set = TensorDataset(images[order[n_val:]], labels[order[n_val:]])
        self.val_set = TensorDataset(images[order[:n_val]], labels[order[:n_val]])

    def train_dataloader(self) -> DataLoader:
        self.setup("fit")  # (idempotent: a notebook may ask for a loader before any Trainer called setup)
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        self.setup("validate")
        return DataLoader(self.val_set, batch_size=self.val_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
