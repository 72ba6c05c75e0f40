"""The evaluation sets of an exact evaluation: each DataLoader's samples (the ones its sampler picks, each once) and
how it batches them, cut into the ranks' contiguous shards (no padding, no duplicates)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
    Subset,
)

from distlab.errors import ConfigError


def shard_indices(n: int, rank: int, world: int) -> range:
    """Contiguous, disjoint, covering: rank r gets [r*n//W, (r+1)*n//W). No padding, no duplicates."""
    return range(rank * n // world, (rank + 1) * n // world)


@dataclass
class EvalData:
    """The evaluation set and how the user's loader batches it."""

    dataset: Dataset
    batch_size: int
    collate_fn: Callable | None = None
    drop_last: bool = False

    @classmethod
    def from_loaders(cls, loaders: Any, what: str) -> list[EvalData]:
        """One per DataLoader, in Lightning's ``dataloader_idx`` order: a loader, or a list, tuple or dict of them
        (a dict's values in their order, as Lightning's sequential CombinedLoader takes them)."""
        if isinstance(loaders, dict):
            loaders = list(loaders.values())
        if not isinstance(loaders, (list, tuple)):
            return [cls.from_loader(loaders, what)]
        if not loaders:
            raise ConfigError(f"exact evaluation got no DataLoader for {what} (an empty collection)")
        return [
            cls.from_loader(loader, f"{what} [{i}]" if len(loaders) > 1 else what)
            for i, loader in enumerate(loaders)
        ]

    @classmethod
    def from_loader(cls, loader: Any, what: str) -> EvalData:
        if not isinstance(loader, DataLoader):
            raise ConfigError(f"exact evaluation needs a DataLoader for {what}, got {type(loader).__name__}")
        dataset = loader.dataset
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            raise ConfigError(
                f"exact evaluation needs a map-style {what} dataset (with __len__), got {type(dataset).__name__}"
            )
        if loader.batch_size is None:
            raise ConfigError(
                f"exact evaluation needs the {what} DataLoader built with batch_size= (not a batch_sampler)"
            )
        return cls(
            _sampled(dataset, loader.sampler, what), loader.batch_size, loader.collate_fn, loader.drop_last
        )

    def loader(self, indices: range | None = None) -> DataLoader:
        ds = self.dataset if indices is None else Subset(self.dataset, indices)
        return DataLoader(
            ds, batch_size=self.batch_size, collate_fn=self.collate_fn, drop_last=self.drop_last
        )

    def first(self, n_batches: int) -> EvalData:
        """Only the first ``n_batches`` batches (``fast_dev_run``)."""
        keep = range(min(n_batches * self.batch_size, len(self.dataset)))
        return EvalData(Subset(self.dataset, keep), self.batch_size, self.collate_fn, self.drop_last)


def _sampled(dataset: Any, sampler: Any, what: str) -> Any:
    """The samples a loader's sampler picks (a ``SubsetRandomSampler`` over part of a dataset: that part), each
    once; the whole dataset for a sequential sampler, or a DistributedSampler (a rank's share of the whole set)."""
    if sampler is None or isinstance(sampler, (SequentialSampler, DistributedSampler)):
        return dataset
    picked = list(iter(sampler))
    if len(set(picked)) != len(picked):
        raise ConfigError(
            f"exact evaluation takes each sample once, and the {what} DataLoader's {type(sampler).__name__} draws some "
            f"more than once ({len(picked)} draws of {len(set(picked))} samples); give it a sampler without "
            "replacement, or a Subset of the samples"
        )
    return dataset if len(picked) == len(dataset) else Subset(dataset, picked)
