"""Every distlab callback x every strategy on 2 CPU ranks; rank-local code can never reach a collective.

Callbacks are discovered from ``distlab.callbacks.__all__``: a new one joins the matrix by itself (it
needs an entry in ARGS only if it has required arguments). Each (callback, strategy) fit must end on
every rank at the same step with no error, or be refused in one line before training (REFUSED).
"""

from __future__ import annotations

import inspect
import os
import tempfile
from datetime import timedelta

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

import distlab.callbacks
from distlab.modules import GPTLightningModule
from tests.helpers.callbacks import RecordEnd, load_ends

TINY = dict(depth=1, aspect_ratio=32, head_dim=16, sequence_len=16)
STRATEGIES = ["ddp_spawn", "ddp_optimizer_sync_spawn", "fsdp2_spawn"]
CALLBACKS = sorted(
    name
    for name in distlab.callbacks.__all__
    if inspect.isclass(getattr(distlab.callbacks, name))
    and issubclass(getattr(distlab.callbacks, name), L.Callback)
)
ARGS = {
    "SyncEarlyStopping": {"monitor": "val_loss", "patience": 1},
    "RankZeroValidation": {"every_n_steps": 2},
    # armed at a step the run reaches, in a restarted attempt (the test says so): it must stay inert
    "FaultInjection": {"kind": "crash", "rank": 1, "step": 1},
    # polled every step, never asked (a file in an existing folder that nobody creates)
    "CheckpointOnStopRequest": {
        "stop_file": os.path.join(tempfile.gettempdir(), f"distlab-never-asked-{os.getpid()}")
    },
}
VARIANTS = {"RankZeroValidation": [{"mode": "auto"}, {"mode": "rank_zero"}, {"mode": "distributed"}]}
# (callback, variant, strategy) -> the one-line refusal expected before training.
REFUSED = {("RankZeroValidation", "rank_zero", "fsdp2_spawn"): "cannot run with sharded parameters"}
CASES = [
    (name, variant, strategy)
    for name in CALLBACKS
    for variant in VARIANTS.get(name, [{}])
    for strategy in STRATEGIES
]


def make_strategy(name: str):
    from lightning.pytorch.strategies import DDPStrategy

    from distlab.strategies import FSDP2Strategy, OptimizerSyncDDPStrategy

    cls = {
        "ddp_spawn": DDPStrategy,
        "ddp_optimizer_sync_spawn": OptimizerSyncDDPStrategy,
        "fsdp2_spawn": FSDP2Strategy,
    }
    return cls[name](start_method="forkserver", timeout=timedelta(seconds=60))


def forked_ranks(trainer: L.Trainer) -> L.Trainer:
    """Lightning's DDP with the launcher the distlab CLI gives ddp_spawn (Lightning's own forkserver ranks would
    share the weights and the server's environment); distlab's strategies have it already."""
    from distlab.compat import set_launcher
    from distlab.strategies.launcher import SpawnLauncher

    if type(trainer.strategy).__name__ == "DDPStrategy":
        set_launcher(trainer.strategy, SpawnLauncher(trainer.strategy, start_method="forkserver"))
    return trainer


def test_every_callback_is_in_the_matrix():
    assert {"RankZeroValidation", "SyncEarlyStopping", "SampleText", "LossCurvePlot"} <= set(CALLBACKS)
    for name in CALLBACKS:
        required = [
            p.name
            for p in inspect.signature(getattr(distlab.callbacks, name)).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD
        ]
        assert set(required) <= set(ARGS.get(name, {})), f"add {name}'s required arguments {required} to ARGS"


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "name,variant,strategy", CASES, ids=[f"{n}-{v.get('mode', 'default')}-{s}" for n, v, s in CASES]
)
def test_callback_under_strategy(tmp_path, monkeypatch, capfd, name, variant, strategy):
    from distlab.data import TextDataModule

    if name == "FaultInjection":
        monkeypatch.setenv("SLURM_JOB_ID", "4242")  # a requeued SLURM job: the spawned ranks inherit it
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")

    callback = getattr(distlab.callbacks, name)(**{**ARGS.get(name, {}), **variant})
    own_validation = isinstance(callback, distlab.callbacks.RankZeroValidation)
    trainer = forked_ranks(
        L.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=make_strategy(strategy),
            max_steps=4,
            val_check_interval=2,  # Lightning's own loop, unless RankZeroValidation takes over
            check_val_every_n_epoch=None,
            num_sanity_val_steps=0,
            logger=CSVLogger(tmp_path, name="", version=""),
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            default_root_dir=tmp_path,
            callbacks=[callback, RecordEnd(str(tmp_path / "ends"))],
        )
    )
    # 7 windows: not divisible by 2, so padding (Lightning's sampler) and uneven shards (ours) both occur.
    data = TextDataModule(seq_len=16, batch_size=2, max_val_windows=7, val_batch_size=2)
    refusal = REFUSED.get((name, variant.get("mode"), strategy))
    if refusal:
        with pytest.raises(Exception, match=refusal):
            trainer.fit(GPTLightningModule(**TINY), data)
        return
    trainer.fit(GPTLightningModule(**TINY), data)
    ends = load_ends(tmp_path / "ends", 2)
    assert [e["error"] for e in ends] == [None, None]
    assert ends[0]["global_step"] == ends[1]["global_step"] and ends[0]["global_step"] in (2, 4)
    assert ends[0]["metrics"] == ends[1]["metrics"] or not own_validation  # ours: identical on every rank
    if own_validation:
        assert {"val_loss", "val_bpb", "val_time_s"} <= set(ends[0]["metrics"])
        mode = (
            variant["mode"]
            if variant["mode"] != "auto"
            else "distributed"
            if "fsdp2" in strategy
            else "rank_zero"
        )
        said = capfd.readouterr()
        assert f"({mode} validation of" in said.out + said.err  # the line names the mode that ran
    if name == "LossCurvePlot":
        assert (tmp_path / "loss_curve.png").stat().st_size > 0


# ---- rank-local code can never reach a collective ----------------------------------------------
class CollectiveInValidation(GPTLightningModule):
    """A user's validation_step that (wrongly, for rank-0 validation) gathers across ranks."""

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.all_gather(torch.ones(1))


@pytest.mark.timeout(120)
def test_rank_zero_validation_turns_a_user_collective_into_one_line(tmp_path):
    from distlab.cli.errors import refused_line as one_line_error

    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=make_strategy("ddp_optimizer_sync_spawn"),
        max_steps=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[distlab.callbacks.RankZeroValidation(every_n_steps=2, mode="rank_zero")],
    )
    from distlab.data import TextDataModule

    with pytest.raises(Exception) as info:  # a hang here would be killed by the timeout: a failure
        trainer.fit(
            CollectiveInValidation(**TINY), TextDataModule(seq_len=16, batch_size=2, max_val_windows=4)
        )
    line, code = one_line_error(info.value)
    assert code == 1 and "rank-0 validation failed" in line and "called the collective" in line, line


def test_sample_text_refuses_a_module_without_generate(tmp_path):
    from tests.user.user_module import UserClassifier, UserData

    trainer = L.Trainer(
        max_steps=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[distlab.callbacks.SampleText()],
    )
    with pytest.raises(Exception, match="SampleText samples from a language model"):
        trainer.fit(UserClassifier(), UserData())
