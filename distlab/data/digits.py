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

    # Its training loader is map-style: each rank's share comes from Lightning's DistributedSampler
    # (trainer.use_distributed_sampler), not from the data module itself.
    deals_by_rank = False

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

    def check_before_fit(self, trainer: L.Trainer) -> None:
        """What the CLI asks before it writes anything (a fit from Python hears the same at ``setup``)."""
        self.prepare_splits(trainer.world_size)

    def setup(self, stage: str) -> None:
        self.prepare_splits(self.trainer.world_size if self.trainer is not None else 1)

    def prepare_splits(self, world_size: int = 1) -> None:
        """Split the images (idempotent) and check that the training split fills one batch on each of
        ``world_size`` ranks (its loader drops a partial batch): one line naming the settings otherwise."""
        if self.train_set is not None:
            return
        images, labels = load_digits_tensors()
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.seed))
        n_val = round(self.val_fraction * len(labels))
        val, train = order[:n_val], order[n_val:]
        if len(val) == 0 or len(train) == 0:
            empty = "validation" if len(val) == 0 else "training"
            raise ConfigError(
                f"data.val_fraction={self.val_fraction} leaves the {empty} split of the {len(labels)} digits empty; "
                f"set data.val_fraction so both hold samples (e.g. 0.2)"
            )
        per_rank = -(-len(train) // world_size)  # (the distributed sampler pads every rank to this)
        if per_rank < self.batch_size:
            most = int((1 - self.batch_size * world_size / len(labels)) * 100) / 100  # (rounded down)
            fix = f"set data.val_fraction to at most {most:.2f} or " if most > 0 else ""
            raise ConfigError(
                f"the training split holds {len(train)} of the {len(labels)} digits (data.val_fraction={self.val_fraction}), "
                f"{per_rank} on each of {world_size} rank(s): fewer than one batch of data.batch_size={self.batch_size} "
                f"(a partial batch is dropped, so the fit would train nothing); {fix}lower data.batch_size"
            )
        self.train_set = TensorDataset(images[train], labels[train])
        self.val_set = TensorDataset(images[val], labels[val])

    def train_dataloader(self) -> DataLoader:
        self.setup("fit")  # (idempotent: a notebook may ask for a loader before any Trainer called setup)
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        self.setup("validate")
        return DataLoader(self.val_set, batch_size=self.val_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
