"""A LightningModule and DataModule written the way a user writes them (not distlab's), plus an independent oracle.

The module uses the common Lightning idioms at once: ``self.log`` of a per-batch mean (batch size
inferred), of a max and of a sum; a torchmetrics ``MetricCollection`` logged with ``log_dict``; a
metric computed and logged in ``on_validation_epoch_end``. Its optimizer is distlab's DistMuonAdamW on
``muon_param_groups``, with no gradient-sync mode given. ``perturb_by_rank`` makes every rank start
from different weights (a strategy must broadcast rank 0's).

The oracle (:func:`reference_run`) trains the same network with a plain PyTorch loop and torch's own
``torch.optim.Muon`` / ``torch.optim.AdamW`` on the concatenated batches, and computes every validation
value by hand over the whole validation set (accuracy and F1 with torchmetrics' functional API on all
samples at once): no distlab code on its path.
"""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MetricCollection, SumMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score
from torchmetrics.functional.classification import multiclass_accuracy, multiclass_f1_score
from torchmetrics.regression import MeanSquaredError

from distlab.optim import DistMuonAdamW, muon_param_groups

N_FEATURES, N_CLASSES, HIDDEN = 6, 3, 16
MUON = dict(lr=0.05, momentum=0.95, weight_decay=0.0)
ADAMW = dict(lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)


def make_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(N_FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, N_CLASSES),
    )


def make_data(n_train: int = 96, n_val: int = 7) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(N_FEATURES, N_CLASSES, generator=g)
    x = torch.randn(n_train + n_val, N_FEATURES, generator=g)
    y = (x @ w + 0.5 * torch.randn(n_train + n_val, N_CLASSES, generator=g)).argmax(-1)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


class UserClassifier(L.LightningModule):
    def __init__(self, perturb_by_rank: bool = False) -> None:
        super().__init__()
        self.perturb_by_rank = perturb_by_rank
        self.net = make_net()
        self.val_metrics = MetricCollection(
            {
                "acc": MulticlassAccuracy(N_CLASSES, average="micro"),
                "f1": MulticlassF1Score(N_CLASSES, average="macro"),
            },
            prefix="val_",
        )
        self.val_brier = MeanSquaredError()
        self.val_seen = SumMetric()  # how many samples were evaluated: 7, whatever the ranks

    def setup(self, stage: str) -> None:
        if self.perturb_by_rank and self.global_rank > 0:
            with torch.no_grad():
                for p in self.parameters():
                    p.add_(0.1 * self.global_rank)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        per_sample = F.cross_entropy(logits, y, reduction="none")
        self.log("val_loss", per_sample.mean())  # batch size inferred from the batch
        self.log("val_worst", per_sample.max(), reduce_fx="max")
        self.log("val_correct", (logits.argmax(-1) == y).sum().float(), reduce_fx="sum")
        self.val_metrics.update(logits, y)
        self.log_dict(self.val_metrics)
        self.val_brier.update(logits.softmax(-1), F.one_hot(y, N_CLASSES).float())
        self.val_seen.update(torch.tensor(float(len(y))))
        self.log("val_seen", self.val_seen)

    def on_validation_epoch_end(self):
        self.log("val_brier", self.val_brier.compute())
        self.val_brier.reset()

    def configure_optimizers(self):
        groups = muon_param_groups(self.net, adamw_lr=ADAMW["lr"], adamw_betas=ADAMW["betas"], **MUON)
        # bf16 Newton-Schulz, as torch.optim.Muon does: torch's optimizers are the test's oracle.
        return DistMuonAdamW(groups, ns_dtype=torch.bfloat16)


class UserData(L.LightningDataModule):
    def __init__(self, batch_size: int = 2, val_batch_size: int = 2) -> None:
        super().__init__()
        self.batch_size, self.val_batch_size = batch_size, val_batch_size
        x, y, vx, vy = make_data()
        self.train, self.val = TensorDataset(x, y), TensorDataset(vx, vy)

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=False)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.val_batch_size, shuffle=False)


# ---- the oracle ----------------------------------------------------------------------------------
def reference_validation(net: nn.Module) -> dict[str, float]:
    """Every value the module logs, by hand over all validation samples at once."""
    _, _, vx, vy = make_data()
    with torch.no_grad():
        logits = net(vx)
    per_sample = F.cross_entropy(logits, vy, reduction="none")
    probs, onehot = logits.softmax(-1), F.one_hot(vy, N_CLASSES).float()
    return {
        "val_loss": float(per_sample.mean()),
        "val_worst": float(per_sample.max()),
        "val_correct": float((logits.argmax(-1) == vy).sum()),
        "val_acc": float(multiclass_accuracy(logits, vy, N_CLASSES, average="micro")),
        "val_f1": float(multiclass_f1_score(logits, vy, N_CLASSES, average="macro")),
        "val_brier": float(((probs - onehot) ** 2).mean()),
        "val_seen": float(len(vy)),
    }


def reference_run(
    global_batch: int, steps: int, validate_at: list[int], shuffled: bool
) -> tuple[dict, dict[int, dict]]:
    """Plain PyTorch: torch.optim.Muon on the hidden matrices, AdamW on the rest, one process, the
    concatenated batches. Returns ({step: state_dict of the net} at each validation step and the last,
    {step: validation values}).

    ``shuffled``: the order Lightning's DistributedSampler gives the training set on several ranks
    (shuffle=True, seed 0, epoch 0); step i's ranks together hold samples [i*G, (i+1)*G) of it.
    """
    net = make_net()
    x, y, _, _ = make_data()
    if shuffled:
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
        x, y = x[order], y[order]
    hidden = [net[0].weight, net[2].weight]
    rest = [p for p in net.parameters() if all(p is not h for h in hidden)]
    muon = torch.optim.Muon(hidden, **MUON)
    adamw = torch.optim.AdamW(rest, **ADAMW)
    history, states = {}, {}
    for step in range(1, steps + 1):
        i = (step - 1) * global_batch
        loss = F.cross_entropy(net(x[i : i + global_batch]), y[i : i + global_batch])
        loss.backward()
        muon.step()
        adamw.step()
        muon.zero_grad()
        adamw.zero_grad()
        if step in validate_at:
            history[step] = reference_validation(net)
            states[step] = {k: v.detach().clone() for k, v in net.state_dict().items()}
    states[steps] = {k: v.detach().clone() for k, v in net.state_dict().items()}
    return states, history


def reference_stop_step(history: dict[int, dict], monitor: str, patience: int, last: int) -> int:
    """Where EarlyStopping(monitor, mode=min, patience) stops, from the oracle's own values."""
    best, wait = math.inf, 0
    for step in sorted(history):
        if history[step][monitor] < best:
            best, wait = history[step][monitor], 0
        else:
            wait += 1
            if wait >= patience:
                return step
    return last


class RecordValidations(L.Callback):
    """Every rank writes the val_* metrics it holds after each validation step, and its final weights."""

    def __init__(self, dirpath: str, steps: list[int]) -> None:
        self.dirpath, self.steps, self.seen = dirpath, list(steps), {}

    # Validation runs after the step's on_train_batch_end (where Lightning validates), so its metrics are read
    # at the start of the next batch, and at the end of training for the last step.
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._record(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self._record(trainer)

    def _record(self, trainer) -> None:
        step = trainer.global_step
        if step in self.steps and step not in self.seen:
            self.seen[step] = {
                k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")
            }

    def on_fit_end(self, trainer, pl_module) -> None:
        from torch.distributed.tensor import DTensor

        state = {
            k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
            for k, v in pl_module.net.state_dict().items()
        }
        Path(self.dirpath).mkdir(parents=True, exist_ok=True)
        out = {"history": self.seen, "state": state, "step": trainer.global_step}
        torch.save(out, Path(self.dirpath) / f"rank{trainer.global_rank}.pt")


def close(a: float, b: float, rel: float, abs_: float = 1e-7) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)
