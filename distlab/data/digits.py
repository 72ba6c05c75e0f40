"""scikit-learn's bundled 8x8 handwritten digits (1797 images, shipped inside the package: no download).

A fixed, seeded split into training and validation images. The validation set is evaluated whole
(RankZeroValidation); the training loader is shuffled (Lightning shards it across ranks).

Example YAML::

    data:
      class_path: distlab.data.DigitsDataModule
      init_args: {batch_size: 64, val_fraction: 0.2}
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from distlab.domains import OpenUnitInterval, PositiveInt, Seed, check_domains
from distlab.errors import ConfigError

N_DIGIT_CLASSES = 10  # labels 0-9


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """(images (N, 1, 8, 8) float in [0, 1], labels (N,) int64) from scikit-learn's bundled copy."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ConfigError(
            "the digits data ships with scikit-learn, which is not installed; pip install 'distlab[examples]'"
        ) from None
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8)
    return images, torch.tensor(digits.target, dtype=torch.int64)


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
        images, labels = load_digits_tensors()
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
