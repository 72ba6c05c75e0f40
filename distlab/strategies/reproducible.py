"""Reproducible mode: the same bits on 1, 2, 4 or 8 ranks (``ddp_optimizer_sync``, ``reproducible: true``).

On another world size a gradient is summed in another order, and Muon's and Adam's normalisations amplify the last
bit: weights part after a few steps. In this mode nothing about a step's arithmetic depends on the world size W:

1. **Data**: each global batch is cut into ``micro_shards`` = V equal micro-batches, the same ones at every W; rank
   r computes micro-batches r*V/W ... (r+1)*V/W - 1, one after another, as gradient accumulation steps
   (``accumulate_grad_batches`` = V/W, set by the strategy). Each micro-batch's gradient has the same shapes and
   the same bits everywhere. The training data must say which micro-batch is which: distlab's TextDataModule, or
   a map-style dataset served by :class:`distlab.data.MicroShards`; anything else is refused in one line.
2. **Loss scale**: Lightning divides each micro-batch's loss by V/W and the optimizer divides the sum over ranks by
   W: powers of two, so the scaled gradients are exact and equal to one V-way mean.
3. **Summation order**: the micro-batch gradients are summed in :func:`distlab.distributed.tree_sum`'s fixed tree
   (:class:`GradientTree` here: each rank its own V/W, a complete subtree), then across ranks in the same tree
   (the optimizer's reduce-scatter, ``DistMuonAdamW.fixed_order``); the gradient-norm for clipping is summed over
   V fixed chunks of every parameter in one order.
4. **Everything after** is element-wise on the averaged gradient (AdamW, Muon's momentum) or whole-matrix on one
   owner (Newton-Schulz): the same at any W.

So V must be a power of two and W must divide it. What it does not cover: buffers that forward passes update
(BatchNorm running statistics follow rank 0's micro-batches, as under ``ddp``), FSDP2 (its reduce-scatter order is
FSDP2's), manual optimization (the tree needs Lightning's accumulation), and other hardware or library versions.

Example::

    distlab fit --config configs/debug.yaml --config configs/trainer/ddp_optimizer_sync_spawn_cpu.yaml \\
        --trainer.strategy.reproducible=true          # the same weights as --trainer.devices=1 (8 micro-shards)
"""

from __future__ import annotations

import functools
from typing import Any

from torch import Tensor

from distlab.distributed.collectives import tree_push
from distlab.errors import ConfigError


class GradientTree:
    """Each micro-batch's gradients, summed in :func:`~distlab.distributed.tree_sum`'s order: call :meth:`add` after
    every micro-batch's backward (it moves ``.grad`` aside) and :meth:`finish` after the last (the sum goes back
    into ``.grad``). Holds at most log2(micro-batches) + 1 copies of the gradients."""

    def __init__(self) -> None:
        self._stack: list[tuple[int, list[Tensor | None]]] = []  # (subtree size, a gradient per param)

    @staticmethod
    def _plus(a: list[Tensor | None], b: list[Tensor | None]) -> list[Tensor | None]:
        return [y if x is None else x if y is None else x + y for x, y in zip(a, b, strict=True)]

    def add(self, params: list[Tensor]) -> None:
        grads = [p.grad for p in params]
        for p in params:
            p.grad = None
        tree_push(self._stack, grads, self._plus)

    def finish(self, params: list[Tensor]) -> None:
        if not self._stack:
            return
        total = functools.reduce(self._plus, (grads for _, grads in self._stack))  # left to right
        self._stack = []
        for p, g in zip(params, total, strict=True):
            p.grad = g


def check_plan(micro_shards: int, world: int, accumulate: int) -> int:
    """The accumulation steps per rank (V / W), or a one-line ConfigError when W ranks cannot share V equally or
    the user set another accumulation."""
    if micro_shards % world:
        dividing = [w for w in (1, 2, 4, 8, 16, 32, 64) if micro_shards % w == 0]
        other = f"run on {', '.join(map(str, dividing))} ranks"
        if world & (world - 1):  # not a power of two: no power-of-two micro_shards is shared equally
            raise ConfigError(
                f"reproducible mode sums micro-batches in a binary tree, so it runs on a power-of-two number of ranks, "
                f"and this run has {world}; {other} (trainer.devices x trainer.num_nodes), or set "
                "trainer.strategy.reproducible=false"
            )
        raise ConfigError(
            f"reproducible mode cuts each global batch into micro_shards={micro_shards} equal micro-batches, and "
            f"{world} ranks cannot share {micro_shards} equally; set trainer.strategy.micro_shards={world} (or a "
            f"larger power of two), or {other}"
        )
    per_rank = micro_shards // world
    if accumulate not in (1, per_rank):
        raise ConfigError(
            f"trainer.accumulate_grad_batches={accumulate} under reproducible mode, which sets it itself (micro_shards "
            f"/ ranks = {micro_shards}/{world} = {per_rank}); leave accumulate_grad_batches unset"
        )
    return per_rank


def check_training_data(dataset: Any) -> None:
    """The training data must serve the same micro-batches at every world size (one-line ConfigError otherwise)."""
    if not getattr(dataset, "same_at_every_world_size", False):
        raise ConfigError(
            f"reproducible mode needs training data whose micro-batches are the same at every world size, and the "
            f"training loader's dataset is a {type(dataset).__name__} (a sampler deals its samples out by rank): serve "
            "it with distlab.data.MicroShards(dataset, batch_size) (or use distlab's TextDataModule)"
        )
