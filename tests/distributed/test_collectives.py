"""distlab.distributed.collectives: each wrapper's shape contract and sums on real gloo ranks (2 and 3).

The expected values are computed here from every rank's input (each rank can rebuild the others' from
their seeds), in float64, independently of how the wrapper moves the data (on gloo, reduce_scatter is an
all_to_all plus a local sum).
"""

from __future__ import annotations

import pytest
import torch

from distlab.distributed import collectives as comm
from distlab.distributed.collectives import tree_sum
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


# ---- every collective the distributed layer exports, against arithmetic over every rank's input -----------------
def _values(rank: int) -> torch.Tensor:
    return torch.tensor(
        [3.0 * rank - 1.0, 5.0 - rank, rank * rank + 0.5]
    )  # max/min come from different ranks


def _job_every_op(rank: int, world: int) -> dict:
    x = _values(rank)
    tree_in = torch.stack([_values(rank) * (w + 1) for w in range(world)])  # (W, 3): block w goes to rank w
    return {
        "all_reduce_sum": comm.all_reduce(x.clone(), "sum"),
        "all_reduce_max": comm.all_reduce(x.clone(), "max"),
        "all_reduce_min": comm.all_reduce(x.clone(), "min"),
        "all_reduce_sum_async": comm.all_reduce_sum(x.clone(), async_op=True).wait(),
        "any_rank": comm.any_rank([rank == 1, False, True], None, torch.device("cpu")),
        "global_norm": comm.global_norm([x[rank % 3 : rank % 3 + 1]], None, torch.device("cpu")),
        "broadcast": comm.broadcast(x.clone(), src=world - 1),
        "broadcast_object": comm.broadcast_object({"from": rank}, src=world - 1),
        "gather_objects": comm.gather_objects(rank * 10),
        "tree_reduce_scatter": comm.reduce_scatter_sum(tree_in.clone(), tree=True),
        "all_to_all_single": _all_to_all(rank, world),
    }


def _all_to_all(rank: int, world: int) -> torch.Tensor:
    send = torch.tensor([float(100 * rank + w) for w in range(world)])  # element w goes to rank w
    recv = torch.empty(world)
    comm.all_to_all_single(recv, send, [1] * world, [1] * world, None)
    return recv


# (what each exported collective is checked against; a collective the layer exports without a case here fails)
EVERY_OP = {
    "all_reduce": ["all_reduce_sum", "all_reduce_max", "all_reduce_min"],
    "all_reduce_sum": ["all_reduce_sum_async"],
    "any_rank": ["any_rank"],
    "global_norm": ["global_norm"],
    "broadcast": ["broadcast"],
    "broadcast_object": ["broadcast_object"],
    "gather_objects": ["gather_objects"],
    "reduce_scatter_sum": ["tree_reduce_scatter"],  # the rank-order path: the test above
    "all_to_all_single": ["all_to_all_single"],
    "all_gather": [],  # the test above
}


def test_every_exported_collective_has_an_oracle_case():
    import inspect

    import distlab.distributed as layer

    exported = {
        name
        for name in layer.__all__
        if inspect.isfunction(getattr(layer, name)) and getattr(layer, name).__module__ == comm.__name__
    }
    not_collectives = {
        "world_info",
        "is_distributed",
        "backend",
        "new_group",
        "cpu_group",
        "resolved",
        "then",
        "tree_sum",
    }
    missing = exported - not_collectives - set(EVERY_OP)
    covered_elsewhere = {"barrier", "broadcast_buffers", "broadcast_coalesced", "broadcast_module_states"}
    assert missing <= covered_elsewhere, (
        f"a collective with no oracle case: {sorted(missing - covered_elsewhere)}"
    )


def _job_subgroup(rank: int, world: int) -> dict:
    """Broadcasts over a group that leaves out global rank 0: group rank 0 is global rank 1, so a ``src`` read as a
    global rank would send rank 0's values (or fail: rank 0 is not in the group)."""
    import torch.distributed as dist

    group = dist.new_group([1, 2])  # every rank creates it; only its members use it
    if rank == 0:
        return {}
    module = torch.nn.Linear(2, 2)
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(float(rank))
    comm.broadcast_module_states(module, group=group, src=0)
    tensors = [torch.full((2,), float(rank)), torch.full((3,), 10.0 * rank, dtype=torch.float64)]
    comm.broadcast_coalesced(tensors, src=1, group=group)
    return {
        "broadcast": comm.broadcast(_values(rank), src=0, group=group),
        "broadcast_object": comm.broadcast_object({"from": rank}, src=1, group=group),
        "module": [p.detach().clone() for p in module.parameters()],
        "coalesced": tensors,
    }


@pytest.mark.timeout(120)
def test_broadcasts_over_a_subgroup_read_src_as_a_group_rank():
    by_rank = run_distributed(_job_subgroup, 3, timeout=90)
    for rank in (1, 2):
        got = by_rank[rank]
        assert torch.equal(got["broadcast"], _values(1)), rank  # group rank 0 = global rank 1
        assert got["broadcast_object"] == {"from": 2}, rank  # group rank 1 = global rank 2
        assert all(torch.equal(p, torch.full_like(p, 1.0)) for p in got["module"]), rank
        assert torch.equal(got["coalesced"][0], torch.full((2,), 2.0)), rank
        assert torch.equal(got["coalesced"][1], torch.full((3,), 20.0, dtype=torch.float64)), rank


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_every_collective_equals_arithmetic_over_the_ranks(world):
    by_rank = run_distributed(_job_every_op, world, timeout=90)
    inputs = torch.stack([_values(r) for r in range(world)])  # (W, 3)
    for rank, got in enumerate(by_rank):
        assert torch.equal(got["all_reduce_sum"], inputs.sum(0)), rank
        assert torch.equal(got["all_reduce_max"], inputs.max(0).values), (rank, got["all_reduce_max"])
        assert torch.equal(got["all_reduce_min"], inputs.min(0).values), (rank, got["all_reduce_min"])
        assert torch.equal(got["all_reduce_sum_async"], inputs.sum(0))
        assert got["any_rank"] == [world > 1, False, True]
        squares = sum(float(_values(r)[r % 3]) ** 2 for r in range(world))
        assert got["global_norm"].item() == pytest.approx(squares**0.5, rel=1e-6)
        assert torch.equal(got["broadcast"], _values(world - 1))
        assert got["broadcast_object"] == {"from": world - 1}
        assert got["gather_objects"] == [r * 10 for r in range(world)]
        contributions = [_values(r) * (rank + 1) for r in range(world)]  # what each rank sent to this one
        assert torch.equal(got["tree_reduce_scatter"][0], tree_sum(contributions))
        assert got["all_to_all_single"].tolist() == [float(100 * r + rank) for r in range(world)]
