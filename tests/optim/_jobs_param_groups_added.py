"""Rank functions for tests/optim/test_param_groups_added.py."""

from __future__ import annotations

import torch

from distlab.optim import DistMuonAdamW

STEPS = 4


def _grad(seed: int, shape: tuple[int, ...], rank: int) -> torch.Tensor:
    """Small integers times 2**-4: their mean over ranks is exact in any order (the oracle is torch on that mean)."""
    g = torch.Generator().manual_seed(seed * 100 + rank)
    return torch.randint(-8, 9, shape, generator=g).float() / 16


def job_add_group_mid_run(rank: int, world: int) -> dict:
    """Step with one group, add a Muon and an AdamW group after the first step, step on; every rank's grads differ."""
    torch.manual_seed(0)
    first = [torch.nn.Parameter(torch.randn(6, 4)), torch.nn.Parameter(torch.randn(5))]
    later = [torch.nn.Parameter(torch.randn(8, 3)), torch.nn.Parameter(torch.randn(7))]
    opt = DistMuonAdamW([{"params": first[:1], "kind": "muon", "lr": 0.05}, {"params": first[1:], "kind": "adamw"}],
                        ns_dtype="bfloat16", grad_sync="reduce" if world > 1 else "auto")  # fmt: skip
    params = list(first)
    for step in range(STEPS):
        if step == 1:
            opt.add_param_group({"params": later[:1], "kind": "muon", "lr": 0.03})
            opt.add_param_group({"params": later[1:], "kind": "adamw", "lr": 0.02})
            params += later
        for i, p in enumerate(params):
            p.grad = _grad(step * 10 + i, tuple(p.shape), rank)
        opt.step()
        opt.zero_grad()
    return {"params": [p.detach().clone() for p in first + later]}


def torch_reference(world: int) -> list[torch.Tensor]:
    """The same run with torch.optim.Muon / torch.optim.AdamW on the ranks' mean gradient, groups added alike."""
    torch.manual_seed(0)
    first = [torch.nn.Parameter(torch.randn(6, 4)), torch.nn.Parameter(torch.randn(5))]
    later = [torch.nn.Parameter(torch.randn(8, 3)), torch.nn.Parameter(torch.randn(7))]
    muon = torch.optim.Muon([first[0]], lr=0.05)
    adamw = torch.optim.AdamW([first[1]])
    params = list(first)
    for step in range(STEPS):
        if step == 1:
            muon.add_param_group({"params": [later[0]], "lr": 0.03})
            adamw.add_param_group({"params": [later[1]], "lr": 0.02})
            params += later
        for i, p in enumerate(params):
            p.grad = sum(_grad(step * 10 + i, tuple(p.shape), r) for r in range(world)) / world
        muon.step()
        adamw.step()
        muon.zero_grad()
        adamw.zero_grad()
    return [p.detach().clone() for p in first + later]
