"""What the shipped modules log and how the shipped samplers deal data, against oracles computed by hand.

Each claim is checked where the shortcut that would break it shows: an imbalanced validation set (macro and micro
accuracy differ there), a last batch smaller than the others (an unweighted mean of batch losses differs), a second
epoch (a permutation computed once would repeat the first), a resume inside it.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from distlab.data import MicroShards
from distlab.modules import ImageClassifier


def test_the_classifier_logs_the_share_of_samples_it_classifies_right():
    """val_acc is (argmax == label) over every sample, val_loss the cross-entropy over every sample: on an imbalanced
    set with a short last batch, where per-class (macro) accuracy and a mean of batch means would differ."""
    torch.manual_seed(0)
    module = ImageClassifier(width=4)
    labels = torch.tensor([0] * 40 + [1] * 3 + [2] * 2 + [3] * 1)  # imbalanced: 46 samples
    images = torch.randn(len(labels), 1, 8, 8)
    with torch.no_grad():
        logits = module(images)
    hits = logits.argmax(-1) == labels
    per_class = torch.stack([hits[labels == c].float().mean() for c in labels.unique()])
    assert abs(per_class.mean() - hits.float().mean()) > 0.05, (
        "the set does not tell micro from macro accuracy"
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    loader = DataLoader(TensorDataset(images, labels), batch_size=7)  # 6 batches of 7, then 4
    (logged,) = trainer.validate(module, dataloaders=loader, verbose=False)
    assert logged["val_acc"] == hits.float().mean().item()
    assert abs(logged["val_loss"] - F.cross_entropy(logits, labels).item()) < 1e-6


def _batches(
    shards: MicroShards, steps: int, world: int, micro_shards: int, start: int = 0
) -> list[list[int]]:
    """The sample ids each step gives, all ranks together, from micro step ``start`` (a fresh sampler per rank)."""
    per_rank = micro_shards // world
    out = []
    ranks = []
    for rank in range(world):
        s = MicroShards(shards.dataset, batch_size=shards.batch_size, seed=shards.seed)
        s.configure(micro_shards, rank, world, start_micro_step=start * per_rank)
        ranks.append(iter(s))
    for _ in range(steps):
        out.append(sorted(int(i) for it in ranks for _ in range(per_rank) for i in next(it)[0]))
    return out


def test_micro_shards_deal_a_new_permutation_each_epoch_and_resume_inside_it():
    """Each epoch's steps cover every sample once (all ranks together), the next epoch in another order, and a
    sampler started at a step inside epoch 1 (a resume) gives what the running one gives there - at 1, 2 and 4
    ranks."""
    n, batch, shards = 48, 3, 4  # a global batch of 12: 4 steps per epoch
    dataset = TensorDataset(torch.arange(n))
    for world in (1, 2, 4):
        sampler = MicroShards(dataset, batch_size=batch, seed=7)
        steps = _batches(sampler, 8, world, shards)
        epoch0, epoch1 = steps[:4], steps[4:]
        assert sorted(i for s in epoch0 for i in s) == list(range(n)), world
        assert sorted(i for s in epoch1 for i in s) == list(range(n)), world
        assert epoch0 != epoch1, f"{world} ranks: epoch 1 repeats epoch 0's order"
        assert _batches(sampler, 3, world, shards, start=5) == steps[5:8], (
            f"{world} ranks: a resume at step 5 differs"
        )
