"""FSDP2's communication for DistMuonAdamW (``grad_sync="sharded"``): params are DTensors sharded Shard(0).

Each rank's local tensor holds rows ``[r*k, min((r+1)*k, m))`` of the (m, ...) global tensor, ``k = ceil(m / W)``
(torch.chunk semantics: with uneven sizes the last ranks hold fewer rows, possibly none). The element-wise math runs
on the shards FSDP2 averaged; Newton-Schulz's round trip to each matrix's owner (:func:`orthogonalize_on_owners`)
moves about 2 * (W-1)/W * P_muon / W bytes per rank and step in the NS dtype (dion's pattern; the story is in
docs/internals.md, "FSDP2").

Example::

    lo, hi = shard_rows(m=32, world=3, rank=2)   # (22, 32): rank 2 holds 10 of 32 rows
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard

from distlab.distributed import Pending, all_reduce_sum, all_to_all_single, backend, resolved

from .functional import adamw_step, matrix_shape
from .layout import Layout, first


def is_dtensor(t: object) -> bool:
    return isinstance(t, DTensor)


def local(t: Tensor) -> Tensor:
    """The local shard of a DTensor (a view that in-place ops update); a plain tensor as is."""
    return t.to_local() if is_dtensor(t) else t


def comm_device(group: dist.ProcessGroup | None, like: Tensor) -> torch.device:
    """Where collective buffers must live: CUDA under nccl (also when FSDP2 offloads shards to CPU)."""
    if like.device.type == "cpu" and backend(group) == "nccl":
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
    lo, hi = shard_rows(p.shape[0], mesh.size(-1), mesh.get_local_rank(-1))  # rows along the shard dimension
    out_local.copy_(t.reshape(p.shape)[lo:hi])
    return out


def rows_like(t: Tensor, p: Tensor) -> Tensor:
    """A DTensor of ``t``'s shape (m, ...) whose rows are placed as ``p``'s (Shard(0) over p's mesh): this rank's rows
    of ``t`` (a full tensor, or a DTensor of any layout, gathered first: collective)."""
    full = t.full_tensor() if is_dtensor(t) else t
    mesh = p.device_mesh
    lo, hi = shard_rows(full.shape[0], mesh.size(-1), mesh.get_local_rank(-1))
    mine = full[lo:hi].to(device=local(p).device, copy=True)
    return DTensor.from_local(
        mine, mesh, p.placements, run_check=False, shape=full.shape, stride=full.stride()
    )


def check_sharded_param(p: Tensor, name: str) -> None:
    """One-line error unless ``p`` is a Shard(0) DTensor (1-D mesh, or the shard dimension of HSDP's 2-D mesh) with
    the expected local rows."""
    if not is_dtensor(p):
        raise ValueError(
            f"grad_sync='sharded' needs FSDP2-sharded (DTensor) params, but {name} of shape {tuple(p.shape)} is a "
            "plain tensor; apply distlab.parallel.apply_fsdp2 (fully_shard) before building the optimizer"
        )
    placements = tuple(p.placements)
    if placements != (Shard(0),) and (p.device_mesh.ndim != 2 or placements != (Replicate(), Shard(0))):
        raise ValueError(
            f"grad_sync='sharded' supports Shard(0) on a 1-D mesh or (Replicate, Shard(0)) on a 2-D one, but {name} "
            f"has placements {p.placements} on a {p.device_mesh.ndim}-D mesh; shard it with fully_shard on a data-"
            "parallel mesh"
        )
    mesh = p.device_mesh
    lo, hi = shard_rows(p.shape[0], mesh.size(-1), mesh.get_local_rank(-1))
    if p.to_local().shape[0] != hi - lo:
        raise ValueError(
            f"{name}: local shard has {p.to_local().shape[0]} rows, expected {hi - lo} (rows {lo}:{hi} of "
            f"{p.shape[0]}); only torch.chunk-style Shard(0) layouts are supported"
        )


def orthogonalize_on_owners(
    chunks: list[list[int | None]],
    shapes: dict[int, torch.Size],
    updates: dict[int, Tensor],
    ns: Callable[[list[int], Tensor], Tensor],
    ns_dtype: Callable[[int], torch.dtype],
    group: dist.ProcessGroup | None,
    world: int,
    rank: int,
    device: torch.device,
    bucket_of: dict[int, int],
) -> dict[int, Tensor]:
    """Newton-Schulz on whole matrices, each on one owner rank; returns this rank's shard of each result.

    Args:
        chunks: the Muon layout (:class:`~distlab.optim.layout.Layout`); ``chunk[i]`` = param index owned by rank i (None = no matrix).
        shapes: param index -> global (m, n) shape.
        updates: param index -> this rank's local shard of the update, (rows, ...) (active params only;
            activity is the same on every rank); its 2-D view (rows, n) is sent.
        ns: ``ns(js, stack)`` -> the orthogonalised (B, m, n) stack of the full matrices ``js`` this rank owns in one
            bucket (``bucket_of``: param index -> bucket; consecutive chunks of one bucket are stacked).
        ns_dtype: param index -> dtype the matrix travels in (Newton-Schulz casts to it first, so sending
            it already cast is bit-identical and halves the bytes with bf16).
        device: where the communication buffers live; results come back on the updates' device.
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
                u = updates[j].reshape(updates[j].shape[0], n).to(device=device, dtype=dtype)
                pieces.append(torch.cat([u, u.new_zeros(k - u.shape[0], n)]) if u.shape[0] < k else u)
        send = torch.cat([p.reshape(-1) for p in pieces])
        in_splits = [k * n if j is not None else 0 for j in slots]
        mine = slots[rank]
        out_splits = [k * n] * world if mine is not None else [0] * world
        recv = send.new_empty(sum(out_splits))
        handle = all_to_all_single(recv, send, out_splits, in_splits, group, async_op=True)
        gathers.append((slots, m, n, handle, recv))

    scatters = []
    for _, batch in itertools.groupby(gathers, key=lambda g: bucket_of[first(g[0])]):  # g[0]: the live slots
        batch = list(batch)
        mine = [slots[rank] for slots, *_ in batch]
        fulls = []
        for (_slots, m, n, handle, recv), j in zip(batch, mine, strict=True):
            handle.wait()
            if j is not None:
                fulls.append(recv.view(-1, n)[:m])
                assert tuple(fulls[-1].shape) == tuple(shapes[j]), "Newton-Schulz must see the full matrix"
        owned = [j for j in mine if j is not None]
        orthos = dict(zip(owned, ns(owned, torch.stack(fulls)).unbind(0), strict=True)) if owned else {}
        for (slots, m, n, _, recv), j in zip(batch, mine, strict=True):
            k = -(-m // world)
            if j is not None:
                ortho = orthos[j]
                send = torch.cat([ortho, ortho.new_zeros(world * k - m, n)]).reshape(-1)
                in_splits = [k * n] * world
            else:
                send = torch.empty(0, dtype=recv.dtype, device=recv.device)
                in_splits = [0] * world
            out_splits = [k * n if s is not None else 0 for s in slots]
            back = send.new_empty(sum(out_splits))
            handle = all_to_all_single(back, send, out_splits, in_splits, group, async_op=True)
            scatters.append((slots, m, n, handle, back))

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


def shard_group(p: Tensor) -> dist.ProcessGroup:
    """The process group over which ``p`` is sharded (the last mesh dimension)."""
    mesh = p.device_mesh
    return mesh.get_group() if mesh.ndim == 1 else mesh.get_group(mesh.ndim - 1)


def params_are_shards(params: list[Tensor]) -> bool:
    """True when the params are FSDP2 DTensor shards (all of them: a mix is a one-line error)."""
    flags = [is_dtensor(p) for p in params]
    if any(flags) and not all(flags):
        plain = next(tuple(p.shape) for p, f in zip(params, flags, strict=True) if not f)
        raise ValueError(
            f"some params are FSDP2 DTensor shards and some are plain tensors (e.g. one of shape {plain}); "
            "shard the whole model with fully_shard, or give the optimizer only one kind"
        )
    return bool(params) and all(flags)


def check_shards(param_groups: list[dict[str, Any]]) -> None:
    """One-line errors unless every param is a Shard(0) DTensor on a 1-D mesh and every grad came from FSDP2."""
    for gi, group in enumerate(param_groups):
        for i, p in enumerate(group["params"]):
            check_sharded_param(p, f"param {i} of group {group.get('name', gi)!r}")
            if p.grad is not None and not is_dtensor(p.grad):
                raise RuntimeError(
                    f"grad_sync='sharded' but the grad of param {i} of group {group.get('name', gi)!r} is a plain "
                    "tensor: FSDP2 did not produce it; shard the model with fully_shard (distlab.parallel.apply_fsdp2)"
                )


class FSDP2Comm:
    """The collectives of a step on FSDP2 shards for one :class:`Layout` (the params' 1-D mesh group).

    FSDP2 already reduce-scattered and averaged the gradients into local shards, so there is nothing to reduce
    and nothing to gather: the only communication is Newton-Schulz's round trip to each matrix's owner.
    Optimizer state is DTensors laid out like the params: DCP saves and reshards it, no consolidation.
    """

    gathers_state = False  # the optimizer's state_dict() returns the DTensors as they are

    def __init__(self, layout: Layout) -> None:
        first_param = layout.params[0]
        check_sharded_param(first_param, "param 0")
        self.layout = layout
        # the shard group: the params' 1-D mesh, or HSDP's shard dimension (the replicas hold the same averaged
        # shards and repeat the same step: nothing travels between them)
        self.group = shard_group(first_param)
        self.device = comm_device(self.group, local(first_param))  # CUDA for nccl, even with CPU offload
        mesh = first_param.device_mesh
        # every rank the params live on, one group per mesh dimension (a subgroup's job, not WORLD's)
        self.job_groups = [mesh.get_group(d) for d in range(mesh.ndim)]

    def owned_gradients(
        self, active: list[bool], *, reduce: bool = False, coalesce: bool | None = None
    ) -> dict[int, Tensor]:
        """Param index -> its local gradient shard (zeros where this rank has none but another has)."""
        L = self.layout
        return {
            j: local(p.grad) if p.grad is not None else torch.zeros_like(local(p))
            for j, p in enumerate(L.params)
            if active[j]
        }

    def owned_part(self, j: int) -> Tensor:
        """The local shard of param j: what its update is applied to, in place."""
        return local(self.layout.params[j])

    def state_like(self, j: int) -> Tensor:
        """Param j itself: its state is DTensors sharded like it."""
        return self.layout.params[j]

    def row_state(self, j: int) -> Tensor:
        """Zeros (rows, 1) for a per-row state of Muon matrix j (NorMuon's): a DTensor whose rows are sharded like
        the param's (this rank holds the moments of the rows it holds)."""
        p = self.layout.params[j]
        return rows_like(torch.zeros(p.shape[0], 1, dtype=p.dtype), p)

    def sum_over_shards(self, t: Tensor) -> Tensor:
        """Per-matrix sums over the shard group (each rank holds some rows of every matrix)."""
        return all_reduce_sum(t, self.group)

    def orthogonalize(
        self,
        updates: dict[int, Tensor | Pending],
        ns: Callable[[list[int], Tensor], Tensor],
        ns_dtype: Callable[[int], torch.dtype],
    ) -> dict[int, Tensor]:
        """Newton-Schulz on whole matrices, each on its owner rank (one batched call per bucket of same-shape
        matrices it owns); this rank's rows of each result."""
        L = self.layout
        local_updates = {j: resolved(u) for j, u in updates.items()}
        return orthogonalize_on_owners(
            L.chunks,
            {j: matrix_shape(L.params[j]) for j in local_updates},
            local_updates,
            ns,
            ns_dtype,
            self.group,
            L.world,
            L.rank,
            self.device,
            L.bucket_of,
        )

    def gather(
        self,
        parts: dict[int, Tensor],
        muon: dict[int, Tensor],
        muon_dtype: Callable[[int], torch.dtype],
        apply_muon: Callable[[dict[int, Tensor], dict[int, Tensor]], None],
    ) -> None:
        """Nothing to gather: each rank applies the Muon updates of its rows to its shards and keeps them."""
        apply_muon({j: self.owned_part(j) for j in muon}, muon)

    # ---- checkpoints: DTensors laid out like the params; DCP saves and reshards them -------------------

    def full_state(self, states: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
        return {j: dict(st) for j, st in enumerate(states) if st}

    def owned_state(self, j: int, saved: dict[str, Any]) -> dict[str, Any]:
        """Param j's saved state (DTensors of any layout, or full tensors) in p's layout (collective)."""
        p = self.layout.params[j]
        return {  # "step" as torch keeps it: a scalar tensor on the CPU (a DTensor one gathered first)
            k: adamw_step(v.full_tensor() if is_dtensor(v) else v).cpu()
            if k == "step"
            else (rows_like if k == "normuon_v" else shard_like)(v.to(dtype=p.dtype), p)
            for k, v in saved.items()
        }
