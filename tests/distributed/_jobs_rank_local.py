"""Rank jobs for test_rank_local (module-level so spawned ranks can import them)."""

from __future__ import annotations

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import TensorDataset
from torchmetrics import MeanMetric, Metric

from distlab.callbacks.exact_eval import EvalData, ExactEvaluator
from distlab.distributed import RankLocalCollectiveError, forbid_collectives, on_rank_zero


def _outcome(fn) -> str:
    try:
        fn()
    except RankLocalCollectiveError as e:
        return f"refused: {e}"
    return "ran"


def job_forbid(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    out = {}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    metric = MeanMetric()
    metric.update(torch.tensor([float(rank)]))
    if rank == 0:  # rank 0 alone: every kind of collective must be refused at once, not hang
        with forbid_collectives("the test on rank 0"):
            out["all_reduce"] = _outcome(lambda: dist.all_reduce(torch.ones(1)))
            out["barrier"] = _outcome(lambda: dist.barrier())
            out["torchmetrics"] = _outcome(lambda: metric.compute())  # its own sync: an all_gather
            out["fsdp2_forward"] = _outcome(lambda: model(torch.ones(1, 4)))
        out["after"] = float(dist.all_reduce(torch.ones(1)) or 0)  # restored: collectives work again
    else:
        dist.all_reduce(torch.ones(1))  # meets rank 0's "after"
    # Sharded parameters: on_rank_zero runs the forward on every rank (it is collective), returns on rank 0.
    got = on_rank_zero(model, "a sample", lambda: model(torch.ones(1, 4)).sum().item())
    out["on_rank_zero"] = got
    dist.barrier()
    return out


class _StepMeanState(Metric):
    """A metric whose state is reduced across ranks by mean: not exact when shards differ in size."""

    def __init__(self):
        super().__init__()
        self.add_state("avg", default=torch.tensor(0.0), dist_reduce_fx="mean")

    def update(self, x):
        self.avg = x.mean()

    def compute(self):
        return self.avg


class _Probe(L.LightningModule):
    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.net = kind, torch.nn.Linear(3, 2)
        self.meanish = _StepMeanState()
        self.seen: list[float] = []

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        if self.kind == "mean_state":
            self.meanish.update(loss)
            self.log("val_meanish", self.meanish)
        elif self.kind == "on_step":
            self.log("val_loss", loss, on_step=True)
        else:
            self.seen.append(float(loss))
            self.log("val_loss", loss)

    def on_validation_epoch_end(self):
        if self.kind == "rank_local":  # the classic: a mean over this rank's own outputs only
            self.log("val_avg_of_outputs", sum(self.seen) / max(len(self.seen), 1))
            self.seen.clear()


def job_refusals(rank: int, world: int) -> dict:
    g = torch.Generator().manual_seed(0)
    data = EvalData(
        TensorDataset(torch.randn(7, 3, generator=g), torch.randint(0, 2, (7,), generator=g)), batch_size=2
    )
    out = {}
    for kind in ("mean_state", "on_step", "rank_local"):
        torch.manual_seed(0)
        try:
            ExactEvaluator(_Probe(kind), "validation", data, "distributed").run()
            out[kind] = "accepted"
        except Exception as e:  # noqa: BLE001
            out[kind] = f"{type(e).__name__}: {e}"
    torch.manual_seed(0)
    out["rank_local_in_rank_zero_mode"] = ExactEvaluator(
        _Probe("rank_local"), "validation", data, "rank_zero"
    ).run()
    return out


def job_long_rank_zero_validation(rank: int, world: int, wait_s: float, group_timeout_s: float) -> dict:
    """Rank 0 validates for ``wait_s`` seconds of real work while rank 1 waits in the group RankZeroValidation
    makes (``wait_group``) with ``group_timeout_s``. Returns the results or the error, and how long rank 1 waited."""
    import time

    from distlab.callbacks.rank_zero_validation import wait_group
    from distlab.data import TextDataModule
    from tests.helpers.modules import SlowValidationModule

    torch.manual_seed(0)
    module = SlowValidationModule(seconds=wait_s, depth=1, aspect_ratio=32, head_dim=16, sequence_len=16)
    data = TextDataModule(seq_len=16, batch_size=2, max_val_windows=4).val_dataset()
    group = wait_group(group_timeout_s)
    t0 = time.monotonic()
    try:
        out = {
            "results": ExactEvaluator(module, "validation", EvalData(data, 2), "rank_zero", group=group).run()
        }
    except Exception as e:  # noqa: BLE001
        out = {"error": f"{type(e).__name__}: {e}"}
    out["waited_s"] = time.monotonic() - t0
    return out


class _Reduces(L.LightningModule):
    """Logs one statistic of each batch's values with ``reduce_fx=spelling``: the per-batch statistic of the
    reduction's kind (mean, sum, max, min), so that reducing it over batches gives the statistic of all samples."""

    def __init__(self, spelling, kind: str):
        super().__init__()
        self.spelling, self.kind, self.net = spelling, kind, torch.nn.Linear(1, 1)

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        stat = {"mean": x.mean(), "sum": x.sum(), "max": x.max(), "min": x.min()}.get(self.kind, x.mean())
        self.log("v", stat, reduce_fx=self.spelling, batch_size=len(x))


def job_every_reduction(rank: int, world: int, cases: list, values: list[float], batch_size: int) -> dict:
    """Exact evaluation of ``_Reduces`` for every (spelling, kind); kind "refused" where Lightning refuses it or
    takes it as a custom reduction. Returns the value, or the error's class and first line, per case index."""
    data = EvalData(TensorDataset(torch.tensor(values, dtype=torch.float64)), batch_size=batch_size)
    out = {}
    for i, (spelling, kind) in enumerate(cases):
        try:
            out[i] = ExactEvaluator(_Reduces(spelling, kind), "validation", data, "distributed").run()["v"]
        except Exception as e:  # noqa: BLE001
            out[i] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return out
