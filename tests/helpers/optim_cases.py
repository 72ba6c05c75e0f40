"""Shared, deterministic test cases: per-rank gradients, distributed runs and single-process torch oracles.

Gradients are integers / 64 (|g| <= 1, or * 1024 for the "huge" rank), so the sum over ranks is exact in fp32
in any order and "SUM then divide by W" gives the same averaged gradient on both sides. That makes the
distributed optimizer comparable to torch.optim.Muon / AdamW with torch.equal even for W = 3.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor

from distlab.distributed import comm_stats
from distlab.optim import DistAdamW, DistMuon, DistMuonAdamW

MUON_SHAPES = [(8, 4)] * 5 + [(4, 8)] * 2 + [(6, 6)]  # tall x5 (not divisible by 2 or 3), wide x2, square
ADAMW_SHAPES = [(), (7,), (3, 5), (4,)]  # scalar, 1-D with odd numel, 2-D, small
MUON_LR, ADAMW_LR, MAX_NORM = 0.02, 0.01, 1.0


def lr_lambda(step: int) -> float:
    return 1.0 / (1.0 + 0.5 * step)


def shapes(spec: dict[str, Any]) -> list[tuple[int, ...]]:
    return {"muon": MUON_SHAPES, "adamw": ADAMW_SHAPES, "mixed": MUON_SHAPES + ADAMW_SHAPES}[spec["kind"]]


def init_params(spec: dict[str, Any]) -> list[Tensor]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randn(s, generator=g) for s in shapes(spec)]


def rank_grads(spec: dict[str, Any], step: int, rank: int) -> list[Tensor | None]:
    """Gradients rank ``rank`` computes at ``step`` (None = this rank has no grad for that param)."""
    out: list[Tensor | None] = []
    for j, s in enumerate(shapes(spec)):
        g = torch.Generator().manual_seed(100_000 * step + 1000 * rank + j)
        grad = torch.randint(-64, 65, s, generator=g).float() / 64
        if spec.get("huge") and rank == 1:
            grad = grad * 1024
        if spec.get("nones"):
            if j == 1 and rank == 1:  # missing on one rank only -> counts as zeros
                grad = None
            if (
                j in (7, len(shapes(spec)) - 1) and step % 3 == 2
            ):  # missing on every rank -> skipped like torch
                grad = None
        out.append(grad)
    return out


def avg_grads(spec: dict[str, Any], step: int, world: int) -> list[Tensor | None]:
    per_rank = [rank_grads(spec, step, r) for r in range(world)]
    out: list[Tensor | None] = []
    for j in range(len(shapes(spec))):
        gs = [g[j] for g in per_rank if g[j] is not None]
        out.append(None if not gs else torch.stack(gs).sum(0) / world)
    return out


def make_dist_opt(spec: dict[str, Any], params: list[Tensor]) -> DistMuonAdamW:
    kw = dict(
        grad_sync=spec.get("grad_sync", "reduce"),
        # probe_norm: clipping that never clips (coefficient exactly 1) but reports the synced gradient's norm
        max_grad_norm=MAX_NORM if spec.get("clip") else (1e30 if spec.get("probe_norm") else None),
        coalesce=spec.get("coalesce"),
    )
    if spec["kind"] == "muon":
        return DistMuon(params, lr=MUON_LR, ns_dtype=spec.get("ns_dtype", "bfloat16"), **kw)
    if spec["kind"] == "adamw":
        return DistAdamW(params, lr=ADAMW_LR, **kw)
    n = len(MUON_SHAPES)
    groups = [
        {"params": params[:n], "kind": "muon", "lr": MUON_LR},
        {"params": params[n:], "kind": "adamw", "lr": ADAMW_LR},
    ]
    return DistMuonAdamW(groups, ns_dtype=spec.get("ns_dtype", "bfloat16"), **kw)


def run_dist_case(
    spec: dict[str, Any], rank: int, world: int, steps: range, params: list[Tensor] | None = None, state=None
) -> dict[str, Any]:
    """Run the distributed optimizer on this rank; return per-step param snapshots, comm bytes, grad norms."""
    params = [
        p.detach().clone().requires_grad_() for p in (params if params is not None else init_params(spec))
    ]
    opt = make_dist_opt(spec, params)
    if state is not None:
        opt.load_state_dict(state)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda) if spec.get("sched") else None
    snaps, comm, norms = [], [], []
    for s in steps:
        if spec.get("grad_sync") == "averaged":
            grads = avg_grads(spec, s, world)
        else:
            grads = rank_grads(spec, s, rank)
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        comm_stats.reset()
        opt.step()
        comm.append(copy.deepcopy(comm_stats.by_op))
        if sched is not None:
            sched.step()
        snaps.append([p.detach().clone() for p in params])
        norms.append(opt.last_grad_norm)
    return {"snaps": snaps, "comm": comm, "norms": norms, "opt": opt, "params": params}


class Oracle:
    """torch.optim.Muon (+ torch.optim.AdamW) on one process, fed the averaged gradient."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.params = [p.clone().requires_grad_() for p in init_params(spec)]
        n = len(MUON_SHAPES) if spec["kind"] != "adamw" else 0
        self.opts: list[torch.optim.Optimizer] = []
        if spec["kind"] in ("muon", "mixed"):
            self.opts.append(torch.optim.Muon(self.params[:n], lr=MUON_LR))
        if spec["kind"] in ("adamw", "mixed"):
            self.opts.append(torch.optim.AdamW(self.params[n:], lr=ADAMW_LR))
        self.scheds = (
            [torch.optim.lr_scheduler.LambdaLR(o, lr_lambda) for o in self.opts] if spec.get("sched") else []
        )
        self.snaps: list[list[Tensor]] = []
        self.norms: list[Tensor] = []

    def step(self, s: int, world: int) -> None:
        for p, g in zip(self.params, avg_grads(self.spec, s, world), strict=True):
            p.grad = g
        if self.spec.get("clip"):
            self.norms.append(
                torch.nn.utils.clip_grad_norm_([p for p in self.params if p.grad is not None], MAX_NORM)
            )
        for o in self.opts:
            o.step()
        for sc in self.scheds:
            sc.step()
        self.snaps.append([p.detach().clone() for p in self.params])

    def run(self, steps: range, world: int) -> Oracle:
        for s in steps:
            self.step(s, world)
        return self


def averaged_grad_norm(spec: dict[str, Any], step: int, world: int) -> Tensor:
    """The oracle for what the optimizer reduced: the global norm of the averaged gradient, by hand."""
    grads = [g for g in avg_grads(spec, step, world) if g is not None]
    return torch.stack([g.double().square().sum() for g in grads]).sum().sqrt().float()
