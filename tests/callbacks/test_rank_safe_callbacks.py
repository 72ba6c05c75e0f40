"""Rank-0 validation, synchronized early stopping, NaN stops and safe checkpoints on real gloo ranks."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from distlab.callbacks import RankZeroValidation, SyncEarlyStopping
from distlab.checkpoint import load_gpt
from distlab.data import TextDataModule
from distlab.modules import GPTLightningModule
from distlab.strategies import OptimizerSyncDDPStrategy
from tests.helpers.callbacks import RecordEnd, load_ends, load_last_steps_started
from tests.helpers.modules import NaNOnRankModule, ScriptedValLossModule

TINY = dict(depth=1, aspect_ratio=32, head_dim=16, sequence_len=16)


def datamodule(val_windows: int = 8) -> TextDataModule:
    return TextDataModule(seq_len=16, batch_size=2, max_val_windows=val_windows, val_batch_size=3)


def trainer(tmp_path: Path, world: int, callbacks: list, max_steps: int, **kwargs) -> L.Trainer:
    strategy = (
        "auto"
        if world == 1
        else OptimizerSyncDDPStrategy(start_method="forkserver", timeout=timedelta(seconds=60))
    )
    defaults = dict(
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
    )
    return L.Trainer(**{**defaults, **kwargs}, callbacks=callbacks)


# ---- synchronized early stopping -----------------------------------------------------------------
# (world, rank-0 script, patience, expected stop step with validation every 2 steps)
STOP_CASES = [
    (2, [5.0, 4.0, 4.5, 4.2, 4.1, 3.0], 2, 8),  # best 4.0 at step 4; steps 6, 8 do not improve -> stop at 8
    (3, [3.0, 2.0, 1.0, 1.5, 1.2, 1.1], 3, 12),
    (2, [1.0, 1.0, 1.0, 1.0], 1, 4),  # no improvement at the 2nd validation -> stop at 4
]


@pytest.mark.timeout(400)
def test_ranks_with_different_or_missing_metrics_stop_together(tmp_path):
    # Rank 1 never has val_loss, rank 2 always improves: only rank 0's decision may count, on every rank.
    # Three runs (different worlds and scripts) to catch ordering races.
    for i, (world, script, patience, expected) in enumerate(STOP_CASES):
        out = tmp_path / f"run{i}"
        stop = SyncEarlyStopping(monitor="val_loss", patience=patience, mode="min")
        model = ScriptedValLossModule(script, every=2, **TINY)
        t = trainer(
            out,
            world,
            [stop, RecordEnd(str(out))],
            max_steps=40,
            val_check_interval=2,
            limit_val_batches=1,
            enable_checkpointing=False,
        )
        t.fit(model, datamodule())
        ends = load_ends(out, world)
        assert [e["global_step"] for e in ends] == [expected] * world, (script, ends)
        assert all(e["error"] is None for e in ends)


@pytest.mark.timeout(300)
def test_early_stopping_state_survives_resume(tmp_path):
    script = [5.0, 4.0, 4.5, 4.6, 4.7, 4.8, 4.9]  # best at step 4; patience 3 -> stop at step 10

    def run(name: str, ckpt_path: str | None = None) -> tuple[int, SyncEarlyStopping]:
        stop = SyncEarlyStopping(monitor="val_loss", patience=3, mode="min")
        # Saved at validation end, i.e. after that step's early-stopping decision.
        ckpt = ModelCheckpoint(
            dirpath=tmp_path / "ckpt", save_top_k=-1, filename="{step}", save_on_train_epoch_end=False
        )
        t = trainer(tmp_path / name, 1, [stop, ckpt], max_steps=40, val_check_interval=2, limit_val_batches=1)
        t.fit(ScriptedValLossModule(script, every=2, **TINY), datamodule(), ckpt_path=ckpt_path)
        return t.global_step, stop

    full_step, _ = run("full")
    assert full_step == 10
    resumed_step, stop = run("resumed", str(tmp_path / "ckpt" / "step=6.ckpt"))
    assert resumed_step == 10, "patience counter was not restored from the checkpoint"
    assert stop.best_score.item() == 4.0 and stop.stopped_step == 10


# ---- exact validation ------------------------------------------------------------------------------
def hand_metrics(model: torch.nn.Module, dataset) -> dict[str, float]:
    """The oracle, without distlab's code: cross-entropy summed by hand over every window of ``dataset``."""
    nats = tokens = byte_nats = n_bytes = 0.0
    with torch.no_grad():
        for i in range(len(dataset)):
            x, y = dataset[i]
            logits = model(x[None])[0]  # (T, V)
            per_token = torch.nn.functional.cross_entropy(logits.double(), y, reduction="none")
            nats += float(per_token.sum())
            tokens += y.numel()
            byte_nats += float(per_token[y < 256].sum())
            n_bytes += float((y < 256).sum())
    loss = nats / tokens
    return {"val_loss": loss, "val_ppl": math.exp(loss), "val_bpb": byte_nats / n_bytes / math.log(2)}


def sensitive_gpt() -> GPTLightningModule:
    """A GPT whose per-window losses spread (an untrained one predicts ~uniformly: every window ~ln 257)."""
    torch.manual_seed(0)
    module = GPTLightningModule(**TINY)
    with torch.no_grad():
        module.model.lm_head.weight.normal_(0.0, 2.0)
    return module


def _exact_metrics_job(rank: int, world: int) -> dict:
    from torch.utils.data import DataLoader, DistributedSampler, Subset

    from distlab.callbacks.exact_eval import EvalData, ExactEvaluator

    module = sensitive_gpt()
    dataset = datamodule(val_windows=20).val_dataset()  # 20 windows: not divisible by 3 (padding shows)
    data = EvalData(dataset, batch_size=3)
    out = {
        mode: ExactEvaluator(module, "validation", data, mode).run() for mode in ("rank_zero", "distributed")
    }
    # What Lightning's own loop does: a DistributedSampler (pads with duplicates), states summed by torchmetrics.
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
    module.val_metrics.reset()
    with torch.no_grad():
        for x, y in DataLoader(Subset(dataset, list(sampler)), batch_size=3):
            module.validation_step((x, y), 0)
    out["padded"] = {
        f"val_{k}": float(v) for k, v in module.val_metrics.compute().items()
    }  # torchmetrics syncs
    out["n_padded"] = len(list(sampler)) * world
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 3])
def test_rank_zero_and_distributed_validation_equal_one_process(world):
    from distlab.testing import run_distributed

    dataset = datamodule(val_windows=20).val_dataset()
    reference = hand_metrics(sensitive_gpt().model, dataset)
    # Sensitivity: one window more or less moves the metric far beyond the tolerance used below.
    one_less = hand_metrics(sensitive_gpt().model, torch.utils.data.Subset(dataset, range(19)))
    assert abs(one_less["val_bpb"] - reference["val_bpb"]) > 1e-3 * reference["val_bpb"]

    results = run_distributed(_exact_metrics_job, world, timeout=150)
    for res in results:
        for mode in ("rank_zero", "distributed"):
            for k, v in reference.items():
                assert res[mode][k] == pytest.approx(v, rel=1e-6), (mode, k)
            assert res[mode]["val_time_s"] > 0  # it ran, and its cost is reported
    padded = results[0]["padded"]
    if results[0]["n_padded"] > len(dataset):  # 20 windows on 3 ranks: 21 evaluated, one twice
        assert abs(padded["val_bpb"] - reference["val_bpb"]) > 1e-4 * reference["val_bpb"], (
            "padding duplicates should bias the metric"
        )
    else:  # 20 windows on 2 ranks: no padding, same numbers
        assert padded["val_bpb"] == pytest.approx(reference["val_bpb"], rel=1e-6)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["rank_zero", "distributed"])
def test_model_checkpoint_on_rank_zero_metric_two_ranks(tmp_path, mode):
    val = RankZeroValidation(every_n_steps=2, mode=mode)
    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "ckpt",
        monitor="val_bpb",
        mode="min",
        save_top_k=1,
        save_last=True,
        filename="best-{step}",
    )
    t = trainer(tmp_path, 2, [val, ckpt, RecordEnd(str(tmp_path / "ends"))], max_steps=8)
    t.fit(GPTLightningModule(**TINY, warmup_steps=0), datamodule())
    ends = load_ends(tmp_path / "ends", 2)
    assert ends[0]["metrics"] == ends[1]["metrics"]  # every rank received the same results
    assert set(ends[0]["metrics"]) >= {"val_loss", "val_bpb", "val_ppl"}
    best = sorted((tmp_path / "ckpt").glob("best-*.ckpt"))
    assert len(best) == 1
    # The best checkpoint's own weights, validated in one process, reproduce its recorded score.
    ckpt_data = torch.load(best[0], weights_only=True)
    score = [v for k, v in ckpt_data["callbacks"].items() if k.startswith("ModelCheckpoint")][0][
        "best_model_score"
    ]
    model = load_gpt(best[0])
    assert hand_metrics(model, datamodule().val_dataset())["val_bpb"] == pytest.approx(float(score), rel=1e-5)


# A long rank-0 validation and the wait group: tests/distributed/test_rank_local.py (no timing race).


# ---- non-finite loss ----------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_nan_on_rank_one_stops_every_rank_at_that_step(tmp_path):
    bad_step = 5
    stop = SyncEarlyStopping(monitor="val_loss", strict=False)
    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_last=True, save_top_k=-1, filename="{step}"
    )
    t = trainer(tmp_path, 2, [stop, ckpt, RecordEnd(str(tmp_path / "ends"))], max_steps=20)
    with pytest.raises(Exception, match=f"non-finite loss on rank 1 at step {bad_step}"):
        t.fit(NaNOnRankModule(bad_rank=1, bad_step=bad_step, **TINY), datamodule())
    # Both ranks started step 5 and neither went on to step 6: they stopped together.
    assert load_last_steps_started(tmp_path / "ends", 2) == [bad_step, bad_step]
    last = tmp_path / "ckpt" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 4  # written before the NaN, not after
    model = load_gpt(last)
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ---- atomic checkpoints ---------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_crash_during_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch):
    from fsspec.implementations.local import LocalFileOpener

    t = trainer(tmp_path, 1, [], max_steps=2, limit_val_batches=0)
    t.fit(GPTLightningModule(**TINY), datamodule())
    path = tmp_path / "last.ckpt"
    t.save_checkpoint(path)
    before = path.read_bytes()

    def dying_write(self, data):  # half the bytes reach the disk, then the machine "dies"
        LocalFileOpener.__dict__["_orig_write"](self, data[: len(data) // 2])
        raise OSError("simulated crash during checkpoint write")

    monkeypatch.setattr(LocalFileOpener, "_orig_write", LocalFileOpener.write, raising=False)
    monkeypatch.setattr(LocalFileOpener, "write", dying_write)
    with pytest.raises(OSError, match="simulated crash"):
        t.save_checkpoint(path)
    monkeypatch.undo()
    assert path.read_bytes() == before  # the previous checkpoint is intact ...
    assert load_gpt(path) is not None  # ... and loadable
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
        "last.ckpt"
    ]  # no half-written leftovers


# FSDP2 (uneven shards, a refused rank_zero mode): tests/matrix/test_callback_matrix.py and tests/user/.


@pytest.mark.timeout(120)
def test_fast_dev_run_validates_only_its_batches(tmp_path):
    """fast_dev_run=2 evaluates the first 2 batches, as Lightning's own loop would."""
    from torch.utils.data import Subset

    val = RankZeroValidation(mode="rank_zero")
    record = RecordEnd(str(tmp_path))
    t = L.Trainer(
        fast_dev_run=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[val, record],
    )
    module = sensitive_gpt()
    dm = datamodule(val_windows=20)  # val batches of 3: fast_dev_run=2 -> windows 0..5
    t.fit(module, dm)
    got = load_ends(tmp_path, 1)[0]["metrics"]
    dataset = dm.val_dataset()
    first_two = hand_metrics(module.model, Subset(dataset, range(6)))
    assert got["val_loss"] == pytest.approx(first_two["val_loss"], rel=1e-6)
    assert got["val_loss"] != pytest.approx(hand_metrics(module.model, dataset)["val_loss"], rel=1e-3)
