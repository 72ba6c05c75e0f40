"""distlab à la carte on a user's own LightningModule and DataModule (tests/user/user_module.py).

Each run trains the user's classifier under one strategy on 2 or 3 CPU ranks with RankZeroValidation,
SyncEarlyStopping and ModelCheckpoint, and must equal the plain-PyTorch oracle: the final weights on
every rank, and every validation value at every validation step (7 validation samples in batches of 2,
so a padded sampler, a dropped partial batch or a last-batch value would show).
"""

from __future__ import annotations

from datetime import timedelta

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from distlab.callbacks import RankZeroValidation, SyncEarlyStopping
from tests.user.user_module import (
    RecordValidations,
    UserClassifier,
    UserData,
    close,
    reference_run,
    reference_stop_step,
)

STEPS, EVERY, BATCH = 6, 2, 2
VAL_STEPS = [2, 4, 6]
PATIENCE = 1  # the oracle's val_loss stops improving at step 4: every rank must stop there
PERTURB = True  # every rank starts from other weights: the strategy must broadcast rank 0s
# Validation values are computed from the same weights by a different summation order: float32 rounding.
# Weights: the distributed gradient average rounds differently, then bf16 Newton-Schulz (as torch's Muon).
VAL_RTOL, WEIGHT_ATOL = 1e-5, 1e-5


def fit(tmp_path, strategy: str, world: int, mode: str = "auto", accumulate: int = 1) -> list[dict]:
    from distlab.strategies import FSDP2Strategy, OptimizerSyncDDPStrategy

    if strategy == "ddp_spawn":
        import os

        from lightning.pytorch.strategies import DDPStrategy

        from tests.helpers.dist import free_port

        # Lightning's launcher reuses a MASTER_PORT left in the environment by an earlier fit in this process, whose
        # process group may still listen there (distlab's launcher checks; Lightning's does not): a port of its own
        os.environ["MASTER_PORT"] = str(free_port())
        strat = DDPStrategy(start_method="spawn", timeout=timedelta(seconds=60))
    elif strategy == "fsdp2_spawn":
        strat = FSDP2Strategy(start_method="forkserver", timeout=timedelta(seconds=60))
    else:
        strat = OptimizerSyncDDPStrategy(start_method="forkserver", timeout=timedelta(seconds=60))
    callbacks = [
        RankZeroValidation(every_n_steps=EVERY, mode=mode),
        SyncEarlyStopping(monitor="val_loss", patience=PATIENCE),
        RecordValidations(str(tmp_path / "ranks"), VAL_STEPS),
        ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val_acc", mode="max", save_top_k=1),
    ]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=strat,
        max_steps=STEPS,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=callbacks,
    )
    trainer.fit(UserClassifier(perturb_by_rank=PERTURB), UserData(batch_size=BATCH))
    return [torch.load(tmp_path / "ranks" / f"rank{r}.pt", weights_only=True) for r in range(world)]


def check_against_oracle(ranks: list[dict], world: int, accumulate: int = 1) -> None:
    ref_states, ref_history = reference_run(accumulate * world * BATCH, STEPS, VAL_STEPS, shuffled=True)
    stop = reference_stop_step(ref_history, "val_loss", PATIENCE, STEPS)
    if accumulate == 1:
        assert stop < STEPS, "the oracle no longer stops early: pick a patience or lr that exercises the stop"
    for r, out in enumerate(ranks):
        assert out["step"] == stop, f"rank {r} stopped at step {out['step']}, the oracle at {stop}"
        for name, ref in ref_states[stop].items():
            torch.testing.assert_close(
                out["state"][name], ref, atol=WEIGHT_ATOL, rtol=0, msg=f"rank {r} {name}"
            )
        torch.testing.assert_close(out["state"], ranks[0]["state"], atol=0, rtol=0)  # ranks bit-identical
        expected_steps = [s for s in VAL_STEPS if s <= stop]
        assert sorted(out["history"]) == expected_steps, f"rank {r} validated at {sorted(out['history'])}"
        for step in expected_steps:
            got = out["history"][step]
            for name, value in ref_history[step].items():
                assert close(got[name], value, rel=VAL_RTOL, abs_=1e-6), (r, step, name, got[name], value)
            assert got["val_time_s"] > 0


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "strategy,world,mode,accumulate",
    [
        ("ddp_optimizer_sync_spawn", 2, "auto", 1),
        ("ddp_optimizer_sync_spawn", 3, "distributed", 2),
        ("ddp_spawn", 2, "distributed", 1),
        ("ddp_spawn", 3, "auto", 2),
        ("fsdp2_spawn", 2, "auto", 1),
        ("fsdp2_spawn", 3, "auto", 1),
    ],
)
def test_user_module_equals_plain_pytorch_oracle(tmp_path, monkeypatch, strategy, world, mode, accumulate):
    """accumulate=2: gradient accumulation on N ranks == one process on batches 2N times as large (under
    ddp_optimizer_sync the optimizer syncs once per step: accumulation costs no communication)."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # the DistributedSampler's shuffle seed, as in the oracle
    ranks = fit(tmp_path, strategy, world, mode, accumulate)
    check_against_oracle(ranks, world, accumulate)
    assert list((tmp_path / "ckpt").iterdir()), "ModelCheckpoint saved nothing"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("accumulate", [1, 2])
def test_one_process_is_the_oracle(tmp_path, accumulate):
    """One process, no strategy: Lightning + distlab equal the plain loop (weights to float rounding)."""
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[
            RankZeroValidation(every_n_steps=EVERY),
            RecordValidations(str(tmp_path / "ranks"), VAL_STEPS),
        ],
    )
    trainer.fit(UserClassifier(), UserData(batch_size=BATCH))
    out = torch.load(tmp_path / "ranks" / "rank0.pt", weights_only=True)
    ref_states, ref_history = reference_run(accumulate * BATCH, STEPS, VAL_STEPS, shuffled=False)
    for name, ref in ref_states[STEPS].items():
        torch.testing.assert_close(out["state"][name], ref, atol=1e-6, rtol=0)
    for step, ref in ref_history.items():
        for name, value in ref.items():
            assert close(out["history"][step][name], value, rel=VAL_RTOL), (step, name)
