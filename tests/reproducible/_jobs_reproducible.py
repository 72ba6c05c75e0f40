"""Rank functions for tests/reproducible/test_reproducible.py (module level: the harness imports them)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from distlab.optim import DistMuonAdamW
from distlab.strategies.reproducible import GradientTree

V, STEPS = 8, 3


def micro_grads(step: int, shapes: list[tuple[int, ...]]) -> list[list[torch.Tensor]]:
    """V micro-batch gradients per param for ``step`` (the same on every rank and world size): fp32 values whose
    sums round differently in different orders."""
    g = torch.Generator().manual_seed(1000 + step)
    return [
        [torch.randn(s, generator=g) * 10 ** torch.randint(-1, 1, (1,), generator=g).item() for s in shapes]
        for _ in range(V)
    ]


def job_fixed_order(rank: int, world: int, fixed: bool, clip: float | None) -> dict:
    """W ranks each sum their V/W micro-gradients (scaled by W/V, as Lightning's accumulation does) in a
    GradientTree and step DistMuonAdamW; returns the params and the consolidated state on rank 0."""
    torch.manual_seed(0)
    shapes = [
        (6, 5),
        (6, 5),
        (4, 3, 2, 2),
        (13,),
        (3,),
    ]  # two Muon matrices, a conv kernel, AdamW of odd sizes
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    opt = DistMuonAdamW(
        [
            {"params": params[:3], "kind": "muon", "lr": 0.05},
            {"params": params[3:], "kind": "adamw", "lr": 0.01},
        ],
        max_grad_norm=clip,
        ns_dtype="float32",
        grad_sync="reduce",
    )
    if fixed:
        opt.fixed_order = V
    per_rank = V // world
    tree = GradientTree()
    for step in range(STEPS):
        grads = micro_grads(step, shapes)
        for i in range(per_rank):
            for p, g in zip(params, grads[rank * per_rank + i], strict=True):
                p.grad = g * (world / V)  # Lightning divides each micro-batch's loss by V/W (a power of two)
            tree.add(params)
        tree.finish(params)
        opt.step()
        opt.zero_grad()
    opt.consolidate_state_dict()
    state = opt.state_dict() if rank == 0 else None
    dist.barrier()
    return {"params": [p.detach().clone() for p in params], "state": state, "norm": opt.last_grad_norm}
