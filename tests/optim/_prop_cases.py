"""Drawn optimizer cases and their torch oracle, for tests/optim/test_properties.py and its rank jobs.

A :class:`Case` is one optimizer construction (``DistMuonAdamW`` / ``DistMuon`` / ``DistAdamW``), every public
argument drawn from the domain its signature declares (tests/optim/_strategies.py), plus per-group overrides,
param shapes (matrices, conv kernels, one row, fewer rows than ranks; scalars and vectors for AdamW), a world
size, a layout (ZeRO-1 whole params or FSDP2 ``fully_shard``), how the gradients reach the optimizer, and
missing gradients. :func:`oracle_run` is the reference: torch.optim.Muon / torch.optim.AdamW on one process
(conv kernels as their (out, in*kh*kw) view), fed the average of the ranks' gradients, after
``torch.nn.utils.clip_grad_norm_`` when ``max_grad_norm`` is set. torch.optim.Muon runs Newton-Schulz in bf16
only; for fp32 the oracle is :class:`~tests.helpers.optim_cases.ReferenceMuon`, torch's algorithm written out
with the dtype as a parameter (checked equal to torch.optim.Muon in bf16 by test_properties). No distlab code
computes a reference.

Gradients are integers / 64 times a power of two, so the sum over ranks is exact in any order and the
distributed optimizer sees the same averaged gradient as the oracle: without clipping the comparison is
bit-for-bit.
"""

from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st
from torch import Tensor

from distlab.optim import DistAdamW, DistMuon, DistMuonAdamW
from tests.helpers.optim_cases import ReferenceMuon, host_has_native_bf16
from tests.optim._strategies import signature_strategies, subset_of

CLASSES = {c.__name__: c for c in (DistMuonAdamW, DistMuon, DistAdamW)}
ORACLES = {"muon": torch.optim.Muon, "adamw": torch.optim.AdamW}
# Supplied by the harness, not drawn from their annotation: the params, the group to shard over, who averages
# (it follows from the layout and how gradients are fed: every value of the Literal is covered, see
# MODES_BY_LAYOUT), and DistMuonAdamW's kind_defaults (a dict of each kind's drawn hyperparameters).
HARNESS = frozenset({"params", "param_groups", "process_group", "grad_sync", "kind_defaults"})
# What the oracle does with each optimizer-level (keyword-only) option; one it does not know fails loudly.
ORACLE_OPTIONS = {
    "max_grad_norm": "clip_grad_norm_ on the averaged gradients, then the torch optimizers",
    "ns_dtype": "torch.optim.Muon (bf16) or ReferenceMuon (fp32); None/'auto': bf16 iff the host has native bf16",
    "coalesce": "no effect on the result (the same bytes in fewer or more collectives)",
    "batch_ns": "True: torch's math within batched_tol (a batched chain rounds the last bits otherwise); None on "
    "CPU and False: bit-equal",
    "default_kind": "groups without a 'kind' get it",
}
MODES_BY_LAYOUT = {"zero1": ("auto", "reduce", "averaged"), "fsdp2": ("auto", "sharded")}
KIND_OF = {"DistMuon": "muon", "DistAdamW": "adamw"}  # the single-kind classes
STEPS = 3  # momentum and Adam's moments matter from the second step


# Hyperparameters torch's optimizers lack (variants with an oracle of their own, named here): held at their defaults
# in these properties, whose oracle is torch's.
BEYOND_TORCH = {"normuon_beta2": "tests/optim/test_dist_optim.py::test_normuon_matches_the_papers_algorithm"}


def hyper_names(cls: type) -> list[str]:
    """A single-kind class's per-group hyperparameters torch's optimizer shares: its positional parameters after
    ``params``, less :data:`BEYOND_TORCH`."""
    params = inspect.signature(cls.__init__).parameters.values()
    skip = ("self", "params", *BEYOND_TORCH)
    return [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in skip]


def option_names(cls: type) -> list[str]:
    """Optimizer-level options: the keyword-only parameters the harness does not supply."""
    params = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name not in HARNESS]


@functools.cache
def hyper_strategies(kind: str) -> dict[str, st.SearchStrategy]:
    cls = DistMuon if kind == "muon" else DistAdamW
    return {
        n: s for n, s in signature_strategies(cls.__init__, skip=HARNESS).items() if n in hyper_names(cls)
    }


@functools.cache
def option_strategies(cls: type) -> dict[str, st.SearchStrategy]:
    return {
        n: s for n, s in signature_strategies(cls.__init__, skip=HARNESS).items() if n in option_names(cls)
    }


# ---- shapes --------------------------------------------------------------------------------------------

ROWS = st.sampled_from([1, 2, 3, 4, 5, 7])  # one row; fewer rows than ranks; not divisible by 2 or 3
COLS = st.integers(1, 6)
SMALL = st.integers(1, 3)


def muon_shapes() -> st.SearchStrategy[tuple[int, ...]]:
    return st.one_of(
        st.tuples(ROWS, COLS),  # a Linear weight
        st.tuples(ROWS, SMALL, SMALL),  # a Conv1d kernel
        st.tuples(ROWS, SMALL, SMALL, SMALL),  # a Conv2d kernel
    )


def adamw_shapes(layout: str) -> st.SearchStrategy[tuple[int, ...]]:
    vector = st.tuples(st.integers(1, 9))
    options = [vector, st.tuples(ROWS, COLS), st.tuples(ROWS, SMALL, SMALL, SMALL)]
    if layout == "zero1":  # FSDP2 cannot Shard(0) a 0-d tensor (nor does it produce one)
        options.insert(0, st.just(()))
    return st.one_of(*options)


# ---- a case --------------------------------------------------------------------------------------------


@dataclass
class Case:
    cls: str  # "DistMuonAdamW" | "DistMuon" | "DistAdamW"
    layout: str  # "zero1" | "fsdp2"
    world: int
    grad_sync: str  # requested
    feed: str  # "per_rank": rank r's own gradient (mean = the oracle's) | "averaged": every rank the mean
    groups: list[dict[str, Any]]  # {"kind", "shapes", "overrides", "omit_kind"}
    options: dict[str, Any]  # drawn keyword-only options (max_grad_norm, ns_dtype, coalesce, default_kind)
    hyper: dict[str, Any]  # single-kind classes: drawn constructor hyperparameters
    kind_defaults: dict[str, dict[str, Any]] | None  # DistMuonAdamW only
    as_groups: bool  # single-kind classes: params passed as group dicts (with overrides) or as a list
    seed: int
    grad_scale: float  # a power of two
    missing: dict[int, str] = field(default_factory=dict)  # param index -> "one_rank@1" | "all@1" | "all@0"
    steps: int = STEPS

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [s for g in self.groups for s in g["shapes"]]

    @property
    def kinds(self) -> list[str]:
        return [g["kind"] for g in self.groups for _ in g["shapes"]]

    def describe(self) -> str:
        """The case as the call a user would write (for failure messages)."""
        groups = [
            {"shapes": g["shapes"], **({} if g["omit_kind"] else {"kind": g["kind"]}), **g["overrides"]}
            for g in self.groups
        ]
        kw = {**self.hyper, **self.options}
        if self.kind_defaults is not None:
            kw["kind_defaults"] = self.kind_defaults
        args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
        return (
            f"{self.cls}({groups if self.as_groups or self.cls == 'DistMuonAdamW' else self.shapes}, "
            f"grad_sync={self.grad_sync!r}, {args}) | {self.layout} world={self.world} feed={self.feed} "
            f"seed={self.seed} grad_scale={self.grad_scale} missing={self.missing}"
        )


@st.composite
def cases(draw, layout: str, world: int, cls: str) -> Case:
    """One drawn case of class ``cls`` for this layout and world size."""
    kinds = [KIND_OF[cls]] if cls in KIND_OF else ["muon", "adamw"]
    options = draw(subset_of(option_strategies(CLASSES[cls])))
    n_groups = draw(st.integers(1, 3 if cls == "DistMuonAdamW" or draw(st.booleans()) else 1))
    groups = []
    for _ in range(n_groups):
        kind = draw(st.sampled_from(kinds))
        pool = draw(
            st.lists(muon_shapes() if kind == "muon" else adamw_shapes(layout), min_size=1, max_size=2)
        )
        shapes = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))  # repeats: Muon chunks of W
        overrides = draw(subset_of(hyper_strategies(kind)))
        omit = kind == options.get("default_kind") and draw(st.booleans())  # default_kind supplies it
        groups.append({"kind": kind, "shapes": shapes, "overrides": overrides, "omit_kind": omit})
    if cls == "DistMuonAdamW":
        hyper, as_groups = {}, True
        kind_defaults = draw(
            st.none() | st.fixed_dictionaries({k: subset_of(hyper_strategies(k)) for k in kinds})
        )
    else:
        hyper = draw(subset_of(hyper_strategies(kinds[0])))
        as_groups, kind_defaults = draw(st.booleans()) or len(groups) > 1, None
        for g in groups:
            g["omit_kind"] = draw(st.booleans())  # _groups_of_kind supplies it
            if not as_groups:
                g["overrides"] = {}
    grad_sync = draw(st.sampled_from(MODES_BY_LAYOUT[layout]))
    if layout == "fsdp2":
        feed = "per_rank"  # FSDP2's reduce-scatter averages them
    elif grad_sync == "auto":
        feed = draw(st.sampled_from(["per_rank", "averaged"]))
    else:
        feed = "per_rank" if grad_sync == "reduce" else "averaged"
    n_params = sum(len(g["shapes"]) for g in groups)
    patterns = ["all@1", "all@0"] + (["one_rank@1"] if feed == "per_rank" and layout == "zero1" else [])
    missing = draw(st.dictionaries(st.integers(0, n_params - 1), st.sampled_from(patterns), max_size=2))
    return Case(
        cls=cls,
        layout=layout,
        world=world,
        grad_sync=grad_sync,
        feed=feed,
        groups=groups,
        options=options,
        hyper=hyper,
        kind_defaults=kind_defaults,
        as_groups=as_groups,
        seed=draw(st.integers(0, 2**20)),
        grad_scale=draw(st.sampled_from([2.0**-8, 1.0, 2.0**8])),
        missing=missing,
    )


# ---- inputs both sides share ---------------------------------------------------------------------------


def init_params(case: Case) -> list[Tensor]:
    return [
        torch.randn(s, generator=torch.Generator().manual_seed(case.seed * 100 + j))
        for j, s in enumerate(case.shapes)
    ]


def rank_grads(case: Case, step: int, rank: int) -> list[Tensor | None]:
    """Rank ``rank``'s own gradients at ``step`` (None: this rank has none for that param)."""
    out: list[Tensor | None] = []
    for j, s in enumerate(case.shapes):
        pattern = case.missing.get(j, "")
        if pattern == f"all@{step}" or (pattern == f"one_rank@{step}" and rank == 1):
            out.append(None)
            continue
        g = torch.Generator().manual_seed(((case.seed * 7 + step) * 5 + rank) * 1000 + j)
        out.append(torch.randint(-64, 65, s, generator=g).float() / 64 * case.grad_scale)
    return out


def mean_grads(case: Case, step: int) -> list[Tensor | None]:
    """The oracle's gradient: the sum over ranks (a missing one counts as zeros) / W; None if no rank has one."""
    per_rank = [rank_grads(case, step, r) for r in range(case.world)]
    out: list[Tensor | None] = []
    for j in range(len(case.shapes)):
        present = [g[j] for g in per_rank if g[j] is not None]
        out.append(None if not present else torch.stack(present).sum(0) / case.world)
    return out


def fed_grads(case: Case, step: int, rank: int) -> list[Tensor | None]:
    """What rank ``rank``'s ``.grad`` holds before the optimizer step."""
    return mean_grads(case, step) if case.feed == "averaged" else rank_grads(case, step, rank)


def ns_dtype_of(case: Case) -> torch.dtype:
    """The Newton-Schulz dtype the documentation promises for the drawn ``ns_dtype``."""
    value = case.options.get("ns_dtype")
    if value in (None, "auto"):
        return torch.bfloat16 if host_has_native_bf16() else torch.float32
    if value in (torch.bfloat16, "bfloat16", "bf16"):
        return torch.bfloat16
    if value in (torch.float32, "float32", "fp32"):
        return torch.float32
    raise AssertionError(f"ns_dtype={value!r}: the oracle does not know this value")


# ---- the oracle ----------------------------------------------------------------------------------------


def _torch_groups(case: Case, leaves: list[Tensor]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"muon": [], "adamw": []}
    j = 0
    for g in case.groups:
        params = leaves[j : j + len(g["shapes"])]
        j += len(g["shapes"])
        out[g["kind"]].append({"params": params, **g["overrides"]})
    return out


@contextmanager
def one_thread():
    """Tiny matrices on one intra-op thread, as the ranks run them (two threads on a busy 2-core host made a
    bf16 matmul of a few elements take milliseconds waiting for the second thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def oracle_run(case: Case) -> dict[str, Any]:
    """torch's optimizers on one process, fed the mean gradient: per-step params, clip norms, final state."""
    with one_thread():
        return _oracle_run(case)


def _oracle_run(case: Case) -> dict[str, Any]:
    for name in option_names(CLASSES[case.cls]):
        assert name in ORACLE_OPTIONS, f"{case.cls}({name}=...): the oracle does not know what it does"
    kinds = case.kinds
    init = init_params(case)
    # Muon sees a conv kernel as its (out, in*kh*kw) view, as distlab documents
    leaves = [
        (t.reshape(t.shape[0], -1) if k == "muon" else t).clone().requires_grad_()
        for t, k in zip(init, kinds, strict=True)
    ]
    groups = _torch_groups(case, leaves)
    defaults = case.kind_defaults or {}
    opts: list[torch.optim.Optimizer] = []
    for kind, kind_groups in groups.items():
        if not kind_groups:
            continue
        kw = dict(case.hyper if KIND_OF.get(case.cls) == kind else defaults.get(kind, {}))
        if kind == "muon" and ns_dtype_of(case) == torch.float32:
            opts.append(ReferenceMuon(kind_groups, ns_dtype=torch.float32, **kw))
        else:
            opts.append(ORACLES[kind](kind_groups, **kw))
    max_norm = case.options.get("max_grad_norm")
    snaps, norms = [], []
    for s in range(case.steps):
        for leaf, g in zip(leaves, mean_grads(case, s), strict=True):
            leaf.grad = None if g is None else g.reshape(leaf.shape)
        if max_norm is not None:
            with_grad = [p for p in leaves if p.grad is not None]
            norms.append(torch.nn.utils.clip_grad_norm_(with_grad, max_norm) if with_grad else None)
        for o in opts:
            o.step()
        snaps.append([leaf.detach().reshape(t.shape).clone() for leaf, t in zip(leaves, init, strict=True)])
    state = {}
    for j, leaf in enumerate(leaves):
        found = next((o.state[leaf] for o in opts if leaf in o.state), {})
        if found:
            state[j] = {k: v.reshape(init[j].shape) if v.ndim else v for k, v in found.items()}
    groups = [  # the hyperparameters in effect, torch's defaults filled in (for the coverage check)
        {
            "kind": "muon" if isinstance(o, torch.optim.Muon) else "adamw",
            **{k: v for k, v in g.items() if k != "params"},
        }
        for o in opts
        for g in o.param_groups
    ]
    return {"snaps": snaps, "norms": norms, "state": state, "groups": groups}


# ---- the distributed side (runs on the ranks) ----------------------------------------------------------


def build_optimizer(case: Case, params: list[Tensor], process_group) -> DistMuonAdamW:
    """The drawn constructor call on ``params`` (plain tensors or FSDP2 DTensors)."""
    groups, j = [], 0
    for g in case.groups:
        group = {"params": params[j : j + len(g["shapes"])], **g["overrides"]}
        j += len(g["shapes"])
        if not g["omit_kind"]:
            group["kind"] = g["kind"]
        groups.append(group)
    kw = dict(case.options, grad_sync=case.grad_sync, process_group=process_group)
    if case.cls == "DistMuonAdamW":
        return DistMuonAdamW(groups, kind_defaults=case.kind_defaults, **kw)
    return CLASSES[case.cls](groups if case.as_groups else list(params), **case.hyper, **kw)


__all__ = [
    "BEYOND_TORCH",
    "Case",
    "ReferenceMuon",
    "build_optimizer",
    "cases",
    "fed_grads",
    "init_params",
    "oracle_run",
]
