"""Rank functions for tests/gpu (one GPU per rank, nccl): the CPU oracles' cases, on cuda:rank."""

from __future__ import annotations

import torch

from tests.helpers.optim_cases import init_params, make_dist_opt, rank_grads

STEPS = range(6)
SPECS = {
    "muon": {"kind": "muon"},
    "adamw": {"kind": "adamw"},
    "mixed": {"kind": "mixed"},
    "mixed_pieces": {"kind": "mixed", "coalesce": False},  # nccl's default path: one collective per piece
    "nones": {"kind": "mixed", "nones": True},
}


def job_cases_on_gpu(rank: int, world: int) -> dict:
    """Each case's params after every step, computed on cuda:rank with nccl collectives."""
    device = torch.device("cuda", rank)
    out = {}
    for name, spec in SPECS.items():
        params = [p.to(device).requires_grad_() for p in init_params(spec)]
        opt = make_dist_opt(spec, params)
        snaps = []
        for s in STEPS:
            for p, g in zip(params, rank_grads(spec, s, rank), strict=True):
                p.grad = None if g is None else g.to(device)
            opt.step()
            snaps.append([p.detach().cpu().clone() for p in params])
        out[name] = {"snaps": snaps, "mode": opt.mode}
    return out
