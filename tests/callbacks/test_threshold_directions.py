"""Every monitored threshold, crossed from both sides: SyncEarlyStopping's stop step and ModelCheckpoint's best score
on 2 gloo ranks equal a rule written here by hand, for each ``mode`` the callbacks declare.

The cases are generated: for each value of ``mode`` in SyncEarlyStopping's signature, the same scripted validation
scores (mirrored for "max": a score that improves under "min" improves under "max" once negated), with ``min_delta``
at 0 and between the small and the large improvements, and ``stopping_threshold`` / ``divergence_threshold`` each met
from its side. A callback that counts the wrong side of a threshold, or compares with min_delta the wrong way, stops
at another step (or never) in at least one case. The oracle is the rule Lightning documents, written without
Lightning: stop when the score is past ``stopping_threshold``, or past ``divergence_threshold`` the other way, or after
``patience`` checks without an improvement larger than ``min_delta``.
"""

from __future__ import annotations

import logging
import math
import os
import typing
from datetime import timedelta
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from distlab.testing import run_distributed

# Scores of successive validations, as a "min" run sees them: improvements of 0.5 (large) and 0.05 (small).
SCORES = [3.0, 2.5, 2.45, 2.44, 2.43, 2.42, 1.9, 1.85, 1.84, 1.83]
SMALL_DELTA = 0.1  # between the small and the large improvements
PATIENCE = 2


def _modes() -> tuple[str, ...]:
    from distlab.callbacks import SyncEarlyStopping

    return typing.get_args(typing.get_type_hints(SyncEarlyStopping.__init__)["mode"])


def cases() -> list[dict]:
    out = []
    for mode in _modes():
        sign = 1.0 if mode == "min" else -1.0
        scores = [sign * v for v in SCORES]
        base = dict(mode=mode, scores=scores, patience=PATIENCE, min_delta=0.0)
        out += [
            {**base, "name": f"{mode}-no-delta"},
            {**base, "name": f"{mode}-plateau", "scores": [sign * v for v in [3.0, 2.5, 2.6, 2.5, 2.4]]},
            {**base, "name": f"{mode}-delta", "min_delta": SMALL_DELTA},
            {**base, "name": f"{mode}-stopping-threshold", "stopping_threshold": sign * 2.0},
            {
                **base,
                "name": f"{mode}-divergence",
                "scores": [sign * v for v in [3.0, 2.5, 4.0, 2.0]],
                "divergence_threshold": sign * 3.5,
            },  # fmt: skip
        ]
    return out


def oracle(case: dict) -> tuple[int | None, float]:
    """(the check at which training stops, 1-based, or None: it runs to the end; the best score seen until then, which
    a ModelCheckpoint(mode=...) keeping one checkpoint holds), by the documented rule."""
    lower = case["mode"] == "min"
    better = (lambda a, b: a < b) if lower else (lambda a, b: a > b)
    best, wait = (math.inf if lower else -math.inf), 0
    scores = case["scores"]
    for k, v in enumerate(scores, start=1):
        seen = min(scores[:k]) if lower else max(scores[:k])
        stop_at, diverge_at = case.get("stopping_threshold"), case.get("divergence_threshold")
        if stop_at is not None and better(v, stop_at):
            return k, seen
        if diverge_at is not None and better(diverge_at, v):
            return k, seen
        if better(v + case["min_delta"] if lower else v - case["min_delta"], best):
            best, wait = v, 0
        else:
            wait += 1
            if wait >= case["patience"]:
                return k, seen
    return None, min(scores) if lower else max(scores)


class Scripted(L.LightningModule):
    """Validation after every step reports the case's next score, whatever the weights."""

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.scores = scores
        self.net = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return F.mse_loss(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("score", torch.tensor(self.scores[self.trainer.global_step - 1]))

    def configure_optimizers(self):
        from distlab.optim import DistAdamW

        return DistAdamW(self.parameters(), lr=0.01)


def job(rank: int, world: int, all_cases: list[dict], root: str) -> dict:
    from lightning.pytorch.callbacks import ModelCheckpoint

    import distlab  # noqa: F401
    from distlab.callbacks import RankZeroValidation, SyncEarlyStopping
    from distlab.strategies import OptimizerSyncDDPStrategy

    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world), RANK=str(rank))
    out = {}
    for case in all_cases:
        keys = ("mode", "min_delta", "patience", "stopping_threshold", "divergence_threshold")
        stopper = SyncEarlyStopping(monitor="score", **{k: case[k] for k in keys if k in case})
        keeper = ModelCheckpoint(
            dirpath=Path(root) / case["name"], monitor="score", mode=case["mode"], save_top_k=1
        )
        trainer = L.Trainer(
            accelerator="cpu",
            devices=world,
            strategy=OptimizerSyncDDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60)),
            max_steps=len(case["scores"]),
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[RankZeroValidation(every_n_steps=1), stopper, keeper],
            default_root_dir=root,
        )
        data = DataLoader(TensorDataset(torch.randn(64, 2), torch.randn(64, 1)), batch_size=2)
        val = DataLoader(TensorDataset(torch.randn(4, 2), torch.randn(4, 1)), batch_size=2)
        trainer.fit(Scripted(case["scores"]), data, val)
        stopped = trainer.global_step if stopper.stopped_step else None
        out[case["name"]] = (stopped, float(keeper.best_model_score))
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    return run_distributed(job, 2, cases(), str(tmp_path_factory.mktemp("thresholds")), timeout=400)


def test_the_cases_cross_every_threshold_from_both_sides():
    """Each mode stops early in some case and runs to the end in none where it should stop: the cases have teeth."""
    stops = {c["name"]: oracle(c)[0] for c in cases()}
    for mode in _modes():
        mine = [v for k, v in stops.items() if k.startswith(mode)]
        assert len(set(mine)) >= 3, (
            mode,
            stops,
        )  # the delta, the thresholds and patience each stop elsewhere


@pytest.mark.timeout(500)
@pytest.mark.parametrize("case", cases(), ids=lambda c: c["name"])
def test_stop_step_and_best_score_follow_the_rule(results, case):
    stop, best = oracle(case)
    for rank, got in enumerate(results):
        stopped, kept = got[case["name"]]
        assert stopped == stop, f"rank {rank}: stopped at check {stopped}, the rule says {stop}"
        assert kept == pytest.approx(best), (
            f"rank {rank}: ModelCheckpoint kept {kept} as best, the rule says {best}"
        )


@pytest.mark.parametrize("mode", _modes())
@pytest.mark.parametrize("apart", [-1.0, 0.0, 1.0], ids=["crossing", "equal", "apart"])
def test_thresholds_that_would_stop_at_the_first_check_are_refused_from_both_sides(mode, apart):
    """divergence_threshold must lie beyond stopping_threshold in the direction the metric worsens (above for
    "min", below for "max"); equal or crossing thresholds would stop every fit at its first check: one line."""
    from distlab.callbacks import SyncEarlyStopping
    from distlab.errors import ConfigError

    sign = 1.0 if mode == "min" else -1.0
    stop, diverge = 2.0 * sign, (2.0 + apart) * sign
    if apart > 0:
        SyncEarlyStopping(monitor="score", mode=mode, stopping_threshold=stop, divergence_threshold=diverge)
    else:
        with pytest.raises(ConfigError, match="is on the wrong side of stopping_threshold"):
            SyncEarlyStopping(
                monitor="score", mode=mode, stopping_threshold=stop, divergence_threshold=diverge
            )
