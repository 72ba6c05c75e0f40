"""MeshTraffic (SpeedMonitor's bytes by mesh dimension) against arithmetic on collectives of known sizes, on real
gloo ranks: a 2-D (replicate, shard) mesh of 2x2 and a 1-D mesh of 3. The byte model: (W-1)/W of the whole buffer,
twice for an all-reduce. Under a real HSDP fit: tests/fsdp/test_hsdp.py (the replicate dimension's bytes equal
the all-reduce of every gradient shard)."""

from __future__ import annotations

import pytest

from tests.distributed import _jobs_mesh_traffic as jobs
from tests.helpers.dist import run_distributed


def expected(n: int) -> float:
    """Bytes the three collectives on one dimension of n ranks move per rank."""
    f = (n - 1) / n
    return f * 40 * n + f * 20 * n + 2 * f * 56


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shape", [(2, 2), (3,)], ids=["2x2", "1-D of 3"])
def test_bytes_are_filed_by_the_mesh_dimension_of_each_call(shape):
    world = 4 if len(shape) == 2 else 3
    for rank, got in enumerate(run_distributed(jobs.job_known_collectives, world, shape, timeout=100)):
        f = (world - 1) / world
        if len(shape) == 2:
            want = {"replicate": expected(2), "shard": expected(2), "world": 2 * f * 12 + f * 16}
            inner = {"world": f * 16}
        else:  # a 1-D mesh over every rank: WORLD is its dimension
            want = {"shard": expected(3) + 2 * f * 12 + f * 16}
            inner = {"shard": f * 16}
        assert got["bytes"] == pytest.approx(want), f"rank {rank}"
        assert got["inner"] == pytest.approx(inner), f"rank {rank}"
        assert got["patched"] and got["restored"], f"rank {rank}: {got}"
