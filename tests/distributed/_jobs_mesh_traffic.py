"""Rank jobs for test_mesh_traffic (module-level so spawned ranks can import them)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from distlab.distributed.mesh_traffic import MeshTraffic


def job_known_collectives(rank: int, world: int, shape: tuple[int, ...]) -> dict:
    """Collectives of known sizes on each mesh dimension, on WORLD and outside the counter; what it counted."""
    names = ("replicate", "shard") if len(shape) == 2 else None
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    originals = {
        n: getattr(dist, n) for n in ("all_reduce", "all_gather_single", "reduce_scatter_single", "broadcast")
    }
    with MeshTraffic(mesh) as traffic:
        for i in range(mesh.ndim):
            group = mesh.get_group(i)
            n = mesh.size(i)
            dist.all_gather_single(torch.zeros(n * 10), torch.ones(10), group=group)  # output 40n bytes
            dist.reduce_scatter_single(torch.zeros(5), torch.ones(5 * n), group=group)  # input 20n bytes
            dist.all_reduce(torch.ones(7, dtype=torch.float64), group=group)  # 56 bytes
        dist.all_reduce(torch.ones(3))  # WORLD: 12 bytes
        inner = MeshTraffic(mesh).start()  # a second counter, active at once
        dist.broadcast(torch.ones(4), src=0)  # WORLD: 16 bytes
        inner.stop()
        patched_while_active = dist.all_reduce is not originals["all_reduce"]  # the outer one still counts
    dist.all_reduce(torch.ones(100))  # after stop: not counted
    restored = all(getattr(dist, n) is f for n, f in originals.items())
    return {
        "bytes": traffic.bytes,
        "inner": inner.bytes,
        "restored": restored,
        "patched": patched_while_active,
    }
