"""Rank jobs for test_conv_and_auto: conv kernels in Muon, and the gradient-sync mode left to "auto".

Oracle: torch.optim.Muon on each kernel's 2-D view (out, in*kh*kw) and torch.optim.AdamW, one process,
fed the average of the ranks' gradients. Gradients are integers / 64, so the sum over ranks is exact and
both sides divide the same exact sum: the comparison is bit-for-bit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distlab.optim import DistAdamW, DistMuon, DistMuonAdamW

SHAPES = [(8, 3, 3, 3), (5, 4, 3, 3), (6, 4), (7,)]  # 5 rows: uneven Shard(0) on 2 and 3 ranks
N_MUON, STEPS, LR = 3, 3, 0.05


def init_params() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in SHAPES]


def grads(step: int, rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randint(-64, 65, s, generator=g).float() / 64 for s in SHAPES]


def oracle(world: int) -> list[torch.Tensor]:
    params = [p.clone() for p in init_params()]
    views = [
        p.view(p.shape[0], -1).requires_grad_() if j < N_MUON else p.requires_grad_()
        for j, p in enumerate(params)
    ]
    muon = torch.optim.Muon(views[:N_MUON], lr=LR)
    adamw = torch.optim.AdamW(views[N_MUON:], lr=LR)
    for step in range(STEPS):
        per_rank = [grads(step, r) for r in range(world)]
        for j, v in enumerate(views):
            total = per_rank[0][j].clone()
            for r in range(1, world):
                total += per_rank[r][j]
            v.grad = (total / world).view(v.shape)
        muon.step()
        adamw.step()
    return [v.detach().view(s) for v, s in zip(views, SHAPES, strict=True)]


def job_conv(rank: int, world: int, sharded: bool) -> dict:
    """DistMuonAdamW with no grad_sync on plain params (-> reduce) or Shard(0) DTensors (-> sharded)."""
    init = init_params()
    if sharded:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (world,))
        params = [
            torch.nn.Parameter(distribute_tensor(t, mesh, [Shard(0)], src_data_rank=None)) for t in init
        ]
    else:
        params = [torch.nn.Parameter(t.clone()) for t in init]
    opt = DistMuonAdamW(
        [
            {"params": params[:N_MUON], "kind": "muon", "lr": LR},
            {"params": params[N_MUON:], "kind": "adamw", "lr": LR},
        ],
        ns_dtype=torch.bfloat16,  # as torch.optim.Muon: the oracle is bit-exact
    )
    for step in range(STEPS):
        everyone = [grads(step, r) for r in range(world)]
        for j, p in enumerate(params):
            if sharded:  # FSDP2 would hand the optimizer the averaged gradient, sharded like the param
                from torch.distributed.tensor import Shard, distribute_tensor

                total = everyone[0][j].clone()
                for r in range(1, world):
                    total += everyone[r][j]
                p.grad = distribute_tensor(total / world, p.device_mesh, [Shard(0)], src_data_rank=None)
            else:
                p.grad = everyone[rank][j]
        opt.step()
        opt.zero_grad()
    full = [p.full_tensor() if sharded else p.detach() for p in params]
    return {"params": [t.clone() for t in full], "mode": opt.mode}


def _train_small_cnn(world: int, rank: int | None, shard) -> tuple[torch.nn.Module, list]:
    """A conv + linear model, DistMuon(matrices) + DistAdamW(rest) with no mode given, 3 steps.
    ``rank`` None: one process on the concatenated batch; else rank's quarter, after ``shard(model)``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64, 3)
    )
    shard(model)
    opts = [
        # fp32 Newton-Schulz on every host: the ranks sum in another order than the oracle, and a bf16
        # rounding flipped by that would grow past the tolerance
        DistMuon([p for p in model.parameters() if p.ndim >= 2], lr=0.02, ns_dtype="float32"),
        DistAdamW([p for p in model.parameters() if p.ndim < 2], lr=1e-3),
    ]
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(4 * world, 1, 4, 4, generator=g), torch.randint(0, 3, (4 * world,), generator=g)
    rows = slice(None) if rank is None else slice(4 * rank, 4 * (rank + 1))
    for _ in range(3):
        F.cross_entropy(model(x[rows]), y[rows]).backward()
        for o in opts:
            o.step()
            o.zero_grad()
    return model, opts


def job_fully_shard_plain_api(rank: int, world: int) -> dict:
    """The issue's user: fully_shard a model, DistMuon(matrices) + DistAdamW(rest), no mode given."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model, opts = _train_small_cnn(
        world, rank, lambda m: fully_shard(m, mesh=init_device_mesh("cpu", (world,)))
    )
    dist.barrier()
    return {
        "params": [p.full_tensor().detach().clone() for p in model.parameters()],
        "modes": [o.mode for o in opts],
    }


def fully_shard_oracle(world: int) -> list[torch.Tensor]:
    """One process, the concatenated batch, DistMuon / DistAdamW (== torch's optimizers on one process)."""
    model, _ = _train_small_cnn(world, None, lambda m: None)
    return [p.detach().clone() for p in model.parameters()]


def job_auto_ns_dtype(rank: int, world: int, native: list[bool]) -> dict:
    """ns_dtype left to "auto" on ranks whose hosts differ: ``native[rank]`` says whether this rank's CPU
    multiplies bf16 in hardware. Returns the dtype the optimizer chose after its first step."""
    import distlab.optim.dist_optim as dist_optim

    dist_optim.native_bf16_matmul = lambda device: native[rank]  # this rank's host, as the optimizer sees it
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 6))
    opt = DistMuon([w], lr=0.02)
    w.grad = torch.randn(8, 6, generator=torch.Generator().manual_seed(rank))
    opt.step()
    return {"dtype": str(opt.flops_dtype), "w": w.detach().clone()}
