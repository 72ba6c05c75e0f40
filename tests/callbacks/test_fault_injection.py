"""FaultInjection does what it is asked, where and when, once, and never in a restarted attempt.

(The multi-process consequences - the job ends, names the rank, resumes after a restart - are in
tests/slow/test_torchrun.py.)"""

from __future__ import annotations

import re

import lightning as L
import pytest

from distlab.callbacks import FaultInjection, InjectedFault, NonFiniteLossError, SyncEarlyStopping
from distlab.errors import ConfigError
from distlab.modules import GPTLightningModule
from tests.callbacks.test_rank_safe_callbacks import TINY, datamodule, trainer


class StepsStarted(L.Callback):
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.steps.append(trainer.global_step)


@pytest.mark.timeout(120)
def test_crash_at_the_asked_step(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    seen = StepsStarted()
    t = trainer(tmp_path, 1, [seen, FaultInjection("crash", rank=0, step=3)], max_steps=6)
    with pytest.raises(InjectedFault, match="injected crash on rank 0 at step 3"):
        t.fit(GPTLightningModule(**TINY), datamodule())
    assert seen.steps == [0, 1, 2, 3]


@pytest.mark.timeout(120)
def test_nan_makes_the_loss_non_finite_and_sync_early_stopping_stops(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    stop = SyncEarlyStopping(monitor="val_loss", strict=False)
    t = trainer(tmp_path, 1, [stop, FaultInjection("nan", rank=0, step=2)], max_steps=6)
    with pytest.raises(NonFiniteLossError, match="non-finite loss on rank 0 at step 2"):
        t.fit(GPTLightningModule(**TINY), datamodule())


@pytest.mark.timeout(120)
def test_a_restarted_attempt_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "SLURM_JOB_ID", "4242"
    )  # a requeued SLURM job (a count counts under its launcher only)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    t = trainer(tmp_path, 1, [FaultInjection("crash", rank=0, step=1)], max_steps=3)
    t.fit(GPTLightningModule(**TINY), datamodule())
    assert t.global_step == 3


def test_from_env():
    assert FaultInjection.from_env({}) is None
    fault = FaultInjection.from_env({"DISTLAB_FAULT": "sigkill:1:7"})
    assert (fault.kind, fault.rank, fault.step) == ("sigkill", 1, 7)
    for bad in ("crash", "crash:1", "boom:1:2", "crash:x:2"):
        with pytest.raises(ConfigError):
            FaultInjection.from_env({"DISTLAB_FAULT": bad})


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "rank,step,said", [(1, 2, "rank=1 is not in this job of 1 rank(s)"), (0, 6, "step=6 is not before")]
)
def test_a_fault_that_could_never_fire_is_refused(tmp_path, monkeypatch, rank, step, said):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    seen = StepsStarted()
    t = trainer(tmp_path, 1, [seen, FaultInjection("crash", rank=rank, step=step)], max_steps=6)
    with pytest.raises(ConfigError, match=re.escape(said)):
        t.fit(GPTLightningModule(**TINY), datamodule())
    assert seen.steps == []  # refused before the first step
