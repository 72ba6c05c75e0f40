"""A param group added after the optimizer has stepped (a layer unfrozen mid-run, a head added for fine-tuning) is
updated from then on exactly as torch.optim.Muon / torch.optim.AdamW update it, on 1, 2 and 3 ranks: the ownership
of every param is rebuilt, never the stale one that knew no such param."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.dist import run_distributed
from tests.optim import _jobs_param_groups_added as jobs


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_group_added_mid_run_trains_like_torchs(world, monkeypatch):
    monkeypatch.setattr(
        torch.Tensor, "__hash__", torch.Tensor.__hash__
    )  # (no-op: keeps the fixture symmetric)
    want = jobs.torch_reference(world)
    for rank, got in enumerate(run_distributed(jobs.job_add_group_mid_run, world)):
        for i, (a, b) in enumerate(zip(got["params"], want, strict=True)):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-6, msg=f"rank {rank}, param {i}")
