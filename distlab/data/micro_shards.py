"""A map-style dataset served as micro-batches that are the same at every world size (reproducible mode).

A DistributedSampler deals samples out by rank, so a micro-batch on 2 ranks holds other samples than on 1; each
micro-batch of :class:`MicroShards` exists at every world size that divides ``micro_shards`` (``ddp_optimizer_sync``
with ``reproducible: true`` calls :meth:`MicroShards.configure`; without it V = the world size).

Example::

    def train_dataloader(self):
        return DataLoader(MicroShards(self.train_set, batch_size=16, seed=0), batch_size=None)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, default_collate

from distlab.data.workers import refuse_loader_workers
from distlab.distributed import world_info
from distlab.domains import NonNegativeInt, PositiveInt, check_domains


class MicroShards(IterableDataset):
    """Endless micro-batches of ``dataset``: optimizer step s's global batch is the next ``batch_size * V`` samples
    of a permutation of the dataset drawn from (seed, epoch) (an epoch's remainder smaller than a global batch is
    left out), cut into V micro-batches of ``batch_size``; rank r of W serves micro-batches r*V/W ... (r+1)*V/W - 1
    of each step, in order, collated by ``collate_fn``. Resumes from a step (``resumes_from_step``).

    Args:
        dataset: any map-style dataset (``len`` and ``[i]``).
        batch_size: samples per micro-batch.
        seed: the permutations' seed.
        collate_fn: how samples become a batch (torch's default_collate).
    """

    endless = True  # distlab's strategies skip their "did a rank run out?" exchange
    resumes_from_step = True  # a resume continues where the checkpoint's step was (DataResumeCheck)
    same_at_every_world_size = True  # what reproducible mode requires of the training data

    def __init__(
        self,
        dataset: Dataset,
        batch_size: PositiveInt,
        seed: NonNegativeInt = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        check_domains(MicroShards.__init__, {"batch_size": batch_size, "seed": seed})
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.collate_fn = collate_fn or default_collate
        self.micro_shards: int | None = None  # None: one per rank (set by configure)
        self.rank: int | None = None
        self.world: int | None = None
        self.start_micro_step = 0

    def configure(self, micro_shards: int, rank: int, world: int, start_micro_step: int = 0) -> None:
        """Serve rank ``rank`` of ``world`` its share of ``micro_shards`` micro-batches per step, from micro step
        ``start_micro_step`` (the strategy calls it at train start)."""
        self.micro_shards, self.rank, self.world = micro_shards, rank, world
        self.start_micro_step = start_micro_step

    def draw_plan(self) -> str:
        """How the global batches are drawn, and from how many samples (a resume compares it with the checkpoint's)."""
        shards = self.micro_shards or (self.world if self.world is not None else world_info()[0])
        return (
            f"{self.batch_size * shards} samples per step (batch_size {self.batch_size} x {shards} micro-batches) "
            f"from {len(self.dataset):,} samples"
        )

    def micro_batch(self, micro_step: int) -> Any:
        """This rank's ``micro_step``-th micro-batch (counted from the start of training)."""
        world, rank = (self.world, self.rank) if self.world is not None else world_info()
        shards = self.micro_shards or world
        per_rank = shards // world
        step, i = divmod(micro_step, per_rank)
        global_batch = self.batch_size * shards
        steps_per_epoch = len(self.dataset) // global_batch
        if steps_per_epoch == 0:
            raise ValueError(
                f"MicroShards: the dataset has {len(self.dataset)} samples, fewer than one global batch of "
                f"batch_size x micro_shards = {self.batch_size} x {shards}; lower batch_size"
            )
        epoch, k = divmod(step, steps_per_epoch)
        order = self._order(epoch)
        shard = rank * per_rank + i
        lo = k * global_batch + shard * self.batch_size
        return self.collate_fn([self.dataset[int(j)] for j in order[lo : lo + self.batch_size]])

    def _order(self, epoch: int) -> torch.Tensor:
        """The permutation of epoch ``epoch`` (the same in every process)."""
        if getattr(self, "_cached", (None,))[0] != epoch:
            generator = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) % 2**63)
            self._cached = (epoch, torch.randperm(len(self.dataset), generator=generator))
        return self._cached[1]

    def __iter__(self) -> Iterator[Any]:
        refuse_loader_workers(self)
        return map(self.micro_batch, itertools.count(self.start_micro_step))
