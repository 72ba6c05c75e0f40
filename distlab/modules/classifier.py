"""LightningModule for image classification: the DigitsCNN, cross-entropy, accuracy, Muon + AdamW."""

from __future__ import annotations

from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from distlab.data import DigitsDataModule, TextDataModule
from distlab.data.digits import N_DIGIT_CLASSES
from distlab.domains import (
    AtLeastTwo,
    LearningRate,
    NonNegative,
    NonNegativeInt,
    PositiveInt,
    UnitInterval,
    check_domains,
)
from distlab.dtypes import NSDtypeName
from distlab.errors import ConfigError
from distlab.models.cnn import DigitsCNN
from distlab.modules.base import CheckedModule
from distlab.modules.schedule import ScheduleName, stepped_schedule
from distlab.optim import DistMuonAdamW, muon_param_groups


class ImageClassifier(CheckedModule, L.LightningModule):
    """Trains :class:`distlab.models.cnn.DigitsCNN`; logs ``train_loss``, ``val_loss``, ``val_acc`` (and test_*).

    Written as a user would write a Lightning module (``self.log`` of the loss, a torchmetrics metric
    logged as an object); distlab's RankZeroValidation makes both exact on any number of ranks.

    Args:
        width: the one size knob (channels of the first convolution).
        n_classes: number of classes.
        optimizer: "muon" (Muon for the conv kernels and hidden matrices, AdamW for the head and biases)
            or "adamw" (AdamW everywhere).
        muon_lr: Muon learning rate. adamw_lr: AdamW learning rate (head, biases; every group under "adamw").
        weight_decay: decoupled weight decay for all groups.
        schedule: "linear" (constant then warmdown), "cosine", or "constant" after warmup.
        warmup_steps: linear warmup steps. warmdown_ratio: share of max_steps in the final linear decay.
        ns_dtype: Newton-Schulz's dtype, as GPTLightningModule's ("auto": bf16 where every rank multiplies
            bf16 in hardware, else fp32).
    """

    def __init__(
        self,
        width: PositiveInt = 32,
        n_classes: AtLeastTwo = 10,
        optimizer: Literal["muon", "adamw"] = "muon",
        muon_lr: LearningRate = 0.02,
        adamw_lr: LearningRate = 3e-3,
        weight_decay: NonNegative = 0.0,
        schedule: ScheduleName = "linear",
        warmup_steps: NonNegativeInt = 10,
        warmdown_ratio: UnitInterval = 0.4,
        ns_dtype: NSDtypeName = "auto",
    ) -> None:
        check_domains(ImageClassifier.__init__, locals())
        super().__init__()
        self.save_hyperparameters()
        self.model = DigitsCNN(width=width, n_classes=n_classes)
        self.val_acc = MulticlassAccuracy(n_classes, average="micro")
        self.test_acc = MulticlassAccuracy(n_classes, average="micro")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images)

    def check_data(self, datamodule: object) -> None:
        """Refuse data this module cannot train on (the CLI asks before anything is written; a fit from Python, at its
        start): token batches (distlab's TextDataModule), or digit labels beyond ``n_classes``, which would fail
        inside the first step."""
        if isinstance(datamodule, DigitsDataModule) and self.hparams.n_classes < N_DIGIT_CLASSES:
            raise ConfigError(
                f"model.n_classes={self.hparams.n_classes} but the digits data has {N_DIGIT_CLASSES} labels (0-9); "
                f"set model.n_classes >= {N_DIGIT_CLASSES}"
            )
        if isinstance(datamodule, TextDataModule):
            raise ConfigError(
                f"{type(self).__name__} trains on (images, labels) batches, and {type(datamodule).__name__} gives (B, T) "
                "token ids; use DigitsDataModule (or your own data module of images), or GPTLightningModule for text"
            )

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        images, labels = batch  # (B, 1, 8, 8), (B,)
        loss = F.cross_entropy(self.model(images), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def _eval_step(self, batch, prefix: str, acc) -> None:
        images, labels = batch
        logits = self.model(images)  # (B, classes)
        self.log(f"{prefix}_loss", F.cross_entropy(logits, labels))  # mean over the set, batch-size weighted
        acc.update(logits, labels)
        self.log(f"{prefix}_acc", acc, prog_bar=True)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "val", self.val_acc)

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "test", self.test_acc)

    def configure_optimizers(self):
        hp = self.hparams
        everything_adamw = {} if hp.optimizer == "muon" else {"adamw": ("*",)}
        groups = muon_param_groups(
            self.model,
            lr=hp.muon_lr,
            adamw_lr=hp.adamw_lr,
            weight_decay=hp.weight_decay,
            adamw_weight_decay=hp.weight_decay,
            **everything_adamw,
        )
        optimizer = DistMuonAdamW(groups, ns_dtype=hp.ns_dtype)
        return stepped_schedule(optimizer, self.trainer.max_steps, hp)
