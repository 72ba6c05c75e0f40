"""LightningDataModule over the embedded stdlib corpus, user text files, or uint16 .bin shards."""

from __future__ import annotations

import inspect

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
            try:
                splits = load_corpus(self.paths, self.val_fraction, self.extensions)
            except FileNotFoundError as e:
                raise ConfigError(str(e)) from None
            need = self.seq_len + 1
            for name, pieces in (("training", splits.train), ("validation", splits.val)):
                longest = max((len(a) for a in pieces), default=0)
                if longest < need <= sum(len(a) for a in pieces):  # enough tokens, but in pieces too short
                    raise ConfigError(
                        f"no {name} shard holds one window of seq_len+1={need} tokens (the longest has {longest}, "
                        f"{len(pieces)} shards {sum(len(a) for a in pieces)} in all; a window never crosses shards); "
                        + (f"set data.seq_len to at most {longest - 1}, or " if longest >= 2 else "")
                        + "write fewer, larger shards"
                    )
            shards = splits.description.endswith(".bin shards")
            default = inspect.signature(TextDataModule.__init__).parameters["val_fraction"].default
            if (
                shards and self.val_fraction != default
            ):  # prepare's split is in the file names: this would be inert
                raise ConfigError(
                    f"data.val_fraction={self.val_fraction:g} has no effect on token shards: distlab prepare fixed the "
                    "split (val_*.bin is validation); remove data.val_fraction, or prepare the shards again with "
                    f"--val_fraction {self.val_fraction:g}"
                )
            if shards and splits.n_train == 0:
                raise ConfigError(
                    f"data.paths holds {splits.n_val:,} tokens, all in validation shards (a .bin file whose name "
                    "contains 'val' is validation data); write the training tokens to a shard named train_*.bin"
                )
            total = splits.n_train + splits.n_val
            if splits.n_files == 1 and total < 2 * need:  # one file: a training and a validation window
                raise ConfigError(
                    f"data.paths gives one file of {total:,} tokens, too short for a training and a validation window "
                    f"of seq_len+1={need} tokens each; set data.seq_len to at most {max(1, total // 2 - 1)}, or add text"
                )
            if not any(len(a) >= need for a in splits.train):
                raise ConfigError(
                    f"training split has {splits.n_train} tokens, fewer than one window of seq_len+1={need}; "
                    "add data or lower data.seq_len"
                )
            if not any(len(a) >= need for a in splits.val):
                raise ConfigError(
                    f"validation split has {splits.n_val} tokens, fewer than one window of seq_len+1={need}; "
                    + (
                        "validation shards are the .bin files whose name contains 'val': add one"
                        if shards and splits.n_val == 0
                        else "prepare the shards again with a larger --val_fraction, or lower data.seq_len"
                        if shards
                        else f"raise data.val_fraction (to at least {_rounded_up(need / (splits.n_train + splits.n_val)):g})"
                        ", or lower data.seq_len"
                        if splits.n_files == 1
                        else _files_advice(splits, self.val_fraction, need)
                    )
                )
            rank_zero_info(
                f"data: {splits.description}, train {splits.n_train:,} tokens, val {splits.n_val:,} tokens"
            )
            self.splits = splits
        return self.splits

    def check_before_fit(self, trainer: L.Trainer) -> None:
        """What the CLI asks before it writes anything (a fit from Python hears the same at ``setup``)."""
        self.prepare_splits()
        self._check_the_fit_ends(trainer)

    def setup(self, stage: str) -> None:
        self.prepare_splits()
        if stage == "fit" and self.trainer is not None:
            self._check_the_fit_ends(self.trainer)

    @staticmethod
    def _check_the_fit_ends(trainer: L.Trainer) -> None:
        """The training stream is endless (its epoch never ends): the fit needs a step count to end, and validation
        a step cadence (RankZeroValidation's, or an integer val_check_interval)."""
        from distlab.metric_direction import check_monitors_see_validation

        if trainer.max_steps is None or trainer.max_steps < 1 and not trainer.fast_dev_run:
            raise ConfigError(
                f"trainer.max_steps={trainer.max_steps}: the text data is an endless stream, so the fit would never "
                "end; set trainer.max_steps to a number of steps"
            )
        if isinstance(trainer.limit_train_batches, float) and trainer.limit_train_batches != 1.0:
            raise ConfigError(
                f"trainer.limit_train_batches={trainer.limit_train_batches} is a share of an epoch, and the text data "
                "is an endless stream; set a number of batches, or trainer.max_steps"
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

    def _rank_world(self) -> tuple[int, int]:
        t = self.trainer
        return (t.global_rank, t.world_size) if t is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        start = 0
        if self.trainer is not None:
            # Resume continues the exact stream: one micro step per batch fetched so far.
            start = self.trainer.global_step * self.trainer.accumulate_grad_batches
        strategy = self.trainer.strategy if self.trainer is not None else None
        micro_shards = strategy.micro_shards if getattr(strategy, "reproducible", False) else None
        ds = TrainWindows(
            self.prepare_splits().train,
            self.seq_len,
            self.batch_size,
            self.seed,
            rank,
            world,
            start,
            micro_shards,
        )
        return DataLoader(ds, batch_size=None, num_workers=0)

    def val_dataset(self) -> ValWindows:
        return ValWindows(self.prepare_splits().val, self.seq_len, self.max_val_windows)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_dataset(), batch_size=self.val_batch_size, shuffle=False, num_workers=0)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()


def _rounded_up(x: float) -> float:
    """``x`` rounded up to two significant digits (a share that, written as shown, still reaches ``x``)."""
    import math

    scale = 10 ** (1 - math.floor(math.log10(x)))
    return math.ceil(x * scale - 1e-9) / scale


def _files_advice(splits: TokenSplits, val_fraction: float, need: int) -> str:
    """What puts a window's worth of text into validation when files go wholly to one split by a hash of their path:
    the files it holds now, and the val_fraction at which the next long-enough file joins it."""
    from distlab.data.corpus import stable_fraction

    held = ", ".join(f"{name} ({n - 1:,} bytes)" for name, n in splits.val_docs[:3]) or "no file"
    more = f" and {len(splits.val_docs) - 3} more" if len(splits.val_docs) > 3 else ""
    joining = sorted(stable_fraction(name) for name, n in splits.train_docs if n >= need)
    step = (
        f"set data.val_fraction to at least {_rounded_up(joining[0] * (1 + 1e-6)):g} (the next file long enough joins "
        "it), or add files"
        if joining and joining[0] < 1 and len(joining) > 1
        else "add files (or give one file: its last val_fraction is held out)"
    )
    return (
        f"it holds {held}{more} (files go wholly to one split by a hash of their path, here at {val_fraction:g}); "
        f"{step}, or lower data.seq_len"
    )
