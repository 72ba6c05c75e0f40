"""Split any model's parameters into Muon and AdamW groups, every trainable parameter exactly once.

Roles, first match wins:

1. a name matching a pattern in ``adamw`` -> "adamw"; in ``muon`` -> "muon" (fnmatch globs over
   ``model.named_parameters()`` names; a pattern that matches no name is a ValueError);
2. a weight of an ``nn.Embedding`` / ``nn.EmbeddingBag`` -> "embedding";
3. the weight of the head -> "head": with ``head="auto"`` the last Linear / conv module in ``model.modules()``
   order, or the modules whose names match the given patterns, or none (``head=None``);
4. any other tensor with ``ndim >= 2`` -> "muon" (conv kernels as their 2-D view); the rest -> "adamw".

A tensor tied across modules takes the first role any module holding it gives. Frozen parameters are left out.

Example::

    groups = muon_param_groups(model, lr=0.02, adamw_lr=3e-4)   # Muon (hidden) + AdamW (the rest)
    opt = DistMuonAdamW(groups)
    roles = split_params(model, head=["classifier"])              # {"muon": [(name, p)], ...}
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any, Literal

from torch import nn

from distlab.domains import HalfOpenUnitInterval, NonEmptyText, NonNegative, Positive, check_domains
from distlab.errors import ConfigError
from distlab.log import info_rank0

ROLES = ("muon", "embedding", "head", "adamw")
_HEAD_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_EMBEDDING_TYPES = (nn.Embedding, nn.EmbeddingBag)


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatchcase(name, pat) for pat in patterns)


def _head_modules(model: nn.Module, head: Literal["auto"] | Sequence[str] | None) -> set[int]:
    """ids of the modules whose weights are the output head."""
    if head is None:
        return set()
    named = list(model.named_modules())
    if head == "auto":
        last = [m for _, m in named if isinstance(m, _HEAD_TYPES)]
        return {id(last[-1])} if last else set()
    patterns = [head] if isinstance(head, str) else list(head)
    found = {id(m) for name, m in named if _matches(name, patterns)}
    if not found:
        raise ValueError(
            f"head={patterns!r} matches no module of {type(model).__name__}; use a module name such as "
            f"{named[-1][0]!r}, 'auto', or None"
        )
    return found


def split_params(
    model: nn.Module,
    *,
    muon: Sequence[NonEmptyText] = (),
    adamw: Sequence[NonEmptyText] = (),
    head: Literal["auto"] | Sequence[NonEmptyText] | None = "auto",
) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """{role: [(name, param), ...]} for ``ROLES``; see the module docstring for the rules."""
    check_domains(split_params, locals())
    names = [name for name, _ in model.named_parameters()]
    for option, patterns in (("muon", muon), ("adamw", adamw)):
        for pattern in patterns:
            if not any(fnmatchcase(name, pattern) for name in names):  # a typo would silently change nothing
                raise ValueError(
                    f"{option}={list(patterns)!r}: {pattern!r} matches no parameter of {type(model).__name__} (its "
                    f"names are like {names[:3]!r}); give fnmatch patterns over those names"
                )
    heads = _head_modules(model, head)
    # param id -> every module that registers it: a tied tensor has the role of any of them
    holders: dict[int, list[nn.Module]] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            holders.setdefault(id(p), []).append(module)
    roles: dict[str, list[tuple[str, nn.Parameter]]] = {role: [] for role in ROLES}
    for name, p in model.named_parameters():  # each tensor once, under its first name
        if not p.requires_grad:
            continue
        held = holders[id(p)]
        if _matches(name, adamw):
            role = "adamw"
        elif _matches(name, muon):
            if p.ndim < 2:
                raise ValueError(
                    f"muon pattern matched {name!r} of shape {tuple(p.shape)}; Muon needs >= 2-D"
                )
            role = "muon"
        elif any(isinstance(m, _EMBEDDING_TYPES) for m in held):
            role = "embedding"
        elif any(id(m) in heads and p is getattr(m, "weight", None) for m in held):
            role = "head"
        else:
            role = "muon" if p.ndim >= 2 else "adamw"
        roles[role].append((name, p))
    return roles


def muon_param_groups(
    model: nn.Module,
    *,
    lr: NonNegative = 0.02,
    momentum: HalfOpenUnitInterval = 0.95,
    weight_decay: NonNegative = 0.0,
    adamw_lr: NonNegative = 3e-4,
    embedding_lr: NonNegative | None = None,
    head_lr: NonNegative | None = None,
    adamw_betas: tuple[HalfOpenUnitInterval, HalfOpenUnitInterval] = (0.9, 0.95),
    adamw_eps: Positive = 1e-8,
    adamw_weight_decay: NonNegative = 0.0,
    muon: Sequence[NonEmptyText] = (),
    adamw: Sequence[NonEmptyText] = (),
    head: Literal["auto"] | Sequence[NonEmptyText] | None = "auto",
    verbose: bool = True,
) -> list[dict[str, Any]]:
    """Param groups for :class:`distlab.optim.DistMuonAdamW`: one "muon" group, then AdamW groups named
    "embedding", "head" and "adamw" (empty groups left out). ``embedding_lr`` / ``head_lr`` default to
    ``adamw_lr``. With ``verbose`` rank 0 logs one line of counts."""
    check_domains(muon_param_groups, locals())
    roles = split_params(model, muon=muon, adamw=adamw, head=head)
    frozen = sum(1 for p in model.parameters() if not p.requires_grad)
    if not any(roles.values()):
        raise ConfigError(
            f"muon_param_groups({type(model).__name__}): every parameter is frozen ({frozen} tensors with "
            "requires_grad=False), so there is nothing to train; unfreeze what should train (requires_grad_(True))"
            if frozen
            else f"muon_param_groups({type(model).__name__}): the model has no parameters; give it the module to train"
        )
    adamw_kw = dict(kind="adamw", betas=tuple(adamw_betas), eps=adamw_eps, weight_decay=adamw_weight_decay)
    lrs = {  # `is None`, not `or`: an lr of 0.0 (a frozen embedding or head) is a value, not "unset"
        "embedding": adamw_lr if embedding_lr is None else embedding_lr,
        "head": adamw_lr if head_lr is None else head_lr,
        "adamw": adamw_lr,
    }
    groups: list[dict[str, Any]] = []
    if roles["muon"]:
        params = [p for _, p in roles["muon"]]
        groups.append(
            dict(name="muon", kind="muon", params=params, lr=lr, momentum=momentum, weight_decay=weight_decay)
        )
    for role in ROLES[1:]:  # embedding, head, adamw
        if roles[role]:
            groups.append(dict(adamw_kw, name=role, params=[p for _, p in roles[role]], lr=lrs[role]))
    if verbose:  # one line: how many tensors / parameters went to Muon and to AdamW (by role)
        count = lambda ms: f"{len(ms)} tensors ({sum(p.numel() for _, p in ms) / 1e6:.2f}M params)"  # noqa: E731
        adamw_members = [m for role in ROLES[1:] for m in roles[role]]
        by_role = ", ".join(f"{role} {len(roles[role])}" for role in ROLES[1:])
        info_rank0(
            f"muon_param_groups({type(model).__name__}): Muon {count(roles['muon'])} | AdamW {count(adamw_members)}: "
            f"{by_role}" + (f" | frozen {frozen} tensors" if frozen else "")
        )
    return groups
