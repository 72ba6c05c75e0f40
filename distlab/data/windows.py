"""Deterministic (B, T) window sampling over token arrays: training batches are a pure function of (seed, micro_step),
dealt out by rank (:class:`TrainWindows`; why, in docs/internals.md, "Data")."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from distlab.data.workers import refuse_loader_workers


class WindowIndex:
    """Maps a flat window id to (array, offset) for windows of ``length`` tokens over many arrays."""

    def __init__(self, arrays: list[np.ndarray], length: int) -> None:
        self.arrays = arrays
        self.length = length
        counts = [max(0, len(a) - length + 1) for a in arrays]
        self.cum = np.cumsum([0] + counts)
        self.n_windows = int(self.cum[-1])

    def window(self, flat: int) -> np.ndarray:
        i = int(np.searchsorted(self.cum, flat, side="right") - 1)
        off = int(flat - self.cum[i])
        return self.arrays[i][off : off + self.length]


class TrainWindows(IterableDataset):
    """Endless stream of this rank's (x, y) batches, starting at ``start_micro_step``.

    ``micro_shards`` (reproducible mode, V): the global batch of optimizer step s is V micro-batches of
    ``batch_size`` windows drawn from (seed, s); this rank's micro step i of that step is micro-batch
    rank * V/W + i, the same windows at every world size W. Without it the global batch is drawn per micro
    step and rank r takes rows [r*B, (r+1)*B)."""

    endless = True  # no rank's stream runs out: the strategies skip their "last batch?" exchange
    resumes_from_step = True  # a resume continues the stream exactly (start_micro_step; see DataResumeCheck)

    def __init__(
        self,
        arrays: list[np.ndarray],
        seq_len: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        start_micro_step: int = 0,
        micro_shards: int | None = None,
    ) -> None:
        self.index = WindowIndex(arrays, seq_len + 1)
        self.micro_shards = micro_shards
        self.same_at_every_world_size = micro_shards is not None  # reproducible mode's requirement
        self.batch_size, self.seed = batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.start_micro_step = start_micro_step

    def draw_plan(self) -> str:
        """How the stream draws its windows, and from how many (a resume compares it with the checkpoint's)."""
        if self.micro_shards is None:
            shards = f"{self.world_size} rank{'s' if self.world_size > 1 else ''}"
            how = f"{self.batch_size * self.world_size} windows per micro step (batch_size {self.batch_size} x {shards})"
        else:
            how = (
                f"{self.batch_size * self.micro_shards} windows per step (reproducible mode: batch_size "
                f"{self.batch_size} x micro_shards {self.micro_shards})"
            )
        return f"{how} from {self.index.n_windows:,} windows"

    def batch(self, micro_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        # without micro_shards V = W: each micro step draws its own global batch (the same on every rank)
        B, shards = self.batch_size, self.micro_shards or self.world_size
        per_rank = shards // self.world_size
        step, i = divmod(micro_step, per_rank)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, step])))
        ids = rng.integers(0, self.index.n_windows, size=B * shards)
        shard = self.rank * per_rank + i
        mine = ids[shard * B : (shard + 1) * B]
        w = torch.from_numpy(np.stack([self.index.window(int(i)) for i in mine]).astype(np.int64))  # (B, T+1)
        return w[:, :-1], w[:, 1:]  # inputs (B, T), targets (B, T)

    def __iter__(self):
        refuse_loader_workers(self)
        return map(self.batch, itertools.count(self.start_micro_step))


class ValWindows(Dataset):
    """Non-overlapping windows over the validation arrays, in order (a fixed, finite set)."""

    def __init__(self, arrays: list[np.ndarray], seq_len: int, max_windows: int | None = None) -> None:
        self.arrays, self.length = arrays, seq_len + 1
        # Windows overlap by one token so every token after the first is predicted exactly once.
        starts = ((ai, off) for ai, a in enumerate(arrays) for off in range(0, len(a) - seq_len, seq_len))
        self.items = list(starts)[:max_windows]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        ai, off = self.items[i]
        w = torch.from_numpy(self.arrays[ai][off : off + self.length].astype(np.int64))
        return w[:-1], w[1:]
