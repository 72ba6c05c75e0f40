"""DistMuonAdamW: Muon for hidden matrices and AdamW for the rest, with state and work split over ranks.

Communication: :class:`~distlab.optim.zero1_comm.Zero1Comm` (ZeRO-1) or :class:`~distlab.optim.fsdp2_comm.FSDP2Comm`
(FSDP2 shards); math: :mod:`distlab.optim.functional` (with one process, torch.optim.Muon / AdamW exactly). The
step's six phases: docs/internals.md, "DistMuonAdamW"; who averages the gradients: :meth:`DistMuonAdamW._resolve_mode`.

Example::

    opt = DistMuonAdamW([
        {"params": matrices, "kind": "muon", "lr": 0.02},
        {"params": others, "kind": "adamw", "lr": 3e-4},
    ])
    loss.backward(); opt.step(); opt.zero_grad()
    opt.consolidate_state_dict()          # collective, on every rank
    if rank == 0: torch.save(opt.state_dict(), "opt.pt")
    opt.load_state_dict(torch.load("opt.pt", weights_only=True))   # every rank, any world size
"""

from __future__ import annotations

import functools
import typing
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal, get_args

import torch
import torch.distributed as dist
from torch import Tensor
from torch.optim import Optimizer

from distlab.distributed import Pending, all_gather, any_rank, global_norm, resolved, world_info
from distlab.domains import (
    Checked,
    HalfOpenUnitInterval,
    NonNegative,
    NSSteps,
    Positive,
    check_domains,
    conforms,
    refusal,
)
from distlab.dtypes import dtype_name, parse_dtype
from distlab.errors import ConfigError
from distlab.log import info_rank0
from distlab.perf import default_ns_dtype, native_bf16_matmul

from .fsdp2_comm import FSDP2Comm, check_shards, comm_device, local, params_are_shards, shard_group
from .functional import (
    DEFAULT_NS_COEFFICIENTS,
    AdjustLrFn,
    NSCoefficients,
    adamw_foreach_,
    adamw_state,
    clip_coefficient,
    matrix_shape,
    muon_apply_foreach_,
    muon_momentum_foreach_,
    newton_schulz_flops,
    newton_schulz_stack,
    normuon_rows_,
    normuon_scales,
    per_iteration,
    quintic_newton_schulz,
    shape_scaled_lr,
    torch_scalar,
)
from .layout import Comm, Layout
from .zero1_comm import Zero1Comm

GRAD_SYNC_MODES = ("auto", "reduce", "averaged", "sharded")
GradSyncMode = Literal[GRAD_SYNC_MODES]  # type: ignore[valid-type]
Kind = Literal["muon", "adamw"]
KINDS: tuple[str, ...] = get_args(Kind)
NSDtypeArg = Literal["auto", "bfloat16", "bf16", "float32", "fp32"]
# Param groups are structured: each group's kind and hyperparameters are checked by add_param_group (_check_group).
ParamGroups = Annotated[Iterable[Any], Checked("add_param_group: each group's kind and hyperparameters")]
KindDefaults = Annotated[dict[str, dict[str, Any]], Checked("add_param_group, on every group they fill in")]
MUON_DEFAULTS: dict[str, Any] = dict(
    lr=1e-3,
    weight_decay=0.1,
    momentum=0.95,
    nesterov=True,
    ns_coefficients=DEFAULT_NS_COEFFICIENTS,
    eps=1e-7,
    ns_steps=5,
    adjust_lr_fn=None,
    normuon_beta2=None,
)
ADAMW_DEFAULTS: dict[str, Any] = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def _grad_checksum(params: list[Tensor], device: torch.device) -> Tensor:
    """(2,) float64: the sum of every gradient element, and their sum weighted by a fixed irrational pattern of
    their position over all params. Two ranks agree on both only when their gradients are the same (a plain sum
    also agrees for gradients that are permutations of each other, or differ in ways that cancel)."""
    out, offset = torch.zeros(2, dtype=torch.float64, device=device), 0
    for p in params:
        if p.grad is not None:
            g = p.grad.reshape(-1).to(device=device, dtype=torch.float64)
            pos = torch.arange(offset, offset + g.numel(), dtype=torch.float64, device=device)
            out[0] += g.sum()
            out[1] += torch.dot(g, pos.mul_(0.6180339887498949).frac_().add_(1.0))
        offset += p.numel()
    return out


def _listed(params: Any) -> list[Any]:
    return [params] if isinstance(params, Tensor) else list(params)


def _tensors(params: list[Any]) -> list[Tensor]:
    """Params may be given as (name, tensor) pairs, like torch.optim accepts."""
    return [p[1] if isinstance(p, tuple) else p for p in params]


def _check_other_kind(group: dict[str, Any], kind: str) -> None:
    """A setting of the other kind's groups would be kept and never read: a one-line ValueError."""
    own, other = (MUON_DEFAULTS, ADAMW_DEFAULTS) if kind == "muon" else (ADAMW_DEFAULTS, MUON_DEFAULTS)
    for key in group:
        if key in other and key not in own:
            raise ValueError(
                f"{key!r} is a setting of {'adamw' if kind == 'muon' else 'muon'} groups, not of {kind} groups, so it "
                "would be ignored; drop it, or put these params in a group of that kind"
            )


@functools.cache
def _declared_settings(kind: str) -> dict[str, Any]:
    """The group settings of ``kind`` and their declared domains, read from DistMuon / DistAdamW's signatures."""
    cls = DistMuon if kind == "muon" else DistAdamW
    keys = MUON_DEFAULTS if kind == "muon" else ADAMW_DEFAULTS
    return {k: tp for k, tp in typing.get_type_hints(cls.__init__).items() if k in keys}


def _check_group(group: dict[str, Any]) -> None:
    """Same checks as torch.optim.Muon / torch.optim.AdamW, one-line ValueErrors."""
    kind, lr = group["kind"], group["lr"]
    if isinstance(lr, Tensor) and lr.numel() != 1:
        raise ValueError(f"Tensor lr must be 1-element, got shape {tuple(lr.shape)}")
    if isinstance(lr, Tensor) and not 0.0 <= lr:
        raise ValueError(f"lr={lr.item()} is invalid for a {kind} group; set lr >= 0")
    # each setting against the domain DistMuon / DistAdamW declare for it
    for name, tp in _declared_settings(kind).items():
        if name in group and not conforms(tp, group[name]):
            raise ValueError(f"{refusal(name, group[name], tp, python=True)} (a {kind} param group)")
    if kind == "muon":
        if isinstance(group["ns_coefficients"][0], (tuple, list)):  # a triple per step: ns_steps of them
            per_iteration(group["ns_coefficients"], group["ns_steps"])
        for p in _tensors(group["params"]):
            if p.ndim < 2:
                raise ValueError(
                    f"muon params must be matrices (2-D, or N-D kernels used as (out, -1)), got a param of shape "
                    f"{tuple(p.shape)}; put it in a kind='adamw' group"
                )
    else:
        for flag in ("amsgrad", "maximize"):
            if group.get(flag):
                raise ValueError(f"{flag}=True is not supported by the distributed AdamW; set {flag}=False")


class DistMuonAdamW(Optimizer):
    """Muon for hidden matrices (and conv kernels) and AdamW for everything else, sharded ZeRO-1 style over ranks.

    Args:
        param_groups: dicts with "params" and "kind" ("muon" or "adamw") plus any hyperparameter of
            torch.optim.Muon / torch.optim.AdamW (missing ones take torch's defaults), and for Muon groups
            ``normuon_beta2`` (NorMuon) and per-iteration ``ns_coefficients`` (Polar Express): see :class:`DistMuon`.
        grad_sync: leave it at "auto" (see :meth:`_resolve_mode`). Explicit modes: "reduce" - the optimizer
            averages gradients itself (reduce_scatter); "averaged" - grads were already averaged (e.g. by DDP);
            "sharded" - params are FSDP2 DTensors (Shard(0)) whose grads FSDP2 already averaged.
        max_grad_norm: if set, clip the global grad norm (same as clip_grad_norm_ on the averaged grads);
            the pre-clip norm is exposed as ``self.last_grad_norm``.
        process_group: group to shard over (default WORLD; world size 1 if torch.distributed is not initialised).
        ns_dtype: Newton-Schulz dtype; None or "auto" -> bf16 where every rank's device multiplies bf16 in
            hardware (:func:`~distlab.perf.native_bf16_matmul`), else fp32; agreed at the first step.
        coalesce: True - a few reduce_scatters (runs of buckets, overlapping Newton-Schulz) and one all_gather per
            dtype per step for all pieces; False - one per piece,
            overlapping Newton-Schulz with communication; None (default) - True on gloo, else False.
        batch_ns: True - one batched Newton-Schulz chain per bucket of same-shape matrices a rank owns (fast; each
            result within a few ulp of the one-matrix iteration, not bit-equal); False - one matrix at a time
            (bit-equal to torch.optim.Muon); None (default) - batched on CUDA, one at a time elsewhere. Reproducible
            mode always goes one at a time (the bits must not depend on how many matrices share a rank).

    ``flops`` counts the Newton-Schulz matmul FLOPs this rank has computed (in ``flops_dtype``), for
    :class:`~distlab.callbacks.SpeedMonitor`.

    Example::

        opt = DistMuonAdamW([{"params": mats, "kind": "muon", "lr": 0.02}, {"params": rest, "kind": "adamw"}])
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
    """

    def __init__(
        self,
        param_groups: ParamGroups,
        *,
        grad_sync: GradSyncMode = "auto",
        max_grad_norm: Positive | None = None,
        process_group: dist.ProcessGroup | None = None,
        ns_dtype: torch.dtype | NSDtypeArg | None = None,
        coalesce: bool | None = None,
        batch_ns: bool | None = None,
        default_kind: Kind | None = None,
        kind_defaults: KindDefaults | None = None,
    ) -> None:
        check_domains(DistMuonAdamW.__init__, locals())
        self.grad_sync = grad_sync
        self.max_grad_norm = max_grad_norm
        self.process_group = process_group
        self.ns_dtype = parse_dtype(
            None if ns_dtype == "auto" else ns_dtype, "ns_dtype", allowed=(torch.bfloat16, torch.float32)
        )
        self._auto_ns_dtype: torch.dtype | None = None  # what None means, agreed by every rank at step 1
        self.coalesce = coalesce
        self.batch_ns = batch_ns
        self.last_grad_norm: Tensor | None = None
        self.flops = 0  # Newton-Schulz matmul FLOPs this rank has computed (SpeedMonitor reads it)
        self._default_kind = default_kind
        self._kind_defaults = {"muon": dict(MUON_DEFAULTS), "adamw": dict(ADAMW_DEFAULTS)}
        for kind, overrides in (kind_defaults or {}).items():
            if kind not in KINDS:
                raise ValueError(f"kind_defaults has a kind {kind!r}; the kinds are {KINDS}")
            unknown = [k for k in overrides if k not in self._kind_defaults[kind]]
            if unknown:  # (each value is checked in every group it fills in: add_param_group)
                raise ValueError(
                    f"kind_defaults[{kind!r}] sets {unknown}, which {kind} groups do not have; their settings are "
                    f"{sorted(self._kind_defaults[kind])}"
                )
            self._kind_defaults[kind].update(overrides)
        self._comm_cache: Comm | None = None
        self._same_shape: dict[tuple[int, ...], dict[tuple, list[int]]] = {}  # see _by_group_and_shape
        self.fixed_order: int | None = None  # reproducible mode (the strategy sets it): see _comm
        self._consolidated: tuple[int, dict[int, dict[str, Any]]] | None = None  # (to, full state) on `to`
        # each group's params listed once (a generator read twice would be empty the second time)
        param_groups = [
            {**g, "params": _listed(g["params"])} if isinstance(g, dict) and "params" in g else g
            for g in param_groups
        ]
        if not param_groups or all(isinstance(g, dict) and not g.get("params", [1]) for g in param_groups):
            raise ConfigError(
                f"{type(self).__name__} got no parameters to optimize (an empty list: every parameter frozen, or a "
                "filter that kept none); give it the parameters to train"
            )
        super().__init__(param_groups, {})

    # ---- configuration -------------------------------------------------------------------------------

    @property
    def grad_sync(self) -> str:
        """The requested mode ("auto" unless set); :attr:`mode` is the one in effect once resolved."""
        return self._grad_sync

    @grad_sync.setter
    def grad_sync(self, value: str) -> None:
        if value not in GRAD_SYNC_MODES:
            raise ValueError(f"grad_sync={value!r} is not supported; set one of {GRAD_SYNC_MODES}")
        self._grad_sync = value
        self._mode: str | None = None  # resolved (and checked) again on the next step
        self._sync_checked = False

    @property
    def mode(self) -> str | None:
        """The gradient-sync mode in effect: "reduce", "averaged" or "sharded"; None before the first step."""
        return self._mode

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        group = dict(param_group)
        group.setdefault("kind", self._default_kind)
        if group["kind"] is None:
            raise ConfigError(
                f"{type(self).__name__} needs each param group to say which update it gets (kind='muon' for hidden "
                "matrices, 'adamw' for the rest), and this one has no kind; build the groups with "
                "distlab.optim.muon_param_groups(model), or pass default_kind='muon' or 'adamw'"
            )
        if group["kind"] not in KINDS:
            raise ConfigError(
                f"param group kind={group['kind']!r} is not supported; set kind to one of {KINDS}"
            )
        _check_other_kind(group, group["kind"])
        for name, value in self._kind_defaults[group["kind"]].items():
            group.setdefault(name, value)
        group["params"] = _listed(group["params"])
        _check_group(group)
        seen = {id(p): i for i, g in enumerate(self.param_groups) for p in g["params"]}
        if (again := next((p for p in group["params"] if id(p) in seen), None)) is not None:
            raise ConfigError(
                f"a tensor of shape {tuple(again.shape)} is in param group {seen[id(again)]} and again in group "
                f"{len(self.param_groups)} (kind={group['kind']!r}); list each parameter in one group only "
                "(distlab.optim.muon_param_groups(model) splits a model into groups)"
            )
        super().add_param_group(group)
        self._comm_cache = None

    def _params(self) -> list[Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    # ---- step ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every param with a gradient on some rank (a rank without one contributes zeros)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._consolidated = None
        mode = self._resolve_mode()  # who averages the gradients (decided at the first step)
        comm = self._comm()  # ZeRO-1 or FSDP2 communication for this layout of the params over the ranks
        self._agree_ns_dtype(comm)
        L = comm.layout
        # 1. gradients: this rank's averaged gradient of each part it updates (a whole Muon matrix it owns, its
        #    slice of an AdamW param, or its FSDP2 shards), reduce-scattered unless already averaged
        sparse = next((p for p in L.params if p.grad is not None and p.grad.is_sparse), None)
        if sparse is not None:  # (torch's AdamW refuses them too; a reshape deep in the reduction would fail)
            raise ConfigError(
                f"{type(self).__name__}: a parameter of shape {tuple(sparse.shape)} has a sparse gradient (an "
                "nn.Embedding or EmbeddingBag built with sparse=True); these optimizers take dense gradients: build "
                "it with sparse=False"
            )
        active = any_rank([p.grad is not None for p in L.params], comm.group, comm.device)
        grads = comm.owned_gradients(active, reduce=mode == "reduce", coalesce=self.coalesce)
        # 2. clip by the global norm of the averaged gradients (the owned parts partition every param)
        if self.max_grad_norm is not None:
            grads = {j: resolved(g) for j, g in grads.items()}
            self.last_grad_norm = (
                comm.chunk_norms(grads).sum().sqrt()  # summed in one order at every world size
                if self.fixed_order
                else global_norm(list(grads.values()), comm.group, comm.device)
            )
            coef = clip_coefficient(self.last_grad_norm, self.max_grad_norm)
            grads = {j: g * coef.to(g.dtype) for j, g in grads.items()}
        # 3. Muon's momentum, one foreach call per bucket of same-shape matrices, as that bucket's gradients land
        updates = self._muon_updates(comm, grads)
        # 4. Newton-Schulz on whole matrices, on the rank that owns them: one batched call per bucket
        ortho = comm.orthogonalize(
            updates, self._newton_schulz, lambda j: self._resolved_ns_dtype(L.params[j])
        )
        # 5. AdamW's element-wise step on the owned parts (foreach, per group); Muon's final updates (NorMuon's
        #    normalised per row on the owner)
        parts = {j: comm.owned_part(j) for j in grads}
        self._adamw(comm, parts, grads)
        finals = self._muon_finals(comm, ortho)
        # 6. every rank ends with every updated param: ZeRO-1 all-gathers the AdamW parts and the Muon updates (in
        #    their own dtype: bf16 halves the bytes), which every rank applies to its whole copy with the same
        #    bits; FSDP2 applies them to its shards
        comm.gather(parts, finals, self._muon_update_dtype, self._muon_apply)
        return loss

    def _muon_updates(self, comm: Comm, grads: dict[int, Tensor | Pending]) -> dict[int, Tensor | Pending]:
        """Muon's update of each owned matrix (part): its momentum, one foreach call per bucket, run when the
        bucket's gradients are waited for (another bucket's reduction stays in flight meanwhile)."""
        L, out = comm.layout, {}
        for js in L.by_bucket(j for j in grads if L.kinds[j] == "muon"):
            if any(isinstance(grads[j], Pending) for j in js):
                bucket = Pending(
                    None, lambda js=js: self._muon_momentum(comm, js, [resolved(grads[j]) for j in js])
                )
                out.update({j: bucket.then(lambda us, i=i: us[i]) for i, j in enumerate(js)})
            else:
                out.update(zip(js, self._muon_momentum(comm, js, [grads[j] for j in js]), strict=True))
        return out

    def _muon_momentum(self, comm: Comm, js: list[int], gs: list[Tensor]) -> list[Tensor]:
        """Muon's momentum buffers of params ``js`` (one group; laid out like their owned parts) updated with
        gradients ``gs``; the updates."""
        bufs = []
        for j in js:
            state = self.state[comm.layout.params[j]]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(comm.state_like(j))
            bufs.append(local(state["momentum_buffer"]))
        group = self.param_groups[comm.layout.group_of[js[0]]]
        return muon_momentum_foreach_(gs, bufs, momentum=group["momentum"], nesterov=group["nesterov"])

    def _newton_schulz(self, js: list[int], stack: Tensor) -> Tensor:
        """torch's Newton-Schulz on the whole updates of params ``js`` (one bucket), stacked (B, ...), each as its
        2-D view (out, in) or, for a conv kernel, (out, in*kh*kw): one batched chain (``batch_ns``), or each matrix
        alone (torch's bits; reproducible mode, whose bits must not depend on how many share a rank). ``flops`` counts each matrix once."""
        L = self._comm_cache.layout  # built by the step that asks
        p, group = L.params[js[0]], self.param_groups[L.group_of[js[0]]]
        shape = matrix_shape(p)
        assert stack[0].numel() == shape[0] * shape[1], (
            f"Newton-Schulz on a shard {tuple(stack.shape)} of {shape}"
        )
        self.flops += len(js) * newton_schulz_flops(shape, group["ns_steps"])
        X = stack.reshape(len(js), *shape)  # (B, m, n)
        args = (group["ns_coefficients"], group["ns_steps"], group["eps"], self._resolved_ns_dtype(p))
        batched = self.batch_ns if self.batch_ns is not None else X.is_cuda
        if len(js) == 1 or self.fixed_order or not batched:
            return torch.stack([quintic_newton_schulz(x, *args) for x in X])
        return newton_schulz_stack(X, *args)

    def _muon_update_dtype(self, j: int) -> torch.dtype:
        """The dtype of Muon param j's final update (every rank knows it): Newton-Schulz's, or the param's for
        NorMuon (normalised in the param's dtype)."""
        p = self._comm_cache.layout.params[j]
        normuon = self.param_groups[self._comm_cache.layout.group_of[j]]["normuon_beta2"] is not None
        return p.dtype if normuon else self._resolved_ns_dtype(p)

    def _muon_finals(self, comm: Comm, ortho: dict[int, Tensor]) -> dict[int, Tensor]:
        """The final update of each Muon part this rank orthogonalised: as is, or (NorMuon groups) normalised per
        row, one call per group and shape; each in :meth:`_muon_update_dtype`."""
        L, out = comm.layout, {}
        for (gi, shape), js in self._by_group_and_shape(L, ortho).items():
            beta2, us = self.param_groups[gi]["normuon_beta2"], [ortho[j] for j in js]
            if beta2 is not None:
                us = self._normuon(comm, js, us, beta2, shape)
            dtype = self._muon_update_dtype(js[0])  # (one per group and shape)
            out.update((j, u if u.dtype == dtype else u.to(dtype)) for j, u in zip(js, us, strict=True))
        return out

    def _by_group_and_shape(self, L: Layout, js: Iterable[int]) -> dict[tuple, list[int]]:
        """Muon params ``js`` by (param group, matrix shape); kept per pattern of ``js`` (cleared with the layout)."""
        key = tuple(js)
        same = self._same_shape.get(key)
        if same is None:
            if len(self._same_shape) > 64:  # (patterns of which params have gradients come and go)
                self._same_shape.clear()
            same = self._same_shape[key] = {}
            for j in key:
                same.setdefault((L.group_of[j], matrix_shape(L.params[j])), []).append(j)
        return same

    def _muon_apply(self, targets: dict[int, Tensor], updates: dict[int, Tensor]) -> None:
        """Decoupled weight decay and the final update, scaled for the whole matrix, in place on ``targets`` (whole
        params, or FSDP2 shards laid out like ``updates``): one foreach pair per group and shape."""
        L = self._comm_cache.layout
        for (gi, shape), js in self._by_group_and_shape(L, updates).items():
            group = self.param_groups[gi]
            lr = torch_scalar(group["lr"])
            muon_apply_foreach_(
                [targets[j] for j in js],
                [u if (u := updates[j]).shape == targets[j].shape else u.view(targets[j].shape) for j in js],
                lr=lr,
                weight_decay=group["weight_decay"],
                scaled_lr=shape_scaled_lr(lr, group["adjust_lr_fn"], shape),
            )

    def _normuon(
        self, comm: Comm, js: list[int], updates: list[Tensor], beta2: float, shape: tuple
    ) -> list[Tensor]:
        """NorMuon's updates of params ``js`` (one group and shape) from their orthogonalised ones: normalised per
        row by the rows' running second moments (state "normuon_v", (rows, 1) laid out like the owned rows), then
        rescaled to an orthogonal matrix's norm (summed over the shards holding its rows), so that ``adjust_lr_fn``
        sizes the step as it does Muon's ("match_rms_adamw": the paper's RMS 0.2)."""
        L, moments = comm.layout, []
        for j in js:
            state = self.state[L.params[j]]
            if "normuon_v" not in state:
                state["normuon_v"] = comm.row_state(j)
            moments.append(local(state["normuon_v"]))
        rows = [u.to(L.params[j].dtype).flatten(1) for u, j in zip(updates, js, strict=True)]  # (rows, cols)
        normed = normuon_rows_(rows, moments, beta2=beta2)
        scales = normuon_scales(comm.sum_over_shards(torch.stack([n.square().sum() for n in normed])), shape)
        return [(n * c).view(u.shape) for n, c, u in zip(normed, scales, updates, strict=True)]

    def _adamw(self, comm: Comm, parts: dict[int, Tensor], grads: dict[int, Tensor | Pending]) -> None:
        """torch.optim.AdamW's math on the owned parts (state laid out like them): one foreach chain per group whose
        params took the same number of steps (a param that missed steps goes alone)."""
        L = comm.layout
        by_group: dict[int, list[int]] = {}
        for j in grads:
            if L.kinds[j] == "adamw":
                by_group.setdefault(L.group_of[j], []).append(j)
        for gi, js in by_group.items():
            group = self.param_groups[gi]
            states = []
            for j in js:
                state = self.state[L.params[j]]
                if len(state) == 0:
                    state.update(adamw_state(comm.state_like(j)))
                states.append(state)
            steps = [s["step"] for s in states]
            runs = [list(range(len(js)))]
            if len(steps) > 1 and not bool((torch.stack(steps) == steps[0]).all()):
                runs = [[i] for i in range(len(js))]
            for run in runs:
                adamw_foreach_(
                    [parts[js[i]] for i in run],
                    [resolved(grads[js[i]]) for i in run],
                    steps=[steps[i] for i in run],
                    exp_avgs=[local(states[i]["exp_avg"]) for i in run],
                    exp_avg_sqs=[local(states[i]["exp_avg_sq"]) for i in run],
                    lr=torch_scalar(group["lr"]),
                    betas=group["betas"],
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                )

    # ---- who does what -------------------------------------------------------------------------------

    def _comm(self) -> Comm:
        """The communication for these params: FSDP2 shards or ZeRO-1, over their group, with the ownership of
        every param for this world size and rank (rebuilt when the params or the world change)."""
        params = self._params()
        sharded = params_are_shards(params)
        group = shard_group(params[0]) if sharded else self.process_group
        world, rank = world_info(group)
        comm = self._comm_cache
        if (
            comm is None
            or isinstance(comm, FSDP2Comm) != sharded
            or comm.group is not group
            or (comm.layout.world, comm.layout.rank, comm.layout.align) != (world, rank, self.fixed_order)
        ):
            if self.fixed_order and (sharded or self.fixed_order % world):
                raise ConfigError(
                    f"fixed_order={self.fixed_order} (reproducible mode) needs ZeRO-1 over a number of ranks that "
                    f"divides it, got {'FSDP2 shards' if sharded else f'{world} ranks'}"
                )
            # fixed_order: reductions in one fixed order, AdamW slices of whole chunks (the same sums at every W)
            layout = Layout.build(self.param_groups, world, rank, align=self.fixed_order)
            self._same_shape.clear()
            comm = self._comm_cache = FSDP2Comm(layout) if sharded else Zero1Comm(layout, group)
        return comm

    def _resolved_ns_dtype(self, p: Tensor) -> torch.dtype:
        if self.ns_dtype is not None:
            return self.ns_dtype
        if self._auto_ns_dtype is not None:
            return self._auto_ns_dtype
        return default_ns_dtype(p.device)  # before the first step (flops_dtype): this rank's own reading

    def _agree_ns_dtype(self, comm: Comm) -> None:
        """Collective, once: what ns_dtype=None means, the same on every rank (bf16 only if every rank's
        Newton-Schulz device multiplies bf16 in hardware)."""
        if self.ns_dtype is not None or self._auto_ns_dtype is not None:
            return
        first = self._first_muon_param()
        if first is None:
            return
        device = comm_device(comm.group, local(first))
        # over the params' groups (HSDP's replicas too), never WORLD: any over each mesh dimension = any over the mesh
        lacking = not native_bf16_matmul(device)
        for group in comm.job_groups:
            lacking = any_rank([lacking], group, device)[0]
        self._auto_ns_dtype = torch.float32 if lacking else torch.bfloat16
        why = (
            "some rank's device has no native bf16 matmul"
            if lacking
            else "every rank multiplies bf16 natively"
        )
        info_rank0(
            f"DistMuonAdamW: Newton-Schulz in {dtype_name(self._auto_ns_dtype)} ({why}; set ns_dtype to choose)"
        )

    def _first_muon_param(self) -> Tensor | None:
        return next((p for g in self.param_groups if g["kind"] == "muon" for p in g["params"]), None)

    @property
    def flops_dtype(self) -> torch.dtype | None:
        """The dtype of the matmuls ``flops`` counts (Newton-Schulz's, resolved on the first Muon param), so
        :class:`~distlab.callbacks.SpeedMonitor` measures them against that dtype's peak; None without Muon."""
        first = self._first_muon_param()
        return None if first is None else self._resolved_ns_dtype(first)

    def _resolve_mode(self) -> str:
        """Who averages the gradients, before each update: FSDP2 DTensor params -> "sharded"; one process ->
        "reduce"; an explicit mode is obeyed ("averaged" is checked once). ``auto`` on several ranks compares one
        float64 gradient checksum per rank at every step: identical (a DDP wrapper averaged them) -> "averaged",
        else "reduce"."""
        if self._sync_checked:
            return self._mode
        requested, params = self.grad_sync, self._params()
        if params_are_shards(params) or requested == "sharded":  # FSDP2 already averaged into local shards
            if requested not in ("auto", "sharded"):
                raise ValueError(
                    f"grad_sync={requested!r} but the params are FSDP2 DTensor shards whose gradients FSDP2 "
                    "already averaged; leave grad_sync='auto' (or set 'sharded')"
                )
            check_shards(self.param_groups)
            requested = "sharded"
        if requested in ("sharded", "reduce") or world_info(self.process_group)[0] == 1:
            self._mode, self._sync_checked = ("reduce" if requested == "auto" else requested), True
            return self._mode
        device = params[0].device
        sums = all_gather(_grad_checksum(params, device).unsqueeze(0), self.process_group)  # (W, 2)
        identical, nonzero = bool((sums == sums[0]).all()), bool((sums != 0).any())
        if requested == "averaged":
            if not identical:
                raise RuntimeError(
                    f"grad_sync='averaged' but gradients differ across ranks (checksums {sums.tolist()}): nothing "
                    "averaged them; leave grad_sync='auto' (the optimizer then averages them) or wrap the model in DDP"
                )
            self._mode, self._sync_checked = requested, True
            return self._mode
        mode = "averaged" if identical and nonzero else "reduce"
        if self._mode is None and nonzero:
            said = (
                "already averaged (a DDP wrapper): no second average"
                if identical
                else "differ: averaged here"
            )
            info_rank0(
                f"DistMuonAdamW: gradients {said} across {len(sums)} ranks (grad_sync='auto', checked every step)"
            )
        self._mode = mode
        return mode

    # ---- checkpoints ---------------------------------------------------------------------------------

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Collective (call on every rank): assemble the full, torch-format state on rank ``to``.

        Nothing to do with one process or FSDP2 shards (their state_dict() needs no gather)."""
        comm = self._comm()
        self._consolidated = None
        if comm.gathers_state:
            self._consolidated = (to, comm.consolidate_state(self._states(comm), to))

    def _states(self, comm: Comm) -> list[dict[str, Any]]:
        """This rank's state of every param, in the layout's order (empty where it holds none)."""
        return [self.state.get(p, {}) for p in comm.layout.params]

    def state_dict(self) -> dict[str, Any]:
        """Full, world-size-independent state in torch's format (after consolidate_state_dict() when W > 1).

        FSDP2 params: torch's format with DTensor values sharded like the params, exactly what
        ``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` and DCP expect (no gather).
        """
        comm = self._comm()
        L = comm.layout
        if not comm.gathers_state:
            state = comm.full_state(self._states(comm))
        elif self._consolidated is None:
            raise RuntimeError(
                f"state_dict() with world size {L.world} needs the sharded state gathered first; "
                "call optimizer.consolidate_state_dict() on every rank before state_dict()"
            )
        elif (to := self._consolidated[0]) != L.rank:
            raise RuntimeError(
                f"the consolidated state lives on rank {to}, but state_dict() was called on rank {L.rank}"
            )
        else:
            state = self._consolidated[1]
        groups, start = [], 0
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            groups.append(packed)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a full state (ours or torch.optim.Muon/AdamW's), keeping only the shards this rank owns."""
        saved_groups = state_dict["param_groups"]
        fix = (
            " (saved by another optimizer or model setting): resume with the settings it was trained with (its "
            "config.yaml), or start a new fit from its weights"
        )
        if len(saved_groups) != len(self.param_groups):
            raise ConfigError(
                f"the checkpoint's optimizer state has {len(saved_groups)} param groups, this optimizer "
                f"{len(self.param_groups)}{fix}"
            )
        id_to_param: dict[Any, Tensor] = {}
        for group, saved in zip(self.param_groups, saved_groups, strict=True):
            if len(saved["params"]) != len(group["params"]):
                raise ConfigError(
                    f"a saved param group has {len(saved['params'])} params, this optimizer's {len(group['params'])}{fix}"
                )
            if saved.get("kind", group["kind"]) != group["kind"]:
                raise ConfigError(
                    f"the checkpoint's optimizer state has a {saved['kind']!r} group where this optimizer has "
                    f"{group['kind']!r}{fix}"
                )
            id_to_param.update(zip(saved["params"], group["params"], strict=True))
            group.update({k: v for k, v in saved.items() if k not in ("params", "kind")})
            _check_group(group)
        comm = self._comm()
        index = {id(p): j for j, p in enumerate(comm.layout.params)}
        self.state = defaultdict(dict)
        for pid, saved in state_dict["state"].items():
            p = id_to_param[pid]
            kept = comm.owned_state(index[id(p)], saved)
            if kept is not None:
                self.state[p] = kept
        self._consolidated = None


def _groups_of_kind(params: Iterable[Any], kind: str) -> list[dict[str, Any]]:
    params = list(params)
    if params and isinstance(params[0], dict):
        return [{**g, "kind": g.get("kind", kind)} for g in params]
    return [{"params": params, "kind": kind}]


class DistMuon(DistMuonAdamW):
    """torch.optim.Muon's arguments, distributed (every group is kind "muon"; params must be >= 2-D, kernels
    are orthogonalised as their (out, in*kh*kw) view).

    Example::

        opt = DistMuon([p for p in model.parameters() if p.ndim == 2], lr=0.02, momentum=0.95)
        # Polar Express: one quintic per iteration (torch.optim.Muon takes one triple only)
        opt = DistMuon(matrices, lr=0.02, ns_coefficients=POLAR_EXPRESS_COEFFICIENTS, ns_steps=5)
        # NorMuon: each row of the orthogonalised update divided by its running RMS (second moment, beta2), then
        # sized like Muon's; "match_rms_adamw" gives the paper's step (RMS 0.2); state "normuon_v" (rows, 1)
        opt = DistMuon(matrices, lr=0.02, normuon_beta2=0.95, adjust_lr_fn="match_rms_adamw")
    """

    def __init__(
        self,
        params: ParamGroups,
        lr: NonNegative | Tensor = 1e-3,
        weight_decay: NonNegative = 0.1,
        momentum: HalfOpenUnitInterval = 0.95,
        nesterov: bool = True,
        ns_coefficients: NSCoefficients = DEFAULT_NS_COEFFICIENTS,
        eps: Positive = 1e-7,
        ns_steps: NSSteps = 5,
        adjust_lr_fn: AdjustLrFn | None = None,
        normuon_beta2: HalfOpenUnitInterval | None = None,
        *,
        grad_sync: GradSyncMode = "auto",
        max_grad_norm: Positive | None = None,
        process_group: dist.ProcessGroup | None = None,
        ns_dtype: torch.dtype | NSDtypeArg | None = None,
        coalesce: bool | None = None,
        batch_ns: bool | None = None,
    ) -> None:
        check_domains(DistMuon.__init__, locals())
        defaults = {k: v for k, v in locals().items() if k in MUON_DEFAULTS}  # the group settings above
        super().__init__(
            _groups_of_kind(params, "muon"),
            grad_sync=grad_sync,
            max_grad_norm=max_grad_norm,
            process_group=process_group,
            ns_dtype=ns_dtype,
            coalesce=coalesce,
            batch_ns=batch_ns,
            default_kind="muon",
            kind_defaults={"muon": defaults},
        )


class DistAdamW(DistMuonAdamW):
    """torch.optim.AdamW's arguments, distributed ZeRO-1 (each rank keeps a 1/W flat slice of the moments).

    Example::

        opt = DistAdamW(model.parameters(), lr=3e-4, weight_decay=0.01, max_grad_norm=1.0)
    """

    def __init__(
        self,
        params: ParamGroups,
        lr: NonNegative | Tensor = 1e-3,
        betas: tuple[HalfOpenUnitInterval, HalfOpenUnitInterval] = (0.9, 0.999),
        eps: Positive = 1e-8,
        weight_decay: NonNegative = 0.01,
        *,
        grad_sync: GradSyncMode = "auto",
        max_grad_norm: Positive | None = None,
        process_group: dist.ProcessGroup | None = None,
        coalesce: bool | None = None,
    ) -> None:
        check_domains(DistAdamW.__init__, locals())
        super().__init__(
            _groups_of_kind(params, "adamw"),
            grad_sync=grad_sync,
            max_grad_norm=max_grad_norm,
            process_group=process_group,
            coalesce=coalesce,
            default_kind="adamw",
            kind_defaults={"adamw": dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)},
        )
