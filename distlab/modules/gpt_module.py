"""LightningModule for the GPT: model, loss, metrics, param groups, optimizer and LR schedule."""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any, Literal

import lightning as L
import torch

from distlab.data import DigitsDataModule, TextDataModule
from distlab.domains import (
    AtLeastTwo,
    HalfOpenUnitInterval,
    LearningRate,
    NonNegative,
    NonNegativeInt,
    Positive,
    PositiveInt,
    UnitInterval,
    check_domains,
)
from distlab.dtypes import NSDtypeName
from distlab.errors import ConfigError
from distlab.log import info_rank0
from distlab.models.gpt import GPT, GPTConfig
from distlab.modules.base import CheckedModule
from distlab.modules.metrics import LanguageModelMetrics
from distlab.modules.schedule import ScheduleName, stepped_schedule
from distlab.optim import POLAR_EXPRESS_COEFFICIENTS, DistMuonAdamW, muon_param_groups


class GPTLightningModule(CheckedModule, L.LightningModule):
    """Trains :class:`distlab.models.gpt.GPT` on next-token prediction.

    Model size: ``depth`` (other sizes derive from it, see GPTConfig). Optimizer: ``"muon"``
    (Muon for hidden matrices + AdamW for embedding/head/scalars, sharded across ranks) or
    ``"adamw"`` (AdamW everywhere). Every parameter lands in exactly one group (asserted).

    Learning rates are per group; ``None`` picks the tuned default for the chosen optimizer.
    AdamW learning rates are scaled by (n_embd / 768) ** -0.5 as in nanochat, so they transfer
    across widths.

    Args:
        depth: the one size knob: number of blocks; width and heads derive from it.
        sequence_len: model context in tokens (data.seq_len must not exceed it).
        vocab_size: 257 for the byte tokenizer (256 bytes + document separator).
        n_embd: width override (default depth * aspect_ratio, rounded up to head_dim).
        n_head: attention heads override (default n_embd / head_dim).
        n_kv_head: key/value heads for grouped-query attention (default n_head).
        head_dim: target head dimension used to derive n_head.
        aspect_ratio: width per unit of depth.
        logit_softcap: tanh soft cap on logits (0 disables).
        optimizer: "muon" (Muon + AdamW, sharded) or "adamw" (AdamW for every group).
        matrix_lr: learning rate of hidden matrices (None: 0.02 for muon, 0.004 scaled for adamw).
        embedding_lr: AdamW learning rate of the token embedding (width-scaled).
        head_lr: AdamW learning rate of the LM head (width-scaled).
        scalar_lr: AdamW learning rate of 0-/1-D parameters.
        weight_decay: decoupled weight decay for all groups.
        betas: AdamW betas.
        muon_momentum: Muon momentum.
        orthogonalizer: how Muon orthogonalises: "newton_schulz" (torch.optim.Muon's quintic, 5 iterations) or
            "polar_express" (a tuned quintic per iteration, :data:`distlab.optim.POLAR_EXPRESS_COEFFICIENTS`).
        normuon_beta2: NorMuon on the hidden matrices (each row of the orthogonalised update divided by its running
            RMS, this the second moment's decay; the step keeps Muon's size); None: Muon.
        ns_dtype: Newton-Schulz's dtype: "auto" is bf16 where every rank's device multiplies bf16 in hardware
            (an Ampere or later GPU, a CPU with AVX512-BF16 or AMX), else fp32; set it to get the same numbers
            on every host.
        max_grad_norm: global-norm clipping applied by the optimizer after the cross-rank reduction.
        schedule: "linear" (constant then warmdown), "cosine", or "constant" after warmup.
        warmup_steps: linear warmup steps.
        warmdown_ratio: fraction of max_steps spent in the linear warmdown.
        min_lr_ratio: final learning rate as a fraction of the peak.
        compile: torch.compile the model (worth it on GPU; slow to compile on CPU).

    Example YAML::

        model:
          depth: 4
          sequence_len: 256
          optimizer: muon
          warmup_steps: 20
    """

    def __init__(
        self,
        depth: PositiveInt = 4,
        sequence_len: PositiveInt = 256,
        vocab_size: AtLeastTwo = 257,
        n_embd: PositiveInt | None = None,
        n_head: PositiveInt | None = None,
        n_kv_head: PositiveInt | None = None,
        head_dim: PositiveInt = 64,
        aspect_ratio: PositiveInt = 64,
        logit_softcap: NonNegative = 15.0,
        optimizer: Literal["muon", "adamw"] = "muon",
        matrix_lr: LearningRate | None = None,
        embedding_lr: LearningRate = 0.2,
        head_lr: LearningRate = 0.004,
        scalar_lr: LearningRate = 0.02,
        weight_decay: NonNegative = 0.0,
        betas: tuple[HalfOpenUnitInterval, HalfOpenUnitInterval] = (0.8, 0.95),
        muon_momentum: HalfOpenUnitInterval = 0.95,
        orthogonalizer: Literal["newton_schulz", "polar_express"] = "newton_schulz",
        normuon_beta2: HalfOpenUnitInterval | None = None,
        ns_dtype: NSDtypeName = "auto",
        max_grad_norm: Positive | None = None,
        schedule: ScheduleName = "linear",
        warmup_steps: NonNegativeInt = 0,
        warmdown_ratio: UnitInterval = 0.4,
        min_lr_ratio: UnitInterval = 0.0,
        compile: bool = False,
    ) -> None:
        check_domains(GPTLightningModule.__init__, locals())
        for name, value in (("orthogonalizer", orthogonalizer), ("normuon_beta2", normuon_beta2)):
            if optimizer == "adamw" and value not in ("newton_schulz", None):
                raise ConfigError(
                    f"model.{name}={value} shapes Muon's updates, and model.optimizer=adamw has none; set "
                    f"model.optimizer=muon, or leave model.{name} unset"
                )
        super().__init__()
        self.save_hyperparameters()
        settings = locals()
        self.config = GPTConfig(
            **{f.name: settings[f.name] for f in dataclasses.fields(GPTConfig) if f.name in settings}
        )
        self.model = GPT(self.config)
        self.val_metrics = LanguageModelMetrics()
        self.test_metrics = LanguageModelMetrics()

    # ---- training / evaluation -------------------------------------------------------------
    def configure_model(self) -> None:
        # Parallelism is applied by the strategy, not here: the module stays strategy-agnostic.
        if self.hparams.compile and not getattr(self, "_compiled", False):
            self.model.compile()  # compiles forward in place; state-dict keys are unchanged
            self._compiled = True

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch  # (B, T), (B, T)
        self._last_batch_shape = tuple(x.shape)  # (what flops_per_batch counts)
        loss = self.model(x, targets=y)
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=False, batch_size=x.size(0))
        return loss

    def flops_of(self, batch) -> int:
        """Training FLOPs of one step on ``batch`` (analytic: attention counted over the batch's own length)."""
        batch_size, seq_len = batch[0].shape  # (B, T)
        return self.model.flops_per_token(seq_len=seq_len) * batch_size * seq_len

    @property
    def flops_per_batch(self) -> int | None:
        """Training FLOPs of the latest training batch, a number (None before the first): Lightning's convention,
        which its ThroughputMonitor and distlab's SpeedMonitor read after each batch."""
        shape = getattr(self, "_last_batch_shape", None)
        return None if shape is None else self.flops_of((torch.empty(shape, device="meta"),))

    def on_before_zero_grad(self, optimizer) -> None:
        # The optimizer computes the global norm of the synced gradients when it clips.
        norm = getattr(optimizer, "last_grad_norm", None)
        if norm is not None:
            self.log("grad_norm", norm, on_step=True, on_epoch=False)

    def _eval_step(self, batch, metrics: LanguageModelMetrics) -> None:
        x, y = batch
        metrics.update(self.model(x, targets=y, reduction="none"), y)  # each token's nats (B * T,)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, self.val_metrics)

    def on_validation_epoch_end(self) -> None:
        self._log_eval(self.val_metrics, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, self.test_metrics)

    def on_test_epoch_end(self) -> None:
        self._log_eval(self.test_metrics, "test")

    def _log_eval(self, metrics: LanguageModelMetrics, prefix: str) -> None:
        values = metrics.compute()  # torchmetrics sums the states across ranks: same on every rank
        metrics.reset()
        for name, value in values.items():
            # Lightning advises sync_dist for an epoch-level tensor; these are synced already (and the same on every
            # rank): its advice is silenced for these names only, in every rank's process
            warnings.filterwarnings(
                "ignore", message=re.escape(f"It is recommended to use `self.log('{prefix}_{name}'")
            )
            self.log(f"{prefix}_{name}", value, prog_bar=name == "bpb", sync_dist=False, rank_zero_only=False)

    # ---- optimizer ---------------------------------------------------------------------------
    def param_groups(self) -> list[dict]:
        """The optimizer's groups, built by :func:`distlab.optim.muon_param_groups` (the helper any model uses)
        with this module's learning rates and group names: "embedding", "head", "scalar" (AdamW) and "matrix"
        (Muon, or AdamW with ``optimizer="adamw"``); every parameter exactly once."""
        hp = self.hparams
        scale = (self.config.n_embd / 768) ** -0.5  # AdamW lr transfer across widths (nanochat)
        muon = hp.optimizer == "muon"
        matrix_lr = hp.matrix_lr if hp.matrix_lr is not None else (0.02 if muon else 0.004)
        adamw = dict(kind="adamw", betas=tuple(hp.betas), eps=1e-10, weight_decay=hp.weight_decay)
        groups = muon_param_groups(
            self.model,
            lr=matrix_lr,
            momentum=hp.muon_momentum,
            weight_decay=hp.weight_decay,
            adamw_lr=hp.scalar_lr,
            embedding_lr=hp.embedding_lr * scale,
            head_lr=hp.head_lr * scale,
            adamw_betas=adamw["betas"],
            adamw_eps=adamw["eps"],
            adamw_weight_decay=hp.weight_decay,
            verbose=False,
        )
        by_role = {g.pop("name"): g for g in groups}
        matrix = by_role.pop("muon")
        if muon and hp.orthogonalizer == "polar_express":
            matrix.update(
                ns_coefficients=POLAR_EXPRESS_COEFFICIENTS, ns_steps=len(POLAR_EXPRESS_COEFFICIENTS)
            )
        if muon and hp.normuon_beta2 is not None:
            matrix["normuon_beta2"] = hp.normuon_beta2
        if not muon:  # AdamW everywhere: the hidden matrices keep a group (and a learning rate) of their own
            matrix = dict(adamw, params=matrix["params"], lr=matrix_lr * scale)
        out = [dict(group, name="scalar" if role == "adamw" else role) for role, group in by_role.items()]
        return [*out, dict(matrix, name="matrix")]

    def configure_optimizers(self):
        # One optimizer object for both kinds: Lightning schedules, clips and checkpoints it as one.
        # "adamw" is the same optimizer with every group of kind adamw (== torch.optim.AdamW on 1 process).
        # Who averages the gradients (a DDP wrapper, the sharding strategy, or the optimizer) is resolved by
        # the optimizer itself (grad_sync="auto").
        groups = self.param_groups()
        shown = ", ".join(
            f"{g['name']} ({g['kind']}) {len(g['params'])} tensors / {sum(p.numel() for p in g['params']) / 1e6:.2f}M"
            for g in groups
        )
        info_rank0(f"{type(self).__name__} param groups: {shown}")
        optimizer = DistMuonAdamW(
            groups, max_grad_norm=self.hparams.max_grad_norm, ns_dtype=self.hparams.ns_dtype
        )
        return stepped_schedule(optimizer, self.trainer.max_steps, self.hparams)

    def check_data(self, datamodule: Any) -> None:
        """Refuse data this module cannot train on (the CLI calls it before anything is written; a fit from Python,
        at its start): batches of another kind than (B, T) token ids, or token ids beyond ``vocab_size`` (shards of
        another tokenizer), which would fail deep in the forward pass."""
        if isinstance(datamodule, DigitsDataModule):
            raise ConfigError(
                f"{type(self).__name__} trains on (B, T) token batches, and {type(datamodule).__name__} gives (images, "
                "labels); use TextDataModule (or your own data module of token batches), or ImageClassifier for the digits"
            )
        if not isinstance(datamodule, TextDataModule):
            return
        if datamodule.seq_len > self.config.sequence_len:
            raise ConfigError(
                f"data.seq_len={datamodule.seq_len} exceeds the model context model.sequence_len="
                f"{self.config.sequence_len}; lower data.seq_len or raise model.sequence_len"
            )
        splits = datamodule.prepare_splits()
        top = max((int(a.max()) for a in [*splits.train, *splits.val] if len(a)), default=-1)
        vocab = self.config.vocab_size
        if top >= vocab:
            raise ConfigError(
                f"the data ({splits.description}) holds token id {top}, but model.vocab_size={vocab}; set model.vocab_size "
                f"above {top} for shards of another tokenizer (GPT-2's need 50257), or check that the files are token shards"
            )
