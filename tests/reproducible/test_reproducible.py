"""Reproducible mode: 1, 2, 4 and 8 ranks train bit-identical weights (distlab/strategies/reproducible.py).

Oracles: one process (the same micro-batches summed in the documented tree, written out by hand where it can be);
max difference 0, not a tolerance. The control runs show the comparison has teeth: without the mode the same
gradients on another world size end in other bits.
"""

from __future__ import annotations

import pytest
import torch

from distlab.distributed import tree_sum
from distlab.strategies.reproducible import GradientTree
from tests.helpers.dist import run_distributed
from tests.reproducible import _jobs_reproducible as jobs


def test_the_tree_is_the_documented_one_and_does_not_depend_on_the_grouping():
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(7, generator=g) * 10 ** (i % 5 - 2) for i in range(8)]
    written_out = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
    assert torch.equal(tree_sum(a), written_out)
    for w in (1, 2, 4, 8):  # W ranks' subtrees, then the tree over the ranks
        k = 8 // w
        assert torch.equal(tree_sum([tree_sum(a[r * k : (r + 1) * k]) for r in range(w)]), written_out)
    three = a[:6]  # 6 parts: (a0+a1)+(a2+a3), then (a4+a5) after it
    assert torch.equal(tree_sum(three), ((a[0] + a[1]) + (a[2] + a[3])) + (a[4] + a[5]))
    assert not torch.equal(sum(a[1:], a[0]), written_out)  # the left fold is another order (teeth)


def test_the_gradient_tree_sums_micro_batches_in_that_order():
    params = [torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(2))]
    g = torch.Generator().manual_seed(1)
    micro = [[torch.randn(5, generator=g), None if i == 3 else torch.randn(2, generator=g)] for i in range(4)]
    tree = GradientTree()
    for grads in micro:
        for p, x in zip(params, grads, strict=True):
            p.grad = x
        tree.add(params)
        assert all(p.grad is None for p in params)  # set aside until the last micro-batch
    tree.finish(params)
    assert torch.equal(params[0].grad, (micro[0][0] + micro[1][0]) + (micro[2][0] + micro[3][0]))
    assert torch.equal(
        params[1].grad, (micro[0][1] + micro[1][1]) + micro[2][1]
    )  # a missing gradient adds nothing


@pytest.mark.timeout(240)
@pytest.mark.parametrize("clip", [None, 0.05], ids=["no-clip", "clip"])
def test_the_optimizer_takes_the_same_steps_on_1_2_and_4_ranks(clip):
    """DistMuonAdamW with fixed_order: the reduce-scatter and the clipping norm in one order; params and state equal
    to the last bit on every world size (gradients of mixed magnitudes, whose sums round by order)."""
    one = run_distributed(jobs.job_fixed_order, 1, True, clip)[0]
    for world in (2, 4):
        got = run_distributed(jobs.job_fixed_order, world, True, clip)
        for r in range(world):
            for a, b in zip(one["params"], got[r]["params"], strict=True):
                assert torch.equal(a, b), (world, r, (a - b).abs().max())
        for k, st in one["state"]["state"].items():
            for name, value in st.items():
                assert torch.equal(value, got[0]["state"]["state"][k][name]), (world, k, name)
        if clip:
            assert torch.equal(one["norm"], got[0]["norm"])
    control = run_distributed(jobs.job_fixed_order, 4, False, clip)[0]
    assert any(not torch.equal(a, b) for a, b in zip(one["params"], control["params"], strict=True)), (
        "without fixed_order 4 ranks happen to match 1: the test would not see the mode missing"
    )
