"""Rank-local code cannot reach a collective, and exact evaluation refuses what it cannot make exact.

Every check here would otherwise hang or silently report a wrong value: the jobs run on real gloo
ranks, bounded by the harness timeout.
"""

from __future__ import annotations

import pytest
import torch

from distlab.distributed.spawn import unshare_tensors
from tests.distributed import _jobs_rank_local as jobs
from tests.helpers.dist import run_distributed


@pytest.mark.timeout(120)
def test_collectives_on_one_rank_are_refused_and_sharded_work_runs_everywhere():
    ranks = run_distributed(jobs.job_forbid, 2, timeout=100)
    zero = ranks[0]
    for kind in ("all_reduce", "barrier", "torchmetrics", "fsdp2_forward"):
        assert zero[kind].startswith("refused: the test on rank 0 runs on rank 0 alone"), (kind, zero[kind])
    assert "torch.distributed" in zero["torchmetrics"] and "all_gather" in zero["fsdp2_forward"]
    assert zero["on_rank_zero"] is not None and ranks[1]["on_rank_zero"] is None


def _reduction_kind(spelling) -> str:
    """What Lightning makes of ``self.log(..., reduce_fx=spelling)``: mean/sum/max/min, or "refused" (an error,
    or a custom reduction, which exact evaluation cannot reproduce). The domain is Lightning's, not distlab's."""
    from lightning.pytorch.trainer.connectors.logger_connector.result import _Metadata

    try:
        meta = _Metadata(fx="validation_step", name="v", reduce_fx=spelling)
    except Exception:  # noqa: BLE001 - Lightning refuses it
        return "refused"
    for kind in ("mean", "sum", "max", "min"):
        if getattr(meta, f"is_{kind}_reduction"):
            return kind
    return "refused"


# Spellings users write: every case of Lightning's names, torch's and Python's functions, and ones it refuses.
SPELLINGS = [
    *(v for name in ("mean", "avg", "sum", "max", "min", "median") for v in {name, name.upper(), name.title()}),
    torch.mean, torch.sum, torch.max, torch.min, sum, max, min, torch.median, torch.std,
]  # fmt: skip


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [2, 3])
def test_every_reduction_lightning_accepts_is_exact_across_ranks(world):
    """9 values in batches of 2 over 2 and 3 ranks (shards of unequal size): every reduce_fx Lightning takes
    gives the statistic of all values (computed here with Python's own arithmetic); every one it refuses, or
    takes as a custom reduction, is refused in one line."""
    import math

    values = [0.5, -3.25, 7.0, 2.0, -1.5, 4.75, 0.0, 9.5, -6.0]
    expect = {
        "mean": math.fsum(values) / len(values),
        "sum": math.fsum(values),
        "max": max(values),
        "min": min(values),
    }
    cases = [(s, _reduction_kind(s)) for s in SPELLINGS]
    assert {k for _, k in cases} == {"mean", "sum", "max", "min", "refused"}
    for r in run_distributed(jobs.job_every_reduction, world, cases, values, 2, timeout=130):
        for i, (spelling, kind) in enumerate(cases):
            got = r[i]
            if kind == "refused":
                assert isinstance(got, str) and got.startswith("ConfigError") and "reduce_fx" in got, (
                    spelling,
                    got,
                )
            else:
                assert got == pytest.approx(expect[kind], rel=1e-12, abs=1e-12), (spelling, kind, got)


@pytest.mark.timeout(120)
def test_exact_evaluation_refuses_what_it_cannot_make_exact():
    for r in run_distributed(jobs.job_refusals, 3, timeout=100):  # 7 samples on 3 ranks: shards of 2, 2, 3
        assert r["mean_state"].startswith("ConfigError") and "reduced across ranks with" in r["mean_state"]
        assert r["on_step"].startswith("ConfigError") and "on_step=True" in r["on_step"]
        assert r["rank_local"].startswith("EvaluationError") and "rank-local data" in r["rank_local"]
        # rank_zero mode sees every output on one rank: the same module is exact there.
        assert set(r["rank_local_in_rank_zero_mode"]) >= {"val_loss", "val_avg_of_outputs"}


def test_unshare_tensors_gives_a_spawned_rank_its_own_metric_states():
    from torchmetrics import SumMetric

    metric = SumMetric()
    metric.sum_value.share_memory_()  # what torch's multiprocessing pickler does for a spawned child
    shared = metric.sum_value
    module = torch.nn.Module()
    module.metric = metric
    assert unshare_tensors(module) == 1
    metric.update(torch.tensor(3.0))
    assert float(shared) == 0.0 and float(metric.compute()) == 3.0 and not metric.sum_value.is_shared()


@pytest.mark.timeout(120)
def test_a_long_rank_zero_validation_waits_in_its_own_group():
    """Rank 0 validates for 4 s while rank 1 waits. In RankZeroValidation's own wait group (120 s) that is
    fine; a group with a 1 s timeout, as a short main process group would be, fails: the wait is real.
    Nothing here depends on the machine's speed: the work takes at least 4 s of wall time by construction,
    and the control fails at 1 s whatever the load."""
    ok = run_distributed(jobs.job_long_rank_zero_validation, 2, 4.0, 120.0, timeout=100)
    for r in ok:
        assert "results" in r, r.get("error")
        assert r["results"]["val_time_s"] >= 4.0 and "val_loss" in r["results"]  # it ran, all of it
    assert ok[1]["waited_s"] >= 4.0  # rank 1 really waited longer than the short group allows
    short = run_distributed(jobs.job_long_rank_zero_validation, 2, 4.0, 1.0, timeout=100)
    assert "Timed out" in short[1].get("error", "") and short[1]["waited_s"] < 4.0, short[1]


def test_a_refused_collective_names_the_work_the_rank_and_the_hint(monkeypatch):
    """The one-line refusal says what to do when the caller knows (the hint), and nothing dangling otherwise."""
    import torch.distributed as dist

    from distlab.distributed import rank_local

    monkeypatch.setattr(rank_local, "world_info", lambda group=None: (2, 1))  # rank 1 of 2; no group needed
    original = dist.all_reduce
    for hint, tail in (
        ("log with sync_dist=False", "; log with sync_dist=False"),
        ("", "would wait forever"),
    ):
        with rank_local.forbid_collectives("the sample", hint):
            with pytest.raises(rank_local.RankLocalCollectiveError) as info:
                dist.all_reduce(torch.zeros(1))
        message = str(info.value)
        assert message.startswith(
            "the sample runs on rank 1 alone but called the collective torch.distributed"
        )
        assert message.endswith(tail), message
    assert dist.all_reduce is original  # restored after the block
