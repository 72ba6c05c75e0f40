"""Rank functions for tests/fsdp/test_hsdp.py: the GPT under HSDP (2-D mesh) and FSDP2 meshes of other shapes."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from distlab.optim import DistMuonAdamW
from distlab.parallel import apply_fsdp2, full_state_dict
from distlab.parallel.parallelize import hsdp_mesh
from tests.fsdp._jobs_fsdp2_optim import (
    EXACT_IDX,
    EXACT_SPEC,
    EXACT_STEPS,
    exact_groups,
    gpt_groups,
    make_gpt,
)
from tests.helpers import optim_cases as _cases

GLOBAL_BATCH, STEPS, SAVE_AT = 8, 8, 4
SEQ = 16


def mesh_of(shape: tuple[int, int] | int):
    """(replicate, shard) -> HSDP's 2-D mesh; an int -> FSDP2's 1-D mesh over that many ranks."""
    if isinstance(shape, int):
        return init_device_mesh("cpu", (shape,))
    return hsdp_mesh("cpu", shape[0] * shape[1], shape[0])


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(20_000 + step)
    seq = torch.randint(0, 257, (GLOBAL_BATCH, SEQ + 1), generator=g)
    return seq[:, :-1], seq[:, 1:]


def oracle() -> dict:
    """One process, the whole global batch, DistMuonAdamW (== torch's Muon/AdamW: tests/optim)."""
    model = make_gpt()
    opt = DistMuonAdamW(gpt_groups(model), max_grad_norm=1.0, ns_dtype="float32")
    for s in range(STEPS):
        x, y = batch(s)
        model(x, targets=y).backward()
        opt.step()
        opt.zero_grad()
    return {k: v.clone() for k, v in model.state_dict().items()}


def _train(model, opt, rank: int, world: int, steps: range) -> None:
    B = GLOBAL_BATCH // world
    for s in steps:
        x, y = batch(s)
        model(x[rank * B : (rank + 1) * B], targets=y[rank * B : (rank + 1) * B]).backward()
        opt.step()
        opt.zero_grad()


def _sharded(mesh):
    model = apply_fsdp2(make_gpt(), mesh)
    return model, DistMuonAdamW(gpt_groups(model), max_grad_norm=1.0, ns_dtype="float32")


def job_train(rank: int, world: int, shape, ckpt_dir: str | None, resume_from: str | None) -> dict:
    """Train STEPS steps on ``shape`` (saving a DCP checkpoint at SAVE_AT), or resume one saved on another shape."""
    mesh = mesh_of(shape)
    model, opt = _sharded(mesh)
    out: dict = {}
    if resume_from is None:
        _train(model, opt, rank, world, range(SAVE_AT))
        if ckpt_dir is not None:
            dcp.save(
                {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
                checkpoint_id=os.path.join(ckpt_dir, "saved"),
            )
        out["placements"] = str(model.wte.weight.placements)
        out["local_rows"] = model.wte.weight.to_local().shape[0]
    else:
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
        dcp.load(state, checkpoint_id=resume_from)
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, opt, state["optim"])
    _train(model, opt, rank, world, range(SAVE_AT, STEPS))
    out["state"] = full_state_dict(model)
    out["ns_flops"] = opt.flops
    dist.barrier()
    return out


def job_exact(rank: int, world: int, shape) -> list[list[torch.Tensor]]:
    """Hand-made (Replicate, Shard(0)) params fed the averaged gradients: bit for bit torch's Muon/AdamW."""
    mesh = mesh_of(shape)
    placements = [Shard(0)] if mesh.ndim == 1 else [Replicate(), Shard(0)]
    init = _cases.init_params(EXACT_SPEC)
    params = [
        torch.nn.Parameter(distribute_tensor(init[j], mesh, placements, src_data_rank=None))
        for j in EXACT_IDX
    ]
    opt = DistMuonAdamW(exact_groups(params), grad_sync="sharded", ns_dtype="bfloat16")
    snaps = []
    for s in EXACT_STEPS:
        grads = _cases.avg_grads(EXACT_SPEC, s, world)
        for p, j in zip(params, EXACT_IDX, strict=True):
            p.grad = distribute_tensor(grads[j], mesh, placements, src_data_rank=None)
        opt.step()
        snaps.append([p.detach().full_tensor() for p in params])
    return snaps


def job_shard_like(rank: int, world: int, shape: tuple[int, int] | int) -> list[str]:
    """State laid out like a param (``shard_like``: how a full-tensor or re-laid-out optimizer state is loaded onto
    shards) against torch's own ``distribute_tensor`` of the same values, for row counts that do and do not divide
    the shard group; the mismatches found (none expected)."""
    from distlab.optim.fsdp2_comm import check_sharded_param, shard_like

    mesh = mesh_of(shape)
    placements = [Shard(0)] if mesh.ndim == 1 else [Replicate(), Shard(0)]
    wrong = []
    for rows in (1, 3, 4, 5, 7):
        torch.manual_seed(rows)  # the same values on every rank
        p = distribute_tensor(torch.randn(rows, 3), mesh, placements)
        check_sharded_param(p, f"{rows} rows")
        full = torch.randn(rows, 3)
        want = distribute_tensor(full, mesh, placements).to_local()
        sources = {
            "full tensor": full,
            "replicated DTensor": distribute_tensor(full, mesh, [Replicate()] * mesh.ndim),
            "same layout": distribute_tensor(full, mesh, placements),
        }
        for what, source in sources.items():
            got = shard_like(source, p).to_local()
            if got.shape != want.shape or not torch.equal(got, want):
                wrong.append(f"rank {rank}, {rows} rows, from a {what}: {got.tolist()} != {want.tolist()}")
    return wrong
