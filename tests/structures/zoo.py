"""The module-structure zoo: a user's LightningModule assembled from structural blocks, its data, its optimizers,
and the references it is held to.

A *block* is one structural feature a user's module may have (parameters tied at the top level or across blocks, a
submodule used in two places, BatchNorm's running statistics, buffers changed in forward, frozen parameters,
parameters unused on some steps or on some ranks, parameters created in ``configure_model``, manual optimization
with two toggled optimizers and schedulers, several evaluation loaders). :class:`Combo` is a set of blocks plus the
batch's container (tuple, dict, dataclass) and the optimizer; :class:`ZooModule` builds the module a combo
describes. A new block joins by an entry in :data:`BLOCKS` and the lines of :class:`ZooModule` that build it; the
suite draws combinations of whatever is listed there.

The references are written without distlab: the oracle optimizer under Lightning's ``ddp`` is torch's own
``Muon`` + ``AdamW`` (:class:`TorchMuonAdamW`, the same parameter split), and the evaluation reference
(:func:`evaluate`) is a plain loop over every sample of a loader, in one process, on a state copied from a rank.

The model (shapes per rank; B samples of T tokens, vocabulary V, width D)::

    ids (B, T) -> emb (B, T, D) -> trunk: 2 blocks [+ frozen, sometimes, rank-0-only, BatchNorm] -> [extra]
               -> head (B, T, V)  -> cross-entropy against y (B, T)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

V, D, T = 11, 8, 4  # vocabulary, width, tokens per sample
BATCH = 4  # samples per rank and step
N_TRAIN = 64
VAL_SIZES = (10, 7)  # samples of each evaluation loader (several loaders: all of them; else the first)
EVAL_BATCH = 3
STEPS = 6  # optimizer steps of a fit
EVERY = 3  # RankZeroValidation's cadence


@dataclass(frozen=True)
class Block:
    """One structural feature. ``one_process``: a one-process fit on the concatenated batch trains the same model
    (not with batch statistics, random draws, nor work that depends on the rank). ``rank_dependent``: the forward
    depends on the rank (no one process computes what the ranks do). ``split_dependent``: what training draws
    depends on how a step's batch is split (dropout's masks), so one rank of reproducible mode draws otherwise.
    ``needs_unused``: Lightning's ``ddp`` needs ``find_unused_parameters=True`` for it. ``refused``: {strategy: the
    one line its refusal says}, before the first batch, or with ``refused_mid_fit`` in the step where it happens
    (on every rank at once)."""

    name: str
    doc: str
    one_process: bool = True
    rank_dependent: bool = False
    split_dependent: bool = False
    needs_unused: bool = False
    refused: dict[str, str] = field(default_factory=dict)
    refused_mid_fit: bool = False


BLOCKS: dict[str, Block] = {
    b.name: b
    for b in [
        Block("tie_top", "head.weight is emb.weight, two children of the LightningModule (GPT-2's tie)"),
        Block("tie_deep", "blocks[1].proj.weight is blocks[0].proj.weight, across the trunk's ModuleList"),
        Block("shared_module", "one Linear registered in both trunk blocks, run twice per forward"),
        Block(
            "batchnorm", "BatchNorm1d: running statistics change in every training forward", one_process=False
        ),
        Block(
            "buffers", "a persistent step counter changed in forward and a non-persistent scale read by it"
        ),
        Block("frozen", "a Linear with requires_grad=False inside the trunk"),
        Block("unused_some_steps", "a Linear used on even optimizer steps only", needs_unused=True),
        Block(
            "unused_on_rank",
            "a Linear used on rank 0 only (its gradient comes from one rank)",
            one_process=False,
            rank_dependent=True,
            needs_unused=True,
        ),
        Block("configure_model", "a child created in configure_model, not __init__"),
        Block("own_parameter", "a parameter registered on the LightningModule itself (a logit scale)"),
        Block(
            "scalar_parameter",
            "a 0-D parameter (a temperature) in a child module",
            refused={s: "FSDP2 cannot shard the 0-D parameter" for s in ("fsdp2", "hsdp")},
        ),
        Block(
            "manual_two_optimizers",
            "manual optimization: two optimizers, toggle/untoggle_optimizer, manual_backward, two schedulers; the "
            "second trains on one fixed batch, the same on every rank (a GAN's generator fed the same noise: its "
            "gradients agree across ranks before any averaging)",
            needs_unused=True,
            refused={"reproducible": "reproducible mode sums each micro-batch's gradients in a fixed tree"},
        ),
        Block("loaders", "two validation and two test loaders (dataloader_idx)"),
        Block(
            "blocks_on_module", "a ModuleList of blocks set on the LightningModule itself (GPT's self.blocks)"
        ),
        Block(
            "repeated_block", "one block listed three times in a ModuleList (ALBERT's sharing across layers)"
        ),
        Block(
            "parameter_containers",
            "a ParameterList and a ParameterDict on the LightningModule, their parameters used directly",
        ),
        Block(
            "experts",
            "three experts in a ModuleList, each sample routed to one: an expert no sample of a rank chose is "
            "skipped on that rank",
            needs_unused=True,
            refused={s: "the ranks ran different sharded units" for s in ("fsdp2", "hsdp")},
            refused_mid_fit=True,
        ),
        Block(
            "ema_teacher",
            "a frozen parameter of the LightningModule, used in forward, moved toward a trained weight in the "
            "module's on_train_batch_end (an EMA teacher): validation must see it moved, and keep the move",
            split_dependent=True,  # on_train_batch_end runs per micro-batch: one rank of reproducible mode runs 2
        ),
        Block(
            "dropout",
            "dropout in training: validation must not change the draws",
            one_process=False,
            split_dependent=True,
        ),
    ]
}
BATCH_KINDS = ("tuple", "dict", "dataclass")
OPTIMIZERS = ("dist_muon_adamw", "dist_adamw", "torch_adamw")


@dataclass(frozen=True, order=True)
class Combo:
    blocks: tuple[str, ...]
    batch: str = "tuple"
    optimizer: str = "dist_muon_adamw"

    @property
    def name(self) -> str:
        return "+".join(self.blocks or ("plain",)) + f" [{self.batch}, {self.optimizer}]"

    def has(self, block: str) -> bool:
        return block in self.blocks

    @property
    def one_process(self) -> bool:
        return all(BLOCKS[b].one_process for b in self.blocks)

    @property
    def needs_unused(self) -> bool:
        return any(BLOCKS[b].needs_unused for b in self.blocks)


# ---- batches -----------------------------------------------------------------------------------------------
@dataclass
class ZooBatch:
    ids: torch.Tensor  # (B, T)
    y: torch.Tensor  # (B, T)


class Tokens(Dataset):
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, V, (n, T), generator=g)
        self.y = (self.ids * 3 + 1) % V  # a rule to learn

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        return self.ids[i], self.y[i]


def collate_for(kind: str):
    def collate(samples: list) -> Any:
        ids, y = torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples])
        if kind == "dict":
            return {"ids": ids, "y": y}
        return ZooBatch(ids, y) if kind == "dataclass" else (ids, y)

    return collate


def unpack(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, dict):
        return batch["ids"], batch["y"]
    if isinstance(batch, ZooBatch):
        return batch.ids, batch.y
    return batch[0], batch[1]


def train_loader(combo: Combo, one_process_of: int = 0) -> DataLoader:
    """The training loader each rank is given (Lightning puts a DistributedSampler in it). ``one_process_of=W``: one
    process's loader of the same global batches: Lightning's sampler shuffles training data (seed PL_GLOBAL_SEED=0,
    plus the epoch) and deals rank r every W-th sample from r, so step i's ranks hold samples [i*W*B, (i+1)*W*B)
    of the epoch's permutation, which one process takes in batches of W*B."""
    data = Tokens(N_TRAIN, seed=1)
    if not one_process_of:
        return DataLoader(data, batch_size=BATCH, collate_fn=collate_for(combo.batch))
    order = torch.cat([torch.randperm(N_TRAIN, generator=torch.Generator().manual_seed(e)) for e in range(2)])
    return DataLoader(
        Subset(data, order.tolist()), batch_size=one_process_of * BATCH, collate_fn=collate_for(combo.batch)
    )


def eval_loaders(combo: Combo, stage: str) -> list[DataLoader]:
    sizes = VAL_SIZES if combo.has("loaders") else VAL_SIZES[:1]
    seed = 2 if stage == "validation" else 3
    return [
        DataLoader(Tokens(n, seed=seed + 10 * i), batch_size=EVAL_BATCH, collate_fn=collate_for(combo.batch))
        for i, n in enumerate(sizes)
    ]


# ---- the user's module ---------------------------------------------------------------------------------------
class TrunkBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D)
        self.mix = nn.Linear(D, D, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        return h + torch.tanh(self.proj(h)) + 0.5 * self.mix(h)


class Trunk(nn.Module):
    def __init__(self, combo: Combo) -> None:
        super().__init__()
        self.combo = combo
        self.blocks = nn.ModuleList([TrunkBlock(), TrunkBlock()])  # FSDP2 shards each block on its own
        if combo.has("shared_module"):
            self.blocks[1].mix = self.blocks[0].mix
        if combo.has("tie_deep"):
            self.blocks[1].proj.weight = self.blocks[0].proj.weight
        if combo.has("frozen"):
            self.frozen = nn.Linear(D, D)
            self.frozen.requires_grad_(False)
        # (no bias: a bias added right before BatchNorm has a gradient of pure rounding noise, which Adam scales
        # to a full step, so its value would follow the summation order, not the strategy)
        if combo.has("unused_some_steps"):
            self.sometimes = nn.Linear(D, D, bias=False)
        if combo.has("unused_on_rank"):
            self.rank0_only = nn.Linear(D, D, bias=False)
        if combo.has("batchnorm"):
            self.norm = nn.BatchNorm1d(D)
        if combo.has("scalar_parameter"):
            self.temperature = nn.Parameter(torch.tensor(1.2))
        if combo.has("buffers"):
            self.register_buffer("calls", torch.zeros(()))  # persistent, changed by every training forward
            self.register_buffer("scale", torch.full((D,), 0.9), persistent=False)
        if combo.has("repeated_block"):
            shared = TrunkBlock()
            self.repeat = nn.ModuleList([shared, shared, shared])
        if combo.has("experts"):
            self.experts = nn.ModuleList([nn.Linear(D, D, bias=False) for _ in range(3)])
        if combo.has("dropout"):
            self.drop = nn.Dropout(0.2)

    def forward(self, h: torch.Tensor, step: int, rank: int) -> torch.Tensor:  # (B, T, D)
        for block in self.blocks:
            h = block(h)
        for block in getattr(self, "repeat", ()):
            h = 0.5 * block(h)
        if self.combo.has("experts"):
            choice = h[:, 0, :3].argmax(-1)  # (B,): each sample's expert
            out = torch.zeros_like(h)
            for e, expert in enumerate(self.experts):
                chose = choice == e
                if chose.any():  # an expert none of this rank's samples chose does not run here
                    out[chose] = expert(h[chose])
            h = h + out
        if self.combo.has("dropout"):
            h = self.drop(h)
        if self.combo.has("frozen"):
            h = h + 0.5 * self.frozen(h)
        if self.combo.has("unused_some_steps") and (step % 2 == 0 or not self.training):
            h = h + self.sometimes(h)
        if self.combo.has("unused_on_rank") and rank == 0:
            h = h + self.rank0_only(h)
        if self.combo.has("batchnorm"):
            h = self.norm(h.reshape(-1, D)).reshape(h.shape)
        if self.combo.has("scalar_parameter"):
            h = h / self.temperature
        if self.combo.has("buffers"):
            if self.training:
                self.calls += 1
            h = h * self.scale
        return h


class ZooModule(L.LightningModule):
    """The combo's module. Every rank above 0 starts from other weights and buffers (``perturb``): a strategy must
    start every rank from rank 0's."""

    def __init__(self, combo: Combo, perturb: bool = True, ns_dtype: str = "bfloat16") -> None:
        super().__init__()
        self.combo, self.perturb, self.ns_dtype = combo, perturb, ns_dtype
        torch.manual_seed(0)
        self.emb = nn.Embedding(V, D)
        self.trunk = Trunk(combo)
        self.head = nn.Linear(D, V, bias=False)
        if combo.has("tie_top"):
            self.head.weight = self.emb.weight
        if combo.has("own_parameter"):
            self.logit_scale = nn.Parameter(torch.full((1,), 1.5))
        if combo.has("blocks_on_module"):
            self.layers = nn.ModuleList([TrunkBlock(), TrunkBlock()])
        if combo.has("parameter_containers"):
            self.gains = nn.ParameterList([nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))])
            self.shifts = nn.ParameterDict({"a": nn.Parameter(torch.full((D,), 0.1))})
        if combo.has("ema_teacher"):
            self.teacher = nn.Parameter(torch.eye(D) * 0.5, requires_grad=False)  # (D, D)
        self.automatic_optimization = not combo.has("manual_two_optimizers")
        self.train_losses: list[float] = []

    def configure_model(self) -> None:
        if self.combo.has("configure_model") and not hasattr(self, "extra"):
            g = torch.Generator().manual_seed(5)
            self.extra = nn.Linear(D, D)
            with torch.no_grad():
                self.extra.weight.copy_(torch.randn(D, D, generator=g) * 0.3)
                self.extra.bias.zero_()
        if (
            self.perturb and self.global_rank > 0
        ):  # once, after everything exists, before the strategy wraps or shards
            self.perturb = False  # (Lightning calls configure_model again for trainer.test)
            with torch.no_grad():
                for t in [*self.parameters(), *self.buffers()]:
                    if t.is_floating_point():
                        t.add_(0.1 * self.global_rank)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        # the optimizer step, not the batch index: under accumulation a batch index counts micro-batches
        step = self.trainer.global_step if self._trainer is not None else 0
        h = self.trunk(self.emb(ids), step, self.global_rank)
        for layer in getattr(self, "layers", ()):
            h = layer(h)
        if self.combo.has("parameter_containers"):
            h = h * self.gains[0] + self.gains[1] + self.shifts["a"]
        if self.combo.has("ema_teacher"):
            h = h + 0.5 * h @ self.teacher.T
        if self.combo.has("configure_model"):
            h = h + torch.tanh(self.extra(h))
        logits = self.head(h)
        return logits * self.logit_scale if self.combo.has("own_parameter") else logits

    def loss(self, batch: Any) -> torch.Tensor:
        ids, y = unpack(batch)
        return F.cross_entropy(self(ids).reshape(-1, V), y.reshape(-1))

    def training_step(self, batch, batch_idx):
        if self.automatic_optimization:
            loss = self.loss(batch)
            self.log("train_loss", loss, sync_dist=True)
            return loss
        fixed = collate_for(self.combo.batch)([Tokens(BATCH, seed=7)[i] for i in range(BATCH)])
        for k, (opt, sched) in enumerate(
            zip(self.optimizers(), self.lr_schedulers(), strict=True)
        ):  # a GAN's
            self.toggle_optimizer(opt)
            loss = self.loss(batch if k == 0 else fixed)
            self.manual_backward(loss)
            opt.step()
            opt.zero_grad()
            self.untoggle_optimizer(opt)
            sched.step()
        self.log("train_loss", loss, sync_dist=True)
        return None

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.combo.has("ema_teacher"):  # (under FSDP2 both are shards of one layout: the update is local)
            with torch.no_grad():
                self.teacher.mul_(0.7).add_(self.trunk.blocks[0].mix.weight, alpha=0.3)

    def _eval_step(self, batch, batch_idx, dataloader_idx=0, prefix="val"):
        ids, y = unpack(batch)
        logits = self(ids)
        loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        self.log(f"{prefix}_loss", loss)
        self.log(f"{prefix}_acc", (logits.argmax(-1) == y).float().mean())
        if dataloader_idx == 1:  # a name of its own, as Lightning keeps it: no "/dataloader_idx_1"
            self.log(f"{prefix}_loss_second", loss, add_dataloader_idx=False)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self._eval_step(batch, batch_idx, dataloader_idx, "val")

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self._eval_step(batch, batch_idx, dataloader_idx, "test")

    # A value logged at epoch end keeps its plain name with any number of loaders (Lightning adds
    # "/dataloader_idx_i" to what a step logs only): the name is the claim here, the value a constant.
    def on_validation_epoch_end(self) -> None:
        self.log("val_epoch_end", 1.0)

    def on_test_epoch_end(self) -> None:
        self.log("test_epoch_end", 1.0)

    # -- optimizers: the split by hand (hidden matrices of the trunk and extra -> Muon), the same for every run --
    def param_split(self, params: list[tuple[str, nn.Parameter]]) -> tuple[list, list]:
        muon = [p for n, p in params if p.ndim == 2 and n.startswith(("trunk.", "extra."))]
        other = [p for n, p in params if not (p.ndim == 2 and n.startswith(("trunk.", "extra.")))]
        return muon, other

    def build_optimizer(self, params: list[tuple[str, nn.Parameter]]) -> torch.optim.Optimizer:
        """The combo's optimizer over the trainable ``params``; under the oracle (``self.oracle``) torch's own."""
        params = [(n, p) for n, p in params if p.requires_grad]
        muon, other = self.param_split(params)
        everything = [p for _, p in params]
        kind = self.combo.optimizer
        if getattr(self, "oracle", False):
            return (
                TorchMuonAdamW(muon, other)
                if kind == "dist_muon_adamw"
                else torch.optim.AdamW(everything, **ADAMW)
            )
        if kind == "torch_adamw":
            return torch.optim.AdamW(everything, **ADAMW)
        from distlab.optim import DistAdamW, DistMuonAdamW

        if kind == "dist_adamw":
            return DistAdamW(everything, **ADAMW)
        groups = [g for g in (muon_group(muon), adamw_group(other)) if g["params"]]
        return DistMuonAdamW(groups, ns_dtype=self.ns_dtype)

    def configure_optimizers(self):
        named = list(self.named_parameters())
        if self.automatic_optimization:
            return self.build_optimizer(named)
        first = [(n, p) for n, p in named if not n.startswith("trunk.")]
        second = [(n, p) for n, p in named if n.startswith("trunk.")]
        opts = [self.build_optimizer(first), self.build_optimizer(second)]
        scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.8) for o in opts]
        return opts, scheds


MUON = dict(lr=0.05, weight_decay=0.01, momentum=0.9, nesterov=True)
ADAMW = dict(lr=0.02, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)


def muon_group(params: list) -> dict:
    return {"params": params, "kind": "muon", **MUON}


def adamw_group(params: list) -> dict:
    return {"params": params, "kind": "adamw", **ADAMW}


class TorchMuonAdamW(torch.optim.Optimizer):
    """The oracle: torch.optim.Muon on ``muon`` and torch.optim.AdamW on ``other``, stepped together (no distlab)."""

    def __init__(self, muon: list, other: list) -> None:
        self.parts = []
        if muon:
            self.parts.append(torch.optim.Muon(muon, **MUON))  # Newton-Schulz in bf16, as torch does
        if other:
            self.parts.append(torch.optim.AdamW(other, **ADAMW))
        super().__init__(
            [{"params": [p for o in self.parts for g in o.param_groups for p in g["params"]]}], {}
        )
        self.param_groups = [g for o in self.parts for g in o.param_groups]
        self.state = _JointState(self.parts)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for o in self.parts:
            o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.parts:
            o.zero_grad(set_to_none)

    def state_dict(self):
        return {"parts": [o.state_dict() for o in self.parts]}

    def load_state_dict(self, state_dict) -> None:
        for o, s in zip(self.parts, state_dict["parts"], strict=True):
            o.load_state_dict(s)


class _JointState(dict):
    def __init__(self, parts: list) -> None:
        super().__init__()
        for o in parts:
            self.update(o.state)


def oracle_module(combo: Combo) -> ZooModule:
    module = ZooModule(combo)
    module.oracle = True
    return module


# ---- what a run is compared on -------------------------------------------------------------------------------
def full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer under every name it has (tied ones twice), as full CPU tensors."""
    from torch.distributed.tensor import DTensor

    def full(t: torch.Tensor) -> torch.Tensor:
        return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()

    out = {n: full(p) for n, p in module.named_parameters(remove_duplicate=False)}
    out.update({n: full(b) for n, b in module.named_buffers(remove_duplicate=False)})
    return out


def ties(module: nn.Module) -> list[tuple[str, ...]]:
    """The names that share one parameter object (a tie), sorted."""
    by_id: dict[int, list[str]] = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(n)
    return sorted(tuple(sorted(names)) for names in by_id.values() if len(names) > 1)


@torch.no_grad()
def evaluate(combo: Combo, state: dict[str, torch.Tensor], stage: str) -> dict[str, float]:
    """The one-process reference of an evaluation: a fresh module holding ``state`` (one rank's weights and
    buffers), in eval mode, over every sample of each loader; the loss and accuracy averaged over samples, named as
    Lightning names them (``/dataloader_idx_i`` with several loaders)."""
    module = ZooModule(combo, perturb=False)
    module.configure_model()
    for name, t in [*module.named_parameters(remove_duplicate=False), *module.named_buffers()]:
        t.copy_(state[name])
    module.eval()
    prefix = "val" if stage == "validation" else "test"
    loaders = eval_loaders(combo, stage)
    out = {}
    for i, loader in enumerate(loaders):
        loss_sum, acc_sum, n = 0.0, 0.0, 0
        for batch in loader:
            ids, y = unpack(batch)
            logits = module(ids)
            size = len(ids)
            loss_sum += F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)).item() * size
            acc_sum += (logits.argmax(-1) == y).float().mean().item() * size
            n += size
        suffix = f"/dataloader_idx_{i}" if len(loaders) > 1 else ""
        out[f"{prefix}_loss{suffix}"] = loss_sum / n
        out[f"{prefix}_acc{suffix}"] = acc_sum / n
        if i == 1:
            out[f"{prefix}_loss_second"] = loss_sum / n
    out[f"{prefix}_epoch_end"] = 1.0
    return out


def finite(values: dict[str, float]) -> bool:
    return all(math.isfinite(v) for v in values.values())
