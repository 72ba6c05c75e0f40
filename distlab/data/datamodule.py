"""LightningDataModule over the embedded stdlib corpus, user text files, or uint16 .bin shards."""

from __future__ import annotations

import math

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from distlab.data.corpus import TokenSplits, load_corpus
from distlab.data.windows import TrainWindows, ValWindows
from distlab.domains import (
    ExistingPath,
    FileSuffix,
    OpenUnitInterval,
    PositiveInt,
    Seed,
    check_domains,
)
from distlab.errors import ConfigError


class TextDataModule(L.LightningDataModule):
    """Byte-level language-modelling data.

    Args:
        paths: None for the embedded Python-stdlib corpus (no download); otherwise text files /
            folders, or ``.bin`` shards (names containing ``val`` are validation shards).
        seq_len: tokens per training window (must not exceed the model's ``sequence_len``).
        batch_size: windows per rank per micro-batch; the global batch is ``batch_size * world_size`` (times
            accumulate_grad_batches; in reproducible mode ``batch_size * micro_shards`` at every world size).
        val_fraction: share of documents (by stable path hash) held out for validation; of one file, its last
            val_fraction of tokens.
        max_val_windows: cap on validation windows (None = the whole split). The set is fixed.
        seed: the training stream is a pure function of (seed, step).
        val_batch_size: windows per validation batch (default: batch_size).
        extensions: which files a folder in ``paths`` contributes (None: every file).

    Example YAML::

        data:
          seq_len: 256
          batch_size: 16
    """

    def __init__(
        self,
        paths: list[ExistingPath] | None = None,
        seq_len: PositiveInt = 256,
        batch_size: PositiveInt = 16,
        val_batch_size: PositiveInt | None = None,
        val_fraction: OpenUnitInterval = 0.02,
        max_val_windows: PositiveInt | None = 256,
        seed: Seed = 1234,
        extensions: tuple[FileSuffix, ...] | None = (".py", ".txt", ".md", ".rst"),
    ) -> None:
        check_domains(TextDataModule.__init__, locals())
        if paths is not None and len(paths) == 0:
            raise ConfigError(
                "data.paths=[] names no files; leave data.paths unset (null) for the embedded corpus, or list files"
            )
        super().__init__()
        self.save_hyperparameters()
        self.paths, self.seq_len, self.batch_size = paths, seq_len, batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.val_fraction, self.max_val_windows, self.seed = val_fraction, max_val_windows, seed
        self.extensions = extensions
        self.splits: TokenSplits | None = None

    def prepare_splits(self) -> TokenSplits:
        """Load and check the corpus (idempotent). Raises ConfigError with a one-line message."""
        if self.splits is None:
            splits = load_corpus(self.paths, self.val_fraction, self.extensions)
            need, shards = self.seq_len + 1, splits.description.endswith(".bin shards")
            longest = max((len(a) for a in splits.train), default=0)
            if longest < need:  # a window never crosses shards or files
                raise ConfigError(
                    f"training split has {splits.n_train} tokens, fewer than one window of seq_len+1={need} in any one "
                    f"{'shard' if shards else 'file'} (the longest has {longest}); "
                    + (f"set data.seq_len to at most {longest - 1}, or " if longest >= 2 else "")
                    + "add data"
                )
            if not any(len(a) >= need for a in splits.val):
                raise ConfigError(
                    f"validation split has {splits.n_val} tokens, fewer than one window of seq_len+1={need}; "
                    + (
                        "prepare the shards again with a larger --val_fraction (val_*.bin is validation)"
                        if shards
                        else f"raise data.val_fraction (to at least {math.ceil(need / (splits.n_train + splits.n_val) * 1000) / 1000:g})"
                        if splits.n_files == 1
                        else "raise data.val_fraction (files go wholly to one split by a hash of their path), add files"
                    )
                    + ", or lower data.seq_len"
                )
            rank_zero_info(
                f"data: {splits.description}, train {splits.n_train:,} tokens, val {splits.n_val:,} tokens"
            )
            self.splits = splits
        return self.splits

    def setup(self, stage: str) -> None:
        self.prepare_splits()
        if stage == "fit" and self.trainer is not None:
            self.check_before_fit(self.trainer)

    def check_before_fit(self, trainer: L.Trainer) -> None:
        """What the CLI asks before it writes anything (a fit from Python hears the same at ``setup``): the data, and
        as the training stream is endless (its epoch never ends), a step count for the fit to end, and a step cadence
        for validation (RankZeroValidation's, or an integer val_check_interval)."""
        from distlab.metric_direction import check_monitors_see_validation

        self.prepare_splits()
        if trainer.max_steps is None or trainer.max_steps < 1 and not trainer.fast_dev_run:
            raise ConfigError(
                f"trainer.max_steps={trainer.max_steps}: the text data is an endless stream, so the fit would never "
                "end; set trainer.max_steps to a number of steps"
            )
        validating = trainer.limit_val_batches != 0 and not any(
            getattr(cb, "validates_on_steps", False) for cb in trainer.callbacks
        )
        if validating and isinstance(trainer.val_check_interval, float):
            check_monitors_see_validation(
                trainer, "validation runs at the end of each epoch, and the text stream's epoch never ends"
            )
            rank_zero_info(
                "distlab: note: validation runs at the end of each epoch, and the text stream's epoch never ends: this "
                "fit will not validate; set trainer.val_check_interval to a step count with check_val_every_n_epoch: "
                "null (as the recipes in configs/ do), or add RankZeroValidation"
            )

    def train_dataloader(self) -> DataLoader:
        t = self.trainer
        rank, world, start, micro_shards = 0, 1, 0, None
        if t is not None:  # a resume continues the exact stream: one micro step per batch fetched so far
            rank, world, start = t.global_rank, t.world_size, t.global_step * t.accumulate_grad_batches
            micro_shards = t.strategy.micro_shards if getattr(t.strategy, "reproducible", False) else None
        args = (self.seq_len, self.batch_size, self.seed, rank, world, start, micro_shards)
        return DataLoader(TrainWindows(self.prepare_splits().train, *args), batch_size=None, num_workers=0)

    def val_dataset(self) -> ValWindows:
        return ValWindows(self.prepare_splits().val, self.seq_len, self.max_val_windows)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_dataset(), batch_size=self.val_batch_size, shuffle=False, num_workers=0)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
