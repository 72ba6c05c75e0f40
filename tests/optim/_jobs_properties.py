"""Rank jobs for test_properties: every drawn case of every world size in one spawn (run_distributed).

Each case builds its params - plain tensors (ZeRO-1) or a module of them under FSDP2 ``fully_shard`` - and the
drawn optimizer, feeds each rank its gradients for ``case.steps`` steps (FSDP2: through a backward whose
gradient is exactly that rank's, so FSDP2's own reduce-scatter averages them), and returns the full params
after every step, the clip norms, the mode in effect and the final torch-format state. Smaller world sizes run
in the same spawn on subgroups (see :func:`job_cases`), so they cost no extra spawn.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from tests.optim._prop_cases import Case, build_optimizer, fed_grads, init_params


class Holder(nn.Module):
    """The case's params as one module; ``forward(grads)`` is a loss whose gradient for param j is grads[j]."""

    def __init__(self, init: list[Tensor]) -> None:
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(t.clone()) for t in init])

    def forward(self, grads: list[Tensor | None]) -> Tensor | None:
        terms = [(p * g).sum() for p, g in zip(self.ps, grads, strict=True) if g is not None]
        return torch.stack(terms).sum() if terms else None


def _full(t: Tensor) -> Tensor:
    """A param or state tensor as one full tensor (a DTensor is gathered: collective)."""
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def _state(opt, rank: int, world: int) -> dict[int, dict[str, Tensor]] | None:
    """The optimizer's full torch-format state (None on ranks that do not hold it)."""
    if opt.mode != "sharded":
        opt.consolidate_state_dict(0)  # collective; nothing to do with one rank
        if rank != 0:
            return None
    state = opt.state_dict()["state"]
    return {j: {k: _full(v) for k, v in sorted(st.items())} for j, st in sorted(state.items())}


def run_case(case: Case, rank: int, world: int, group, mesh) -> dict[str, Any]:
    start = time.perf_counter()
    init = init_params(case)
    holder = None
    if case.layout == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        holder = fully_shard(Holder(init), mesh=mesh)
        params = list(holder.ps)
    else:
        params = [nn.Parameter(t.clone()) for t in init]
    opt = build_optimizer(case, params, group)
    snaps, norms = [], []
    for s in range(case.steps):
        grads = fed_grads(case, s, rank)
        if holder is not None:
            loss = holder(grads)
            if loss is not None:
                loss.backward()
        else:
            for p, g in zip(params, grads, strict=True):
                p.grad = g
        opt.step()
        snaps.append([_full(p) for p in params])
        norms.append(None if opt.last_grad_norm is None else opt.last_grad_norm.detach().clone())
        opt.zero_grad()
    state = _state(opt, rank, world)
    return {
        "snaps": snaps,
        "norms": norms,
        "mode": opt.mode,
        "state": state,
        "s": time.perf_counter() - start,
    }


def _run(case: Case, index: int, rank: int, world: int, group, mesh) -> dict[str, Any]:
    try:
        return run_case(case, rank, world, group, mesh)
    except Exception as e:
        raise RuntimeError(f"case {index} raised {type(e).__name__}: {e}\n  {case.describe()}") from e


def job_cases(rank: int, world: int, cases: dict[int, list[Case]]) -> dict[int, dict[int, dict[str, Any]]]:
    """Every world size's cases in one spawn of ``world`` ranks: ``cases[world]`` on WORLD; ``cases[w]`` for a
    smaller w on the gloo group of ranks 0..w-1 while the last rank runs the one-rank cases, each on its own
    one-rank group (``dist.new_subgroups``). Returns {w: {case index: result}} for the cases this rank ran."""
    from torch.distributed.device_mesh import DeviceMesh

    own, _ = dist.new_subgroups(group_size=1)  # collective: every rank creates every group, in one order
    groups = {1: own, world: dist.group.WORLD}
    for w in sorted(cases):
        if 1 < w < world:
            groups[w] = dist.new_group(list(range(w)))
    out: dict[int, dict[int, dict[str, Any]]] = {w: {} for w in cases}
    for w in sorted(cases, reverse=True):
        if not (rank < w if w > 1 else rank == world - 1):
            continue
        mesh = DeviceMesh.from_group(groups[w], "cpu")
        for i, case in enumerate(cases[w]):
            out[w][i] = _run(case, i, rank if w > 1 else 0, w, groups[w], mesh)
    return out
