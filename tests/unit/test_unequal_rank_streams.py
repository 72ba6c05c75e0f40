"""Streamed per-rank data of unequal length: rank 0 says, once per epoch, which rank ran out, after which batch and
at which step, in every fit the strategy runs (a resume that starts in a later epoch included). The two ranks'
exchanges are replaced by what they would return; the strategy's own per-batch logic runs as is."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from distlab.strategies import base


class _Lightning:  # the hooks a Lightning strategy provides under the mixin
    def on_train_start(self) -> None:
        pass

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        pass


class _Strategy(base.DistlabStrategyMixin, _Lightning):
    pass


def test_the_rank_that_ran_out_is_told_once_per_epoch_in_every_fit(monkeypatch):
    told: list[str] = []
    monkeypatch.setattr(base, "info_rank0", told.append)
    monkeypatch.setattr(base, "gather_objects", lambda mine: [mine, mine])  # two ranks, both streams
    monkeypatch.setattr(base, "cpu_group", lambda: None)
    monkeypatch.setattr(base, "all_gather", lambda t, group: torch.tensor([0, 1]))  # rank 1 is at its last
    progress = SimpleNamespace(is_last_batch=False)
    trainer = SimpleNamespace(
        num_training_batches=float("inf"),
        train_dataloader=None,
        global_step=0,
        accumulate_grad_batches=1,
        current_epoch=0,
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
    )
    strategy = _Strategy()
    strategy.lightning_module = SimpleNamespace(trainer=trainer)
    for epoch, step in ((1, 7), (1, 8), (2, 11)):  # a fit resumed in epoch 1
        trainer.current_epoch, trainer.global_step = epoch, step
        if step == 7:
            strategy.on_train_start()
        progress.is_last_batch = False
        strategy.on_train_batch_start(None, 2)
        assert progress.is_last_batch  # every rank ends the epoch here
    assert [line.split(" while")[0] for line in told] == [
        "distlab: rank 1's training data ran out after batch 3 of epoch 1 (step 8)",
        "distlab: rank 1's training data ran out after batch 3 of epoch 2 (step 12)",
    ]
