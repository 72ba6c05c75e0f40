"""Helpers for DistMuonAdamW's ``grad_sync="sharded"`` mode: params are FSDP2 DTensors sharded Shard(0).

FSDP2 (``fully_shard``) keeps every parameter as a DTensor whose local tensor holds rows
``[r*k, min((r+1)*k, m))`` of the (m, ...) global tensor, with ``k = ceil(m / W)`` (torch.chunk
semantics: with uneven sizes the last ranks hold fewer rows, possibly none). After backward, FSDP2 has
already reduce-scattered and averaged the gradients into local shards of the same layout.

Element-wise math (AdamW, Muon's momentum and Nesterov blend, weight decay, the final update) runs
on those local shards with no communication. Newton-Schulz is not element-wise: it needs the whole
matrix. :func:`orthogonalize_on_owners` moves each full Muon update to ONE owner rank with an
all_to_all (every rank sends its zero-padded k-row piece), the owner runs Newton-Schulz on the full
(m, n) matrix (asserted), and a second all_to_all returns each rank its k-row piece of the result.
Owners are balanced: chunks of W same-shape matrices, slot i owned by rank i (the engine's layout).

Per rank and step this sends about 2 * (W-1)/W * P_muon / W bytes in the NS dtype (dion's all_to_all
pattern, ~2P/W): the matrices' shards out to their owners and the results back.

Example::

    lo, hi = shard_rows(m=32, world=3, rank=2)   # (22, 32): rank 2 holds 10 of 32 rows
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from .comm import Pending, all_to_all_single


def is_dtensor(t: object) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local(t: Tensor) -> Tensor:
    """The local shard of a DTensor (a view that in-place ops update); a plain tensor as is."""
    return t.to_local() if is_dtensor(t) else t


def comm_device(group: dist.ProcessGroup | None, like: Tensor) -> torch.device:
    """Where collective buffers must live: CUDA under nccl (also when FSDP2 offloads shards to CPU)."""
    if like.device.type == "cpu" and dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return like.device


def shard_rows(m: int, world: int, rank: int) -> tuple[int, int]:
    """Rows [lo, hi) of an m-row tensor that ``rank`` holds under Shard(0) (torch.chunk semantics)."""
    k = -(-m // world)
    lo = min(rank * k, m)
    return lo, min(lo + k, m)


def shard_like(t: Tensor, p: Tensor) -> Tensor:
    """A DTensor with ``p``'s mesh and placements holding ``t``'s values (t: a DTensor or a full tensor).

    A DTensor with the same layout is copied locally; any other DTensor is gathered first (collective:
    every rank calls this for the same tensors in the same order); a full tensor is sliced, no comm.
    """
    out = torch.zeros_like(p)  # DTensor, p's spec
    out_local = local(out)
    if is_dtensor(t):
        if (
            t.device_mesh == p.device_mesh
            and tuple(t.placements) == tuple(p.placements)
            and t.shape == p.shape
        ):
            out_local.copy_(t.to_local())
            return out
        t = t.full_tensor()
    if t.numel() != p.numel():
        raise ValueError(
            f"optimizer state of shape {tuple(t.shape)} does not fit a param of shape {tuple(p.shape)}"
        )
    mesh = p.device_mesh
    lo, hi = shard_rows(p.shape[0], mesh.size(), mesh.get_local_rank())
    out_local.copy_(t.reshape(p.shape)[lo:hi])
    return out


def check_sharded_param(p: Tensor, name: str) -> None:
    """One-line error unless ``p`` is a Shard(0) DTensor on a 1-D mesh with the expected local rows."""
    from torch.distributed.tensor import Shard

    if not is_dtensor(p):
        raise ValueError(
            f"grad_sync='sharded' needs FSDP2-sharded (DTensor) params, but {name} of shape {tuple(p.shape)} is a "
            "plain tensor; apply distlab.parallel.apply_fsdp2 (fully_shard) before building the optimizer"
        )
    if p.device_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
        raise ValueError(
            f"grad_sync='sharded' supports Shard(0) on a 1-D mesh, but {name} has placements {p.placements} on a "
            f"{p.device_mesh.ndim}-D mesh; shard it with fully_shard on a 1-D data-parallel mesh"
        )
    lo, hi = shard_rows(p.shape[0], p.device_mesh.size(), p.device_mesh.get_local_rank())
    if p.to_local().shape[0] != hi - lo:
        raise ValueError(
            f"{name}: local shard has {p.to_local().shape[0]} rows, expected {hi - lo} (rows {lo}:{hi} of "
            f"{p.shape[0]}); only torch.chunk-style Shard(0) layouts are supported"
        )


def orthogonalize_on_owners(
    chunks: list[list[int | None]],
    shapes: dict[int, torch.Size],
    updates: dict[int, Tensor],
    ns: Callable[[int, Tensor], Tensor],
    ns_dtype: Callable[[int], torch.dtype],
    group: dist.ProcessGroup | None,
    world: int,
    rank: int,
    device: torch.device | None = None,
) -> dict[int, Tensor]:
    """Newton-Schulz on whole matrices, each on one owner rank; returns this rank's shard of each result.

    Args:
        chunks: the engine's Muon layout; ``chunk[i]`` = param index owned by rank i (None = no matrix).
        shapes: param index -> global (m, n) shape.
        updates: param index -> this rank's local (rows, n) shard of the update (active params only;
            activity is the same on every rank).
        ns: ``ns(j, full_update)`` -> orthogonalised (m, n); only ever called with the full matrix.
        ns_dtype: param index -> dtype the matrix travels in (Newton-Schulz casts to it first, so sending
            it already cast is bit-identical and halves the bytes with bf16).
        device: where the communication buffers live (default: the updates' device); results come back
            on the updates' device.
    """
    out: dict[int, Tensor] = {}
    gathers: list[tuple[list[int | None], int, int, Pending | Tensor, Tensor]] = []
    for chunk in chunks:
        slots = [j if j is not None and j in updates else None for j in chunk]
        live = [j for j in slots if j is not None]
        if not live:
            continue
        m, n = shapes[live[0]]
        k = -(-m // world)
        dtype = ns_dtype(live[0])
        pieces = []
        for j in slots:
            if j is not None:
                u = updates[j].to(device=device or updates[j].device, dtype=dtype)
                pieces.append(torch.cat([u, u.new_zeros(k - u.shape[0], n)]) if u.shape[0] < k else u)
        send = torch.cat([p.reshape(-1) for p in pieces])
        in_splits = [k * n if j is not None else 0 for j in slots]
        mine = slots[rank]
        out_splits = [k * n] * world if mine is not None else [0] * world
        recv = send.new_empty(sum(out_splits))
        handle = all_to_all_single(recv, send, out_splits, in_splits, group, async_op=True)
        gathers.append((slots, m, n, handle, recv))

    scatters = []
    for slots, m, n, handle, recv in gathers:
        handle.wait()
        k = -(-m // world)
        mine = slots[rank]
        dtype = recv.dtype
        if mine is not None:
            full = recv.view(world * k, n)[:m]
            assert tuple(full.shape) == tuple(shapes[mine]), (
                "Newton-Schulz must see the full matrix, never a shard"
            )
            ortho = ns(mine, full)
            send = torch.cat([ortho, ortho.new_zeros(world * k - m, n)]).reshape(-1)
            in_splits = [k * n] * world
        else:
            send = torch.empty(0, dtype=dtype, device=recv.device)
            in_splits = [0] * world
        out_splits = [k * n if j is not None else 0 for j in slots]
        back = send.new_empty(sum(out_splits))
        scatters.append(
            (slots, m, n, all_to_all_single(back, send, out_splits, in_splits, group, async_op=True), back)
        )

    for slots, m, n, handle, back in scatters:
        handle.wait()
        k = -(-m // world)
        lo, hi = shard_rows(m, world, rank)
        offset = 0
        for j in slots:
            if j is not None:
                out[j] = back[offset : offset + k * n].view(k, n)[: hi - lo].to(updates[j].device)
                offset += k * n
    return out
