"""DistMuonAdamW never reduces twice or not at all: it checks the mode against the gradients it sees.

One spawn runs every (DDP wrapper or not) x (grad_sync) configuration (tests/distributed/_jobs_grad_sync_modes.py).
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed._jobs_grad_sync_modes import (
    first_step_grad_norm_oracle,
    job_all_modes,
    torch_oracle_params,
)
from tests.helpers.dist import run_distributed


@pytest.fixture(scope="module")
def runs() -> dict:
    ranks = run_distributed(job_all_modes, 2, timeout=150)
    return {name: [r[name] for r in ranks] for name in ranks[0]}


@pytest.mark.timeout(200)
def test_ddp_wrapper_with_averaged_mode_equals_optimizer_sync(runs):
    """Both paths equal torch's optimizers on one process over the concatenated batch (an oracle without
    distlab: comparing the two paths with each other alone would pass if both were wrong the same way)."""
    synced, wrapped = runs["reduce"], runs["averaged_under_ddp"]  # the optimizer averages / DDP averaged
    oracle = torch_oracle_params(2)
    for res in (synced, wrapped):
        for a, b in zip(res[0]["params"], oracle, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # summation order differs: fp32 rounding
    for res in (synced, wrapped):
        for a, b in zip(res[0]["params"], res[1]["params"], strict=True):
            assert torch.equal(a, b)  # ranks bit-identical
        # The gradient each path works with is the average (a sum, or a double reduction, would show here).
        for r in res:
            assert r["norms"][0] == pytest.approx(first_step_grad_norm_oracle(2), rel=1e-5)


@pytest.mark.timeout(200)
def test_reduce_mode_under_a_ddp_wrapper_still_trains_the_average(runs):
    """An explicit 'reduce' is obeyed even where a DDP wrapper averaged already: the mean of equal gradients is
    that gradient, so the result is the oracle's (it once refused equal gradients, and with them a GAN's
    generator fed the same noise on every rank)."""
    for a, b in zip(runs["reduce_under_ddp"][0]["params"], torch_oracle_params(2), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(200)
def test_auto_mode_decides_at_every_step(runs):
    """First gradients that agree by chance (every rank on the same batch) must not switch averaging off for the
    steps after it: the result is the oracle's, and each rank ends bit-identical."""
    res = runs["auto_bare_same_first"]
    for a, b in zip(res[0]["params"], torch_oracle_params(2, same_first=True), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(res[0]["params"], res[1]["params"], strict=True):
        assert torch.equal(a, b)
    assert [r["mode"] for r in res] == ["reduce", "reduce"]  # the last step's decision


@pytest.mark.timeout(200)
def test_averaged_mode_refuses_unsynchronised_gradients(runs):
    assert all("gradients differ across ranks" in r["error"] for r in runs["averaged_bare"])


@pytest.mark.timeout(200)
def test_auto_mode_follows_the_ddp_wrapper(runs):
    """The user gives no mode: without a wrapper the optimizer averages; under DDP it does not average again."""
    explicit, bare, wrapped = runs["reduce"], runs["auto_bare"], runs["auto_under_ddp"]
    assert [r["mode"] for r in bare] == ["reduce", "reduce"]
    assert [r["mode"] for r in wrapped] == ["averaged", "averaged"]
    oracle = torch_oracle_params(2)
    for res in (explicit, bare, wrapped):
        for a, b in zip(res[0]["params"], oracle, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(200)
def test_auto_mode_tells_permuted_gradients_apart(runs):
    """Gradients whose elements (or whole params) are permuted across ranks have equal sums and norms; 'auto' must
    still see that they differ and average them (a plain sum as the checksum called them already averaged), so
    both ranks end with the parameters of torch's AdamW on the averaged gradients."""
    res = runs["auto_permuted"]
    assert [r["modes"] for r in res] == [["reduce", "reduce"]] * 2
    a, b = torch.zeros(4, requires_grad=True), torch.zeros(4, requires_grad=True)
    ref = torch.optim.AdamW([a, b], lr=0.1)
    g = torch.tensor([1.0, 2.0, 3.0, 4.0])
    for ga, gb in (((g + g.flip(0)) / 2, -(g + g.flip(0)) / 2), (1.5 * g, 1.5 * g)):
        a.grad, b.grad = ga, gb
        ref.step()
    for r in res:
        for got, want in zip(r["params"], (a, b), strict=True):
            torch.testing.assert_close(got, want.detach())
