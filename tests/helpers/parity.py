"""The Lightning-parity matrix's user module, data, features and the rank job that runs its fits.

A *feature* is what a user turns on (Trainer flags, callbacks, a kind of data or module); each one is a
:class:`Feature` entry in :data:`FEATURES`, each strategy under test an entry in :data:`STRATEGIES`. The
oracle is Lightning's own ``ddp`` (DDPStrategy: the DDP wrapper averages the gradients in backward, and
DistMuonAdamW detects that by itself). :func:`parity_job` runs on 2 gloo ranks (``distlab.testing.run_distributed``)
and fits, in the one process group, every selected feature under the oracle and every strategy: Lightning
sees processes launched from outside (``LOCAL_RANK`` set, as under torchrun) and reuses the group, so a fit
costs its Trainer, not a process start. The ``*_spawn`` strategies differ from these only in the launcher.

The module is written the way a user writes one (tests/user/user_module.py's idioms): a BatchNorm (buffers
that differ per rank and per batch), a data-independent buffer, ``self.log`` with ``sync_dist=True``,
DistMuonAdamW on ``muon_param_groups`` with no gradient-sync mode given. Every rank starts from other
weights and buffers (``perturb``): a strategy must broadcast rank 0's.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

N_IN, HIDDEN, N_OUT = 6, 16, 3
BATCH = 4  # per rank
WORLD = 2
ORACLE = "ddp"
# The strategies under test (their popen variants: the ranks exist already; see the module docstring).
STRATEGIES = ["ddp_optimizer_sync", "fsdp2"]


# ---- the user's module and data -------------------------------------------------------------------------
class ParityNet(nn.Module):
    def __init__(self, batchnorm: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("input_scale", torch.ones(N_IN))  # a buffer no batch changes
        self.fc1 = nn.Linear(N_IN, HIDDEN, bias=False)  # a bias before BatchNorm has no gradient to speak of
        self.bn = nn.BatchNorm1d(HIDDEN) if batchnorm else nn.Identity()
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, N_OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn(self.fc1(x * self.input_scale)))
        return self.head(F.relu(self.fc2(h)))


class ParityModule(L.LightningModule):
    """A user's classifier. ``manual``: manual optimization (with ``manual_clip`` norm clipping through
    ``self.clip_gradients``); ``scheduler``: None, "step" or "epoch" (the LR scheduler's interval)."""

    def __init__(
        self,
        batchnorm: bool = True,
        manual: bool = False,
        manual_clip: float | None = None,
        scheduler: str | None = None,
        perturb: bool = True,
        lr: float = 0.05,
        max_grad_norm: float | None = None,
    ) -> None:
        super().__init__()
        self.net = ParityNet(batchnorm)
        self.max_grad_norm = max_grad_norm  # the optimizer's own global-norm clip
        self.manual, self.manual_clip, self.scheduler = manual, manual_clip, scheduler
        self.perturb, self.lr = perturb, lr
        self.automatic_optimization = not manual
        # (global norm, max |g|) of the gradients clipping sees, per step, before it clips
        self.grad_stats: list[tuple[float, float]] = []

    def setup(self, stage: str) -> None:
        if self.perturb and self.global_rank > 0:
            with torch.no_grad():
                for t in [*self.parameters(), *self.buffers()]:
                    if t.is_floating_point():
                        t.add_(0.1 * self.global_rank)

    @staticmethod
    def _xy(batch):
        return (batch["x"], batch["y"]) if isinstance(batch, dict) else batch

    def training_step(self, batch, batch_idx):
        x, y = self._xy(batch)
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        if not self.manual:
            return loss
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        self._grad_stats()
        if self.manual_clip:
            self.clip_gradients(opt, gradient_clip_val=self.manual_clip, gradient_clip_algorithm="norm")
        opt.step()
        sched = self.lr_schedulers()
        if sched is not None:
            sched.step()
        return None

    def on_before_optimizer_step(self, optimizer) -> None:  # before Lightning clips (automatic optimization)
        if self.automatic_optimization:
            self._grad_stats()

    def _grad_stats(self) -> None:
        """What clipping will see (under ddp the averaged gradients): shows whether a clip threshold is reached."""
        from torch.distributed.tensor import DTensor

        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads and not any(isinstance(g, DTensor) for g in grads):
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
            self.grad_stats.append((float(norm), max(float(g.abs().max()) for g in grads)))

    def validation_step(self, batch, batch_idx):
        x, y = self._xy(batch)
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(-1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        from distlab.optim import DistMuonAdamW, muon_param_groups

        groups = muon_param_groups(self.net, lr=self.lr, adamw_lr=0.01, verbose=False)
        # fp32 Newton-Schulz: the same rounding on every host, so parity is tight (bf16 would round each step)
        opt = DistMuonAdamW(groups, ns_dtype="float32", max_grad_norm=self.max_grad_norm)
        if self.scheduler is None:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": self.scheduler}}


def make_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N_IN, N_OUT, generator=g)
    x = torch.randn(n, N_IN, generator=g) * 2 + 0.5
    y = (x @ w + 0.5 * torch.randn(n, N_OUT, generator=g)).argmax(-1)
    return x, y


class PairDataset(Dataset):
    """(x, y) samples; ``dict_collate`` turns a list of them into {"x": (B, N_IN), "y": (B,)}."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def dict_collate(samples: list) -> dict[str, torch.Tensor]:
    return {"x": torch.stack([s[0] for s in samples]), "y": torch.stack([s[1] for s in samples])}


def sampler_order(n: int, epoch: int) -> torch.Tensor:
    """The order Lightning's DistributedSampler gives a training set (it always shuffles training data, seeded by
    PL_GLOBAL_SEED, 0 here, plus the epoch); rank r takes every WORLD-th sample from r, so step i's ranks together
    hold samples [i*WORLD*BATCH, (i+1)*WORLD*BATCH) of it."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(epoch))


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class RankStream(IterableDataset):
    """Each rank streams its own samples (no sampler: Lightning leaves an IterableDataset alone); rank r yields
    ``lengths[r]`` samples of its share (its whole share: ``lengths`` None)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, lengths: list[int] | None = None) -> None:
        self.x, self.y, self.lengths = x, y, lengths

    def __iter__(self):
        rank = _rank()
        n = len(self.x) // WORLD if self.lengths is None else self.lengths[rank]
        mine = sampler_order(len(self.x), epoch=0)[rank::WORLD]  # what the DistributedSampler gives this rank
        for j in mine[:n].tolist():
            yield self.x[j], self.y[j]


class ParityData(L.LightningDataModule):
    """``kind``: "tensor" (a TensorDataset, Lightning's DistributedSampler), "dict" (dict batches from a
    custom collate_fn, training and validation), "stream" (an IterableDataset, each rank its own samples),
    "per_rank" (a map-style dataset per rank, no distributed sampler). ``lengths``: samples per rank
    ("stream", "per_rank")."""

    def __init__(
        self,
        kind: str = "tensor",
        n_train: int = 48,
        lengths: list[int] | None = None,
        one_process_epochs: int = 0,
    ) -> None:
        super().__init__()
        self.kind, self.lengths, self.batch_size = kind, lengths, BATCH
        self.x, self.y = make_data(n_train, seed=1)
        if one_process_epochs:  # one process: the ranks' global batches in their order, epoch after epoch
            order = torch.cat([sampler_order(n_train, e) for e in range(one_process_epochs)])
            self.x, self.y, self.batch_size = self.x[order], self.y[order], BATCH * WORLD
        self.vx, self.vy = make_data(10, seed=2)

    def train_dataloader(self):
        if self.kind == "tensor":
            return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size)
        if self.kind == "dict":
            return DataLoader(PairDataset(self.x, self.y), batch_size=BATCH, collate_fn=dict_collate)
        if self.kind == "stream":
            return DataLoader(RankStream(self.x, self.y, self.lengths), batch_size=BATCH)
        rank = _rank()
        idx = torch.arange(rank, len(self.x), WORLD)[: self.lengths[rank]]
        return DataLoader(TensorDataset(self.x[idx], self.y[idx]), batch_size=BATCH)

    def val_dataloader(self):
        if self.kind == "dict":
            return DataLoader(PairDataset(self.vx, self.vy), batch_size=3, collate_fn=dict_collate)
        return DataLoader(TensorDataset(self.vx, self.vy), batch_size=3)


# ---- the features ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Feature:
    """One row of the matrix.

    trainer / module / data: keyword arguments over the defaults (Trainer, ParityModule, ParityData).
    callbacks: names of :func:`make_callbacks` entries. refused: {strategy: what its one-line refusal says}: a
    distlab ConfigError's text, or (exception type, text) for a refusal Lightning itself makes before training.
    oracle_data: the data the oracle trains on, when it differs (unequal per-rank streams: the common length,
    which is what "every rank ends the epoch when the first runs out" means). oracle_raises: what Lightning's
    ``ddp`` itself says on CPU when it cannot train the feature (then every strategy must refuse it).
    resume_at: stop at that step, resume from its checkpoint. told: what rank 0 must log (distlab's logger).
    atol: tolerance of weights and buffers (a float, or {strategy: float}), and ``why``. effect: what the oracle
    shows when the feature took effect, ``effect(oracle rank 0, baseline oracle rank 0) -> bool`` (a clip threshold
    never reached compares nothing). one_process: a one-process fit on the concatenated batches must equal the
    oracle too (needs a module without BatchNorm).
    """

    name: str
    trainer: dict[str, Any] = field(default_factory=dict)
    module: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    callbacks: tuple[str, ...] = ()
    refused: dict[str, str | tuple[str, str]] = field(default_factory=dict)
    oracle_data: dict[str, Any] | None = None
    oracle_raises: str | None = None
    resume_at: int | None = None
    told: str | None = None
    atol: float | dict[str, float] = 0.0
    why: str = "the same arithmetic in the same order on 2 ranks: bit-equal"
    effect: Callable[[dict, dict], bool] | None = None
    one_process: bool = False

    def tolerance(self, strategy: str) -> float:
        return self.atol.get(strategy, 0.0) if isinstance(self.atol, dict) else self.atol


def make_callbacks(names: tuple[str, ...], dirpath: Path) -> list[L.Callback]:
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    table = {
        "checkpoint_every_2": lambda: ModelCheckpoint(
            dirpath=dirpath / "ckpt", every_n_train_steps=2, save_top_k=-1, filename="{step}"
        ),
        "checkpoint_resume": lambda: ModelCheckpoint(
            dirpath=dirpath / "ckpt", every_n_train_steps=3, save_top_k=-1, filename="{step}"
        ),
        "early_stopping": lambda: EarlyStopping(monitor="val_loss", patience=1, min_delta=0.02),
    }
    return [table[n]() for n in names]


# ---- running one fit on every rank ------------------------------------------------------------------------
def make_strategy(name: str):
    from lightning.pytorch.strategies import DDPStrategy

    from distlab.strategies import FSDP2Strategy, OptimizerSyncDDPStrategy

    cls = {"ddp": DDPStrategy, "ddp_optimizer_sync": OptimizerSyncDDPStrategy, "fsdp2": FSDP2Strategy}[name]
    return cls(process_group_backend="gloo", timeout=timedelta(seconds=60))


class Record(L.Callback):
    """What a cell compares, on every rank: how many training batches ran, the final weights and buffers
    (FSDP2 shards gathered), the logged values, the learning rates, the step."""

    def __init__(self) -> None:
        self.batches = 0

    def on_train_start(self, trainer, pl_module) -> None:
        self.lrs0 = [g["lr"] for opt in trainer.optimizers for g in opt.param_groups]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches += 1

    def on_fit_end(self, trainer, pl_module) -> None:
        from torch.distributed.tensor import DTensor

        self.state = {
            k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
            for k, v in pl_module.net.state_dict().items()
        }
        self.metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        self.lrs = [g["lr"] for opt in trainer.optimizers for g in opt.param_groups]
        self.step, self.epoch = trainer.global_step, trainer.current_epoch
        self.grad_stats = list(pl_module.grad_stats)


class _Told(logging.Handler):
    """distlab's log lines during one fit (at INFO, whatever the logger prints)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _launch_env(rank: int) -> None:
    """Lightning's LightningEnvironment: LOCAL_RANK set -> processes were launched outside (torchrun-like)."""
    os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(WORLD), RANK=str(rank))
    os.environ["PL_GLOBAL_SEED"] = "0"  # the DistributedSampler's shuffle seed (sampler_order)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")  # unused: the process group exists


def fit_once(
    strategy: str, feature: Feature, root: Path, data_kw: dict, max_steps: int | None = None, ckpt_path=None
) -> dict:
    """One fit of ``feature`` under ``strategy`` on this rank; what it recorded, or the error it ended with."""
    _launch_env(_rank())
    record = Record()
    trainer_kw: dict[str, Any] = dict(max_steps=6, max_epochs=100, num_sanity_val_steps=2)
    trainer_kw.update(feature.trainer)
    if max_steps is not None:
        trainer_kw["max_steps"] = max_steps
    callbacks = make_callbacks(feature.callbacks, root)
    out: dict[str, Any] = {"batches": 0}
    told = _Told()
    logging.getLogger("distlab").addHandler(told)
    try:  # a refusal can come from the Trainer's construction (Lightning's own checks) or from fit
        trainer = L.Trainer(
            accelerator="cpu",
            devices=WORLD,
            strategy=make_strategy(strategy),
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=any(isinstance(c, L.pytorch.callbacks.ModelCheckpoint) for c in callbacks),
            default_root_dir=root,
            callbacks=[record, *callbacks],
            **trainer_kw,
        )
        trainer.fit(ParityModule(**feature.module), ParityData(**data_kw), ckpt_path=ckpt_path)
    except Exception as e:  # noqa: BLE001 - a refusal (or a failure) is the cell's result
        out["error"] = f"{type(e).__name__}: {e}"
        out["error_type"] = type(e).__name__
        out["traceback"] = traceback.format_exc()
    finally:
        logging.getLogger("distlab").removeHandler(told)
    out["told"] = told.lines
    out["batches"] = record.batches
    for key in ("state", "metrics", "lrs", "lrs0", "step", "epoch", "grad_stats"):
        if hasattr(record, key):
            out[key] = getattr(record, key)
    ckpt_dir = root / "ckpt"
    if ckpt_dir.is_dir():
        out["checkpoints"] = sorted(p.name for p in ckpt_dir.iterdir())
    return out


def one_process_fit(feature: Feature, root: Path) -> dict:
    """The feature in one process (no process group) on the concatenated batches: the ranks' global batch."""
    assert feature.data.get("kind", "tensor") == "tensor", (
        "one process sees the ranks' batches only for a TensorDataset"
    )
    record = Record()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=root,
        callbacks=[record],
        **{**dict(max_steps=6, max_epochs=100), **feature.trainer},
    )
    epochs = 2  # enough for 6 steps of 2 accumulated batches: 96 samples, two of the ranks' epochs
    trainer.fit(ParityModule(**feature.module), ParityData(**feature.data, one_process_epochs=epochs))
    return {"state": record.state, "step": record.step, "lrs": record.lrs, "grad_stats": record.grad_stats}


def checkpoint_weights(path: Path) -> dict[str, torch.Tensor]:
    """The net's weights in a Lightning checkpoint file or an FSDP2 (DCP) folder."""
    from distlab.checkpoint import consolidated_state

    _, state = consolidated_state(path, prefix="net.")
    return {k.removeprefix("net."): v for k, v in state.items()}


def run_feature(strategy: str, feature: Feature, root: Path) -> dict:
    data_kw = feature.data if strategy != ORACLE or feature.oracle_data is None else feature.oracle_data
    if feature.resume_at is None:
        out = fit_once(strategy, feature, root, data_kw)
    else:
        first = fit_once(strategy, feature, root, data_kw, max_steps=feature.resume_at)
        if "error" in first:
            return first
        ckpt = root / "ckpt" / f"step={feature.resume_at}.ckpt"
        out = fit_once(strategy, feature, root, data_kw, ckpt_path=str(ckpt))
    out["root"] = str(root)  # checkpoints are read by the caller (a DCP folder loads without a process group)
    return out


def parity_job(
    rank: int, world: int, names: list[str], root: str, strategies: list[str] | None = None
) -> dict:
    """On every rank: each selected feature under the oracle and each strategy -> {(feature, strategy): result}."""
    import distlab  # noqa: F401 - registers the strategies

    torch.set_num_threads(1)
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    log = logging.getLogger("distlab")  # the job's lines are recorded per fit (_Told), not printed
    log.setLevel(logging.INFO)
    log.propagate = False
    for handler in list(log.handlers):
        log.removeHandler(handler)
    by_name = {f.name: f for f in FEATURES}
    results = {}
    for name in names:
        feature = by_name[name]
        for strategy in [ORACLE, *STRATEGIES] if strategies is None else strategies:
            results[(name, strategy)] = run_feature(strategy, feature, Path(root) / name / strategy)
            torch.save(results, Path(root) / f"results_rank{rank}.pt")  # so far, should a later fit hang
    return results


# Tolerances, and why (2 ranks; a tolerance of 0 means bit-equal: the same sums in the same order).
CLIP_ATOL = 5e-6  # measured up to 5.8e-7 on this host (ddp_optimizer_sync), 2.4e-7 (fsdp2)
CLIP_WHY = (
    "the global norm sums squares per parameter (ddp: torch's clip_grad_norm_) vs per owned shard and then over "
    "ranks (distlab's optimizer, FSDP2's DTensors): the clip coefficient differs in the last bit, and Muon's "
    "and Adam's normalisations carry that through 6 steps"
)
FSDP2_ACCUMULATE_WHY = (
    "FSDP2 reduce-scatters each micro-batch's gradient and adds the averages; ddp (and ddp_optimizer_sync) add the "
    "micro-batches first and average once: the sums round differently"
)
# one process on the concatenated batch equals 2 ranks only without batch statistics
NO_BN = dict(batchnorm=False)


def same_weights(a: dict, b: dict) -> bool:
    return a["state"].keys() == b["state"].keys() and all(
        torch.equal(a["state"][k], b["state"][k]) for k in a["state"]
    )


def differs(a: dict, b: dict) -> bool:
    return not same_weights(a, b)


def scaled_lrs(ref: dict, factor: float) -> bool:
    """Every group's learning rate is its first one times ``factor`` (StepLR, gamma 0.7, stepped n times)."""
    return all(abs(lr - lr0 * factor) <= 1e-12 * lr0 for lr, lr0 in zip(ref["lrs"], ref["lrs0"], strict=True))


def clips_norm(at: float) -> Callable[[dict, dict], bool]:
    return lambda ref, base: max(norm for norm, _ in ref["grad_stats"]) > at


FEATURES: list[Feature] = [
    # BatchNorm (running statistics differ per rank and per batch), a buffer no batch changes
    Feature("baseline", effect=lambda ref, base: ref["step"] == 6),
    Feature(
        "gradient_clip_norm",
        trainer=dict(gradient_clip_val=0.05),
        module=NO_BN,
        one_process=True,
        atol=CLIP_ATOL,
        why=CLIP_WHY,
        effect=clips_norm(0.05),
    ),
    Feature(  # Lightning's clip and the optimizer's own: under ddp both act, so the tighter one wins
        "gradient_clip_norm_and_optimizer_clip",
        trainer=dict(gradient_clip_val=1.0),
        module={**NO_BN, "max_grad_norm": 0.05},
        atol=CLIP_ATOL,
        why=CLIP_WHY,
        effect=clips_norm(0.05),
    ),
    Feature(
        "gradient_clip_value",
        trainer=dict(gradient_clip_val=0.01, gradient_clip_algorithm="value"),
        module=NO_BN,
        one_process=True,
        refused={"ddp_optimizer_sync": "would clamp each rank's local, unsynced gradients"},
        effect=lambda ref, base: max(m for _, m in ref["grad_stats"]) > 0.01,
    ),
    Feature(
        "accumulate_grad_batches",
        trainer=dict(accumulate_grad_batches=2),
        module=NO_BN,
        one_process=True,
        atol={"fsdp2": 1e-6},
        why=FSDP2_ACCUMULATE_WHY,
        effect=lambda ref, base: ref["batches"] == 2 * ref["step"],
    ),
    Feature("precision_bf16_mixed", trainer=dict(precision="bf16-mixed"), effect=differs),
    # fp16 autocast; on CPU Lightning uses no gradient scaler (on CUDA ddp_optimizer_sync refuses one: see
    # test_parity.py::test_grad_scaler_refused)
    Feature(
        "precision_16_mixed",
        trainer=dict(precision="16-mixed"),
        refused={
            "fsdp2": (
                "ValueError",
                "`ModelParallelStrategy` does not support `Fabric(..., precision='16-mixed')`",
            )
        },
        effect=differs,
    ),
    Feature(
        "manual_optimization",  # self.clip_gradients in the step: the manual route to clipping
        module=dict(manual=True, manual_clip=0.05, batchnorm=False),
        one_process=True,
        atol=CLIP_ATOL,
        why=CLIP_WHY,
        effect=clips_norm(0.05),
    ),
    Feature(
        "lr_scheduler_per_step",
        module=dict(scheduler="step", batchnorm=False),
        one_process=True,
        effect=lambda ref, base: scaled_lrs(ref, 0.7**6),
    ),
    Feature(
        "lr_scheduler_per_epoch",  # 2 steps per epoch: 3 epochs
        module=dict(scheduler="epoch"),
        data=dict(n_train=16),
        effect=lambda ref, base: ref["epoch"] == 3 and scaled_lrs(ref, 0.7**3),
    ),
    Feature(
        "sync_batchnorm",
        trainer=dict(sync_batchnorm=True),
        oracle_raises="SyncBatchNorm layers only work with GPU modules",
        refused={s: "sync_batchnorm=True) on CPU" for s in STRATEGIES},
    ),
    # anomaly detection checks each rank's backward (local under ddp too): the baseline's weights
    Feature("detect_anomaly", trainer=dict(detect_anomaly=True), effect=same_weights),
    Feature(  # 3 batches per epoch: 2 epochs, the sampler reshuffled for the second
        "limit_train_batches",
        trainer=dict(limit_train_batches=3),
        effect=lambda ref, base: ref["epoch"] == 2 and differs(ref, base),
    ),
    # the same samples as the baseline, batched into dicts by the user's collate_fn (validation too)
    Feature("dict_batches_collate_fn", data=dict(kind="dict"), effect=same_weights),
    # each rank streams the samples the baseline's DistributedSampler gives it: the baseline's weights
    Feature("iterable_dataset", data=dict(kind="stream"), effect=same_weights),
    Feature(
        "unequal_rank_data_stream",
        data=dict(kind="stream", lengths=[24, 12]),
        oracle_data=dict(kind="stream", lengths=[12, 12]),
        trainer=dict(max_steps=-1, max_epochs=1),
        told="rank 1's training data ran out after batch 3 of epoch 0 (step 3)",
        effect=lambda ref, base: ref["step"] == 3,
    ),
    Feature(
        "unequal_rank_data_sized",
        data=dict(kind="per_rank", lengths=[24, 12]),
        oracle_data=dict(kind="per_rank", lengths=[12, 12]),
        trainer=dict(max_steps=-1, max_epochs=1, use_distributed_sampler=False),
        refused={
            s: "rank 1 has 3 batches per epoch, rank 0 6, so rank 1's data runs out after step 3"
            for s in STRATEGIES
        },
    ),
    Feature(
        "checkpoint_every_n_train_steps",
        callbacks=("checkpoint_every_2",),
        effect=lambda ref, base: (
            same_weights(ref, base) and ref["checkpoints"] == ["step=2.ckpt", "step=4.ckpt", "step=6.ckpt"]
        ),
    ),
    Feature(
        "early_stopping",
        callbacks=("early_stopping",),
        trainer=dict(max_steps=12, val_check_interval=2),
        effect=lambda ref, base: ref["step"] < 12,
    ),
    # several features at once (they do not interact); test_spawn_launchers also runs it under the *_spawn launchers
    Feature(
        "combined",
        trainer=dict(gradient_clip_val=0.05, accumulate_grad_batches=2, max_steps=4),
        module=dict(scheduler="step"),
        data=dict(kind="dict"),
        callbacks=("checkpoint_every_2",),
        atol=CLIP_ATOL,
        why=CLIP_WHY,
        effect=lambda ref, base: ref["batches"] == 8 and ref["checkpoints"] == ["step=2.ckpt", "step=4.ckpt"],
    ),
    Feature(
        "resume_mid_run",  # stops at step 3 (mid-epoch), resumes from step=3.ckpt to step 6
        callbacks=("checkpoint_resume",),
        resume_at=3,
        effect=lambda ref, base: ref["step"] == 6 and ref["batches"] == 3,
    ),
]
