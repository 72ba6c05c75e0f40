"""Rank jobs for test_grad_sync_modes (module-level so spawned ranks can import them)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from distlab.optim import DistMuonAdamW
from tests.helpers.optim_cases import ReferenceMuon, host_has_native_bf16


def _model_and_data(rank: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16, bias=False), torch.nn.ReLU(), torch.nn.Linear(16, 4, bias=True)
    )
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own micro-batch
    return model, torch.randn(6, 8, generator=gen), torch.randn(6, 4, generator=gen)


def _optimizer(model, grad_sync: str) -> DistMuonAdamW:
    mats = [p for p in model.parameters() if p.ndim == 2]
    rest = [p for p in model.parameters() if p.ndim != 2]
    return DistMuonAdamW(
        [{"params": mats, "kind": "muon", "lr": 0.02}, {"params": rest, "kind": "adamw", "lr": 1e-2}],
        grad_sync=grad_sync,
        max_grad_norm=1e30,  # never clips; reports the global norm of the gradient the optimizer synced
    )


def job_train(
    rank: int, world: int, wrap_ddp: bool, grad_sync: str, steps: int = 4, same_first: bool = False
) -> dict:
    """Train a few steps; return params, or the error message if the optimizer refused. ``same_first``: every
    rank's first batch is rank 0's (their first gradients agree by chance), the later ones their own."""
    model, x, y = _model_and_data(rank)
    _, x0, y0 = _model_and_data(0)
    net = DistributedDataParallel(model) if wrap_ddp else model
    opt = _optimizer(model, grad_sync)
    norms = []
    try:
        for step in range(steps):
            xb, yb = (x0, y0) if same_first and step == 0 else (x, y)
            torch.nn.functional.mse_loss(net(xb), yb).backward()
            opt.step()
            norms.append(float(opt.last_grad_norm))
            opt.zero_grad()
    except RuntimeError as e:
        return {"error": str(e)}
    dist.barrier()
    return {"params": [p.detach().clone() for p in model.parameters()], "mode": opt.mode, "norms": norms}


def first_step_grad_norm_oracle(world: int) -> float:
    """No distlab: one process, every rank's micro-batch concatenated, the plain gradient's global norm."""
    model, _, _ = _model_and_data(0)
    xs, ys = zip(*[_model_and_data(r)[1:] for r in range(world)], strict=True)
    torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
    return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])))


def torch_oracle_params(world: int, steps: int = 4, same_first: bool = False) -> list[torch.Tensor]:
    """No distlab: one process on every rank's micro-batch concatenated, torch.optim.Muon (the host's
    Newton-Schulz dtype, as ``ns_dtype`` "auto" documents) + torch.optim.AdamW with the job's settings."""
    model, x0, y0 = _model_and_data(0)
    xs, ys = zip(*[_model_and_data(r)[1:] for r in range(world)], strict=True)
    x, y = torch.cat(xs), torch.cat(ys)
    mats = [p for p in model.parameters() if p.ndim == 2]
    rest = [p for p in model.parameters() if p.ndim != 2]
    ns_dtype = torch.bfloat16 if host_has_native_bf16() else torch.float32
    opts = [ReferenceMuon(mats, ns_dtype=ns_dtype, lr=0.02), torch.optim.AdamW(rest, lr=1e-2)]
    for step in range(steps):
        xb, yb = (
            (x0, y0) if same_first and step == 0 else (x, y)
        )  # every rank on x0: their mean is x0's gradient
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        for o in opts:
            o.step()
            o.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


CONFIGS = {  # name: (wrap the model in DDP, grad_sync, the first batch the same on every rank)
    "reduce": (False, "reduce", False),
    "averaged_under_ddp": (True, "averaged", False),
    "auto_bare": (False, "auto", False),
    "auto_under_ddp": (True, "auto", False),
    "reduce_under_ddp": (True, "reduce", False),  # averages the average again: the same gradient
    "averaged_bare": (False, "averaged", False),  # must refuse: nothing averaged
    "auto_bare_same_first": (False, "auto", True),  # agreeing first gradients must not decide the later steps
}


def job_permuted_gradients(rank: int) -> dict:
    """Gradients that are permutations of each other across ranks (equal sums, equal norms): 'auto' must see them
    differ and average them. Two params swapped between ranks too."""
    ps = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(4))]
    opt = DistMuonAdamW([{"params": ps, "kind": "adamw", "lr": 0.1}])
    g = torch.tensor([1.0, 2.0, 3.0, 4.0])
    ps[0].grad, ps[1].grad = (g, -g) if rank == 0 else (g.flip(0), -g.flip(0))
    opt.step()
    flipped = opt.mode
    ps[0].grad, ps[1].grad = (g, 2 * g) if rank == 0 else (2 * g, g)  # the params' gradients swapped
    opt.step()
    return {"modes": [flipped, opt.mode], "params": [p.detach().clone() for p in ps]}


def job_all_modes(rank: int, world: int) -> dict:
    """Every (wrapper, mode) configuration in one spawn, one after the other."""
    out = {
        name: job_train(rank, world, wrap, mode, same_first=same)
        for name, (wrap, mode, same) in CONFIGS.items()
    }
    out["auto_permuted"] = job_permuted_gradients(rank)
    return out
