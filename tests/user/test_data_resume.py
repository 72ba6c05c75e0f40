"""A user's own training loader resumes mid-epoch exactly when it can (torchdata's StatefulDataLoader with its
StatefulDistributedSampler, on 2 ranks: fit 6 steps == fit 3, checkpoint, resume to 6, bit for bit), and a resume
that cannot continue its data exactly says so in one line (DataResumeCheck; the distlab command adds it to every
fit): a plain DataLoader, or a StatefulDataLoader whose sampler is Lightning's plain DistributedSampler."""

from __future__ import annotations

from datetime import timedelta

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from distlab.callbacks import DataResumeCheck
from distlab.strategies import OptimizerSyncDDPStrategy
from tests.user.stateful_data import ShuffledData
from tests.user.user_module import UserClassifier

STRATEGY = OptimizerSyncDDPStrategy


def _trainer(tmp, steps: int, callbacks: list, save_at: int | None, world: int = 1, accumulate: int = 1):
    """A quiet CPU Trainer without validation; ``save_at``: a checkpoint every that many steps, all kept."""
    L.seed_everything(0)
    if save_at:
        callbacks = [
            *callbacks,
            ModelCheckpoint(dirpath=tmp / "ckpt", every_n_train_steps=save_at, save_top_k=-1),
        ]
    strategy = STRATEGY(start_method="forkserver", timeout=timedelta(seconds=60)) if world > 1 else "auto"
    return L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        max_steps=steps,
        accumulate_grad_batches=accumulate,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp,
        callbacks=callbacks,
    )


def _fit(tmp, steps: int, stateful: bool, world: int, ckpt: str | None = None, save_at: int | None = None):
    trainer = _trainer(tmp, steps, [DataResumeCheck()], save_at, world=world)
    module = UserClassifier()
    trainer.fit(module, ShuffledData(stateful), ckpt_path=ckpt)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.timeout(240)
def test_a_stateful_loader_resumes_mid_epoch_bit_for_bit_on_two_ranks(tmp_path, capfd):
    whole = _fit(tmp_path / "whole", 6, stateful=True, world=2)
    _fit(tmp_path / "first", 3, stateful=True, world=2, save_at=3)
    (ckpt,) = (tmp_path / "first" / "ckpt").glob("*step=3.ckpt")
    resumed = _fit(tmp_path / "resumed", 6, stateful=True, world=2, ckpt=str(ckpt))
    assert all(torch.equal(whole[k], resumed[k]) for k in whole), "the resumed run saw other batches"
    assert "cannot resume mid-epoch" not in capfd.readouterr().err


@pytest.mark.timeout(120)
def test_a_loader_that_cannot_resume_says_so(tmp_path, caplog):
    import logging

    whole = _fit(tmp_path / "whole", 6, stateful=False, world=1)
    _fit(tmp_path / "first", 3, stateful=False, world=1, save_at=3)
    (ckpt,) = (tmp_path / "first" / "ckpt").glob("*step=3.ckpt")
    with caplog.at_level(logging.INFO):
        resumed = _fit(tmp_path / "resumed", 6, stateful=False, world=1, ckpt=str(ckpt))
    assert "resuming mid-epoch at step 3 (epoch 0), but the training DataLoader cannot resume" in caplog.text
    assert not all(torch.equal(whole[k], resumed[k]) for k in whole), (
        "the control: its epoch really restarted"
    )


def test_which_loaders_resume_exactly():
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    from distlab.callbacks.preemption import resume_gap
    from distlab.data.windows import TrainWindows

    data = TensorDataset(torch.arange(8.0))
    assert resume_gap(StatefulDataLoader(data, batch_size=2, shuffle=True)) is None
    plain_sampler = DistributedSampler(data, num_replicas=2, rank=0)
    assert "DistributedSampler (Lightning's" in resume_gap(StatefulDataLoader(data, sampler=plain_sampler))
    stateful_sampler = StatefulDistributedSampler(data, num_replicas=2, rank=0)
    assert resume_gap(StatefulDataLoader(data, sampler=stateful_sampler)) is None
    assert "cannot resume mid-epoch" in resume_gap(DataLoader(data))
    windows = TrainWindows.__new__(TrainWindows)  # distlab's stream: its position is a function of the step
    assert resume_gap(DataLoader(windows, batch_size=None)) is None


class _Batches(L.Callback):
    """Every training batch's tokens, in the order the fit fetched them."""

    def __init__(self):
        self.seen: list[list[int]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append(batch[0].flatten().tolist())


def _fit_text(tmp, steps: int, accumulate: int, ckpt=None, save_at=None):
    from distlab.data import TextDataModule
    from distlab.modules import GPTLightningModule
    from distlab.testing import TINY_GPT

    batches = _Batches()
    trainer = _trainer(tmp, steps, [batches], save_at, accumulate=accumulate)
    module = GPTLightningModule(**TINY_GPT)
    data = TextDataModule(seq_len=TINY_GPT["sequence_len"], batch_size=2)
    trainer.fit(module, data, ckpt_path=ckpt)
    return batches.seen, {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("accumulate", [1, 2, 3])
def test_distlabs_data_resumes_where_it_stopped_under_gradient_accumulation(tmp_path, accumulate):
    """Fit 4 optimizer steps of `accumulate` micro-batches each, saving at step 2; resume that checkpoint to 4: the
    resumed fit fetches exactly the batches the uninterrupted one fetched after step 2 (none replayed, none
    skipped), and the weights end bit-identical."""
    whole, whole_weights = _fit_text(tmp_path / "whole", 4, accumulate, save_at=2)
    ckpt = next(p for p in (tmp_path / "whole" / "ckpt").glob("*.ckpt") if "step=2" in p.name)
    resumed, resumed_weights = _fit_text(tmp_path / "resumed", 4, accumulate, ckpt=str(ckpt))
    assert len(whole) == 4 * accumulate
    assert resumed == whole[2 * accumulate :], (
        "the resumed fit fetched other batches than the uninterrupted one"
    )
    for k in whole_weights:
        assert torch.equal(whole_weights[k], resumed_weights[k]), k


@pytest.mark.timeout(240)
def test_a_resume_over_data_of_the_same_tokens_in_other_shards_says_so(tmp_path, caplog):
    """The same 6,000 training tokens, first in one shard, then in two: no data setting and no token count changed,
    yet windows never cross a shard, so the resumed stream's window ids name other windows. The checkpoint's draw
    plan counts the windows, and the resume says the data changed; resumed over the same shards it says nothing."""
    import logging

    import numpy as np

    from distlab.data import TextDataModule
    from distlab.data.corpus import write_bin_shard
    from distlab.modules import GPTLightningModule
    from distlab.testing import TINY_GPT

    tokens = np.arange(6000) % 251
    one, two = tmp_path / "one", tmp_path / "two"
    for folder in (one, two):
        folder.mkdir()
        write_bin_shard(folder / "val_000.bin", tokens[:600])
    write_bin_shard(one / "train_000.bin", tokens)
    write_bin_shard(two / "train_000.bin", tokens[:3000])
    write_bin_shard(two / "train_001.bin", tokens[3000:])

    def fit(folder, run, steps, ckpt=None):
        trainer = _trainer(tmp_path / run, steps, [DataResumeCheck()], save_at=2 if ckpt is None else None)
        data = TextDataModule(paths=[str(folder)], seq_len=TINY_GPT["sequence_len"], batch_size=2)
        trainer.fit(GPTLightningModule(**TINY_GPT), data, ckpt_path=ckpt)

    fit(one, "first", 2)
    (ckpt,) = (tmp_path / "first" / "ckpt").glob("*step=2.ckpt")
    assert torch.load(ckpt, weights_only=False)[DataResumeCheck.CHECKPOINT_KEY].endswith(
        " from 5,968 windows"
    )
    with caplog.at_level(logging.INFO):
        fit(one, "same", 3, ckpt=str(ckpt))
    assert "the checkpoint's run drew" not in caplog.text
    with caplog.at_level(logging.INFO):
        fit(two, "other", 3, ckpt=str(ckpt))
    assert (
        "the training data holds 5,936 windows, and the checkpoint's run drew from 5,968 windows (the dataset "
        "changed): the data does not continue exactly where that run was"
    ) in caplog.text
