"""distlab.distributed.collectives: each wrapper's shape contract and sums on real gloo ranks (2 and 3).

The expected values are computed here from every rank's input (each rank can rebuild the others' from
their seeds), in float64, independently of how the wrapper moves the data (on gloo, reduce_scatter is an
all_to_all plus a local sum).
"""

from __future__ import annotations

import pytest
import torch

from distlab.distributed import collectives as comm
from tests.helpers.dist import run_distributed

K = 5  # rows each rank owns


def _input(rank: int, world: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(world * K, 3, 2, generator=gen)  # (W*k, 3, 2)


def _job(rank: int, world: int) -> dict:
    inp = _input(rank, world)
    comm.comm_stats.reset()
    out_sync = comm.reduce_scatter_sum(inp.clone())
    out_async = comm.reduce_scatter_sum(inp.clone(), async_op=True).wait()
    stats = comm.comm_stats.snapshot()
    gathered = comm.all_gather(out_sync)
    # finish runs once: a second wait() returns the same tensor and repeats no in-place step (the optimizer's /W)
    pending = comm.reduce_scatter_sum(inp.clone(), async_op=True)
    halved = pending.then(lambda g: g.div_(2))
    wait_once = pending.wait() is pending.wait() and halved.wait() is halved.wait()
    # a non-contiguous view of the same values, and an empty input (a step where no rank has a gradient)
    strided = comm.reduce_scatter_sum(inp.transpose(1, 2).clone().transpose(1, 2))
    empty = comm.reduce_scatter_sum(torch.empty(0, 3))
    return {
        "strided_equal": torch.equal(strided, out_sync),
        "wait_once": wait_once,
        "halved_once": torch.equal(halved.wait(), out_sync / 2),
        "empty_shape": tuple(empty.shape),
        "inp_unchanged": torch.equal(inp, _input(rank, world)),
        "sync": out_sync,
        "async": out_async,
        "gathered": gathered,
        "rs_bytes": stats["reduce_scatter"]["bytes"],
        "rs_calls": stats["reduce_scatter"]["calls"],
        "rs_seconds": stats["reduce_scatter"]["seconds"],
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_reduce_scatter_and_all_gather_match_the_sum_over_ranks(world):
    by_rank = run_distributed(_job, world, timeout=90)
    total = sum(_input(r, world).double() for r in range(world))  # (W*k, 3, 2)
    full = total.float()
    for rank, res in enumerate(by_rank):
        want = total[rank * K : (rank + 1) * K]
        assert res["sync"].shape == (K, 3, 2)
        torch.testing.assert_close(res["sync"].double(), want, rtol=0, atol=1e-6)
        assert torch.equal(res["sync"], res["async"]), "sync and async reduce_scatter differ"
        # every rank ends with the owners' results, the same bits on every rank
        torch.testing.assert_close(res["gathered"], full, rtol=0, atol=1e-6)
        assert torch.equal(res["gathered"], by_rank[0]["gathered"])
        assert res["inp_unchanged"], "reduce_scatter wrote into its input"
        nbytes = world * K * 3 * 2 * 4
        assert res["rs_bytes"] == pytest.approx(2 * (world - 1) / world * nbytes)  # two calls
        assert res["rs_calls"] == 2 and res["rs_seconds"] > 0
        assert res["strided_equal"] and res["empty_shape"] == (0, 3)
        assert res["wait_once"] and res["halved_once"]
    if world == 2:  # two addends: exact in any order
        for rank, res in enumerate(by_rank):
            assert torch.equal(res["sync"], full[rank * K : (rank + 1) * K])
