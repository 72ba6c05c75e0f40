"""Bytes per step by mesh dimension: what crosses the shard groups (inside a node) and the replicate groups (across
nodes) under FSDP2 and HSDP, FSDP2's own collectives included.

:data:`~distlab.distributed.comm_stats` counts what distlab itself sends. FSDP2's parameter all-gathers and
gradient reduce-scatters (and HSDP's all-reduce across replicas) run inside torch, so this counter wraps the
``torch.distributed`` collectives while it is active and files each call under the mesh dimension whose group it
ran on. Logical bytes per rank, as ring algorithms move them (the convention of ``comm_stats``)::

    all_reduce of S bytes over W ranks -> 2(W-1)/W * S; every other collective -> (W-1)/W * its whole buffer

Use::

    with MeshTraffic(mesh) as traffic:       # mesh: FSDP2's 1-D or HSDP's 2-D (replicate, shard) DeviceMesh
        loss.backward(); opt.step()
    traffic.bytes                            # {"shard": ..., "replicate": ...}; calls on other groups: "other"

:class:`~distlab.callbacks.SpeedMonitor` reports it as ``comm_mesh_<dim>_mb`` under the fsdp2 strategy. It counts
the calls made on this rank's host thread; it issues nothing. Several counters may be active at once.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

# the torch.distributed functions FSDP2, HSDP's replica all-reduce and distlab's collectives call
COUNTED = (
    "all_gather_single",  # torch 2.13's FSDP2 calls these two
    "reduce_scatter_single",
    "all_gather_into_tensor",  # their older names (each calls the new one by its module name: counted once)
    "all_gather",
    "reduce_scatter_tensor",
    "reduce_scatter",
    "all_reduce",
    "all_to_all_single",
    "broadcast",
)
_RING_FACTOR = {"all_reduce": 2.0}  # an all-reduce is a reduce-scatter and an all-gather

_active: list[MeshTraffic] = []
_originals: dict[str, Any] = {}


def _buffer_bytes(args: tuple, kwargs: dict) -> int:
    """The collective's whole buffer: its largest tensor argument (the gathered output, the reduced input), or the
    sum of a tensor list's parts (list-form all_gather / reduce_scatter)."""
    values = (*args, *kwargs.values())
    tensors = [a for a in values if isinstance(a, torch.Tensor)]
    if tensors:
        return max(t.numel() * t.element_size() for t in tensors)
    lists = [a for a in values if isinstance(a, list | tuple) and a and isinstance(a[0], torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in lists[0]) if lists else 0


def _counting(name: str, original):
    def call(*args, **kwargs):
        if _active:
            group = kwargs.get("group")
            if group is None:  # positional: the group follows the tensors and the reduce op
                group = next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
            world = dist.get_world_size(group)
            if world > 1:
                nbytes = _RING_FACTOR.get(name, 1.0) * (world - 1) / world * _buffer_bytes(args, kwargs)
                for traffic in _active:
                    traffic._add(group, nbytes)
        return original(*args, **kwargs)

    call.__wrapped__ = original
    return call


class MeshTraffic:
    """Counts, while active, the logical bytes this rank moves per dimension of ``mesh`` (see the module doc).

    ``bytes``: dimension name -> bytes (a 1-D mesh's one dimension is ``"shard"`` unless the mesh names it; calls
    on groups outside the mesh land in ``"other"``). ``start()``/``stop()`` or use it as a context manager.
    """

    def __init__(self, mesh) -> None:
        names = mesh.mesh_dim_names or ()
        if mesh.ndim == 1 and names in ((), ("data_parallel",)):
            names = ("shard",)  # FSDP2 shards along a 1-D mesh (Lightning names it data_parallel)
        elif len(names) != mesh.ndim:
            names = tuple(f"dim{i}" for i in range(mesh.ndim))
        self._dims = {mesh.get_group(i): names[i] for i in range(mesh.ndim)}
        # WORLD (group=None) is a mesh dimension when a 1-D mesh spans every rank; else it is reported apart
        self._world_dim = names[0] if mesh.ndim == 1 and mesh.size() == dist.get_world_size() else "world"
        self.bytes: dict[str, float] = {}

    def _add(self, group, nbytes: float) -> None:
        if group is None or group is dist.GroupMember.WORLD:
            dim = self._dims.get(dist.GroupMember.WORLD, self._world_dim)
        else:
            dim = self._dims.get(group, "other")
        self.bytes[dim] = self.bytes.get(dim, 0.0) + nbytes

    def start(self) -> MeshTraffic:
        if not _active:
            for name in COUNTED:
                if hasattr(dist, name):
                    _originals[name] = getattr(dist, name)
                    setattr(dist, name, _counting(name, _originals[name]))
        if self not in _active:
            _active.append(self)
        return self

    def stop(self) -> None:
        if self in _active:
            _active.remove(self)
        if not _active:
            for name, original in _originals.items():
                setattr(dist, name, original)
            _originals.clear()

    def __enter__(self) -> MeshTraffic:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
