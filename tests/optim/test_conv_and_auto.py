"""Muon on conv kernels (as their 2-D views) and the gradient-sync mode left to the optimizer, on 1-3 ranks."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.dist import run_distributed
from tests.optim import _jobs_conv_and_auto as jobs


def test_conv_kernels_one_process_equal_torch_muon_on_the_2d_view():
    got = jobs.job_conv(0, 1, sharded=False)
    assert got["mode"] == "reduce"
    for a, b in zip(got["params"], jobs.oracle(1), strict=True):
        assert torch.equal(a, b)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("sharded", [False, True], ids=["zero1", "fsdp2_dtensor"])
def test_conv_kernels_distributed_equal_torch_bit_for_bit(world, sharded):
    ranks = run_distributed(jobs.job_conv, world, sharded, timeout=150)
    expected = jobs.oracle(world)
    for r, got in enumerate(ranks):
        assert got["mode"] == ("sharded" if sharded else "reduce"), got[
            "mode"
        ]  # chosen with no grad_sync given
        for j, (a, b) in enumerate(zip(got["params"], expected, strict=True)):
            assert torch.equal(a, b), f"rank {r} param {j} of shape {tuple(b.shape)}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 3])
def test_distmuon_on_fully_shard_params_without_a_mode(world):
    """`DistMuon(model.parameters())` on an FSDP2 model once died inside DTensor (no sharding strategy for
    allgather_); with the mode resolved from the params it trains as one process does."""
    ranks = run_distributed(jobs.job_fully_shard_plain_api, world, timeout=150)
    expected = jobs.fully_shard_oracle(world)
    for got in ranks:
        assert got["modes"] == ["sharded", "sharded"]
        for a, b in zip(got["params"], expected, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "native, expected",
    [
        ([True, False], "torch.float32"),
        ([True, True], "torch.bfloat16"),
        ([True, True, False], "torch.float32"),
    ],
)
def test_auto_ns_dtype_is_agreed_by_every_rank(native, expected):
    """A job across hosts with and without native bf16 matmul: every rank must orthogonalise in one dtype
    (bf16 only if all have it), or matrices would travel, and be rounded, in two."""
    ranks = run_distributed(jobs.job_auto_ns_dtype, len(native), native, timeout=100)
    assert [r["dtype"] for r in ranks] == [expected] * len(native)
    for r in ranks[1:]:
        assert torch.equal(r["w"], ranks[0]["w"])
