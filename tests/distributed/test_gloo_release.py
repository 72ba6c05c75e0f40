"""distlab.distributed.gloo: a collective returns only once gloo's worker thread let go of our tensors.

Without that, the worker can drop the last reference after Python did, and then needs the GIL; at
interpreter exit CPython kills it mid-destructor and the rank dies with SIGABRT (pytorch#117762, seen
in our CI). Measured without the fix: right after a plain ``dist.all_reduce`` returned, the tensor's
use count was still 4 (the worker's references), 1 a few ms later.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distlab.distributed import broadcast_object, gloo
from distlab.distributed import collectives as comm
from distlab.distributed.gloo import hold_until_released
from tests.helpers.dist import run_distributed

ROUNDS = 30


def _job_release(rank: int, world: int) -> dict:
    held: dict[str, list[int]] = {"all_reduce": [], "reduce_scatter": [], "all_gather": [], "async": []}
    held["raw_all_reduce"] = []
    for i in range(ROUNDS):
        t = torch.full((64,), float(rank + i))
        comm.all_reduce_sum(t)
        held["all_reduce"].append(t._use_count())  # only our Python object left: 1

        inp = torch.randn(world * 8, 16)
        out = comm.reduce_scatter_sum(inp)
        held["reduce_scatter"].append(max(inp._use_count(), out._use_count()))

        own = torch.randn(4, 16)
        gathered = comm.all_gather(own)
        held["all_gather"].append(max(own._use_count(), gathered._use_count()))

        pending = comm.all_gather(own, async_op=True)
        res = pending.wait()
        held["async"].append(max(own._use_count(), res._use_count()))

        u = torch.ones(32)
        with hold_until_released(u):
            dist.all_reduce(u)
        held["raw_all_reduce"].append(u._use_count())
        assert torch.equal(u, torch.full((32,), float(world)))
    assert gloo._exit_drain_installed  # distlab's first collective installed the exit drain
    group = dist.new_group(list(range(world)))
    obj = broadcast_object({"rank": rank, "x": [rank] * 3}, src=0, group=group)
    return {"held": held, "obj": obj, "sum": float(t[0])}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_collectives_return_after_gloo_released_tensors(world):
    by_rank = run_distributed(_job_release, world, timeout=90)
    for res in by_rank:
        for op, counts in res["held"].items():
            assert counts == [1] * ROUNDS, f"{op}: gloo still held a tensor after return: {counts}"
        assert res["obj"] == {"rank": 0, "x": [0, 0, 0]}
        assert res["sum"] == sum(r + ROUNDS - 1 for r in range(world))
