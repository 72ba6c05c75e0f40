"""Property: ``muon_param_groups`` / ``split_params`` put every trainable parameter of any module in exactly one
group, with the role distlab/optim/param_groups.py documents, and every keyword on the groups it is for.

Domain: drawn "module zoos" - nested containers (Sequential, ModuleDict, plain modules) of Linear (with and
without bias), Embedding, EmbeddingBag, Conv1d, Conv2d, LayerNorm, BatchNorm1d and bare parameters of 0-4
dims, with frozen parameters and weights tied across modules (in either registration order); ``muon`` /
``adamw`` glob overrides drawn from the model's own names (and ones that match nothing); ``head`` "auto",
None or drawn module-name patterns (also ones that match no module: a one-line ValueError); every other
keyword drawn from the domain its annotation declares (tests/optim/_strategies.py).

Oracle: the module docstring's rules written out here, independently of the code: (1) a name matching
``adamw`` -> adamw, ``muon`` -> muon (a < 2-D match is a ValueError); (2) a weight of an Embedding or
EmbeddingBag (any module holding a tied tensor counts) -> embedding; (3) the weight of a head module -> head;
(4) >= 2-D -> muon, else adamw. Groups: "muon" first, then "embedding", "head", "adamw", empty ones left out;
lr / momentum / weight_decay only on the muon group; adamw_betas / adamw_eps / adamw_weight_decay on every
AdamW group; embedding_lr / head_lr (default adamw_lr) on theirs.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from fnmatch import fnmatchcase
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch import nn

from distlab.optim import DistMuonAdamW, muon_param_groups, split_params
from tests.optim._strategies import signature_strategies, subset_of

PATTERN_ARGS = {"model", "muon", "adamw", "head"}  # drawn from the zoo's own names, not from a type
KEYWORDS = signature_strategies(muon_param_groups, skip=PATTERN_ARGS)
DEFAULTS = {n: p.default for n, p in inspect.signature(muon_param_groups).parameters.items()}
HEAD_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
EMBEDDING_TYPES = (nn.Embedding, nn.EmbeddingBag)
DIM = st.sampled_from([2, 3])  # few sizes, so weights of different modules often share a shape (ties)


class Bare(nn.Module):
    """Parameters registered directly on a module (scalars, gains, matrices, kernels)."""

    def __init__(self, shapes: list[tuple[int, ...]]) -> None:
        super().__init__()
        for i, s in enumerate(shapes):
            self.register_parameter(f"p{i}", nn.Parameter(torch.zeros(s)))


class Block(nn.Module):
    """A plain container with named children."""

    def __init__(self, children: dict[str, nn.Module]) -> None:
        super().__init__()
        for name, child in children.items():
            self.add_module(name, child)


@st.composite
def leaves(draw) -> nn.Module:
    kind = draw(
        st.sampled_from(
            ["linear", "embedding", "embedding_bag", "conv1d", "conv2d", "layernorm", "batchnorm", "bare"]
        )
    )
    d, e = draw(DIM), draw(DIM)
    if kind == "linear":
        return nn.Linear(d, e, bias=draw(st.booleans()))
    if kind == "embedding":
        return nn.Embedding(d, e)
    if kind == "embedding_bag":
        return nn.EmbeddingBag(d, e)
    if kind == "conv1d":
        return nn.Conv1d(d, e, draw(st.integers(1, 2)), bias=draw(st.booleans()))
    if kind == "conv2d":
        return nn.Conv2d(d, e, draw(st.integers(1, 2)), bias=draw(st.booleans()))
    if kind == "layernorm":
        return nn.LayerNorm(d, bias=draw(st.booleans()))
    if kind == "batchnorm":
        return nn.BatchNorm1d(d)
    shapes = draw(st.lists(st.lists(DIM, max_size=4).map(tuple), min_size=1, max_size=3))
    return Bare(shapes)


NAMES = st.sampled_from(["enc", "dec", "emb", "head", "blk", "proj", "lm_head", "out"])


def containers(children: st.SearchStrategy[nn.Module]) -> st.SearchStrategy[nn.Module]:
    return st.one_of(
        st.lists(children, min_size=1, max_size=3).map(lambda ms: nn.Sequential(*ms)),
        st.dictionaries(NAMES, children, min_size=1, max_size=3).map(nn.ModuleDict),
        st.dictionaries(NAMES, children, min_size=1, max_size=3).map(Block),
    )


@st.composite
def zoos(draw) -> nn.Module:
    """A nested model, then some weights tied across modules and some parameters frozen."""
    model = draw(st.recursive(leaves(), containers, max_leaves=6).map(lambda m: Block({"net": m})))
    weighted = [m for m in model.modules() if isinstance(getattr(m, "weight", None), nn.Parameter)]
    for _ in range(draw(st.integers(0, 2)) if weighted else 0):
        a = draw(st.sampled_from(weighted))
        same = [m for m in weighted if m is not a and m.weight.shape == a.weight.shape]
        if same:
            draw(st.sampled_from(same)).weight = a.weight  # e.g. a head tied to the embedding, either order
    params = list(model.parameters())
    for i in draw(st.sets(st.integers(0, len(params) - 1), max_size=2)):
        params[i].requires_grad_(False)
    return model


def glob_patterns(names: list[str]) -> st.SearchStrategy[list[str]]:
    """Globs drawn from the model's own names: exact names, prefixes, suffixes, and ones that match nothing."""
    pieces = [p for n in names for p in (n, n.rsplit(".", 1)[0] + ".*", "*." + n.rsplit(".", 1)[-1])]
    return st.lists(st.sampled_from(pieces + ["nothing.*"]), max_size=2)


# ---- the documented rules, written out independently ---------------------------------------------------


def expected_roles(
    model: nn.Module, muon: list[str], adamw: list[str], head: Any
) -> dict[str, list[str]] | str:
    """{role: [names]} by the docstring's rules, or the message fragment of the ValueError they call for."""
    names = [n for n, _ in model.named_parameters()]
    if any(not any(fnmatchcase(n, pat) for n in names) for pat in [*muon, *adamw]):
        return "matches no parameter"
    holders: dict[int, list[tuple[nn.Module, str]]] = defaultdict(list)
    for m in model.modules():
        for attr, p in m._parameters.items():
            if p is not None:
                holders[id(p)].append((m, attr))
    if head is None:
        heads: list[nn.Module] = []
    elif head == "auto":
        heads = [m for m in model.modules() if isinstance(m, HEAD_TYPES)][-1:]
    else:
        heads = [m for n, m in model.named_modules() if any(fnmatchcase(n, pat) for pat in head)]
        if not heads:
            return "matches no module"
    roles: dict[str, list[str]] = {"muon": [], "embedding": [], "head": [], "adamw": []}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        held = holders[id(p)]
        if any(fnmatchcase(name, pat) for pat in adamw):
            role = "adamw"
        elif any(fnmatchcase(name, pat) for pat in muon):
            if p.ndim < 2:
                return "Muon needs >= 2-D"
            role = "muon"
        elif any(isinstance(m, EMBEDDING_TYPES) for m, _ in held):
            role = "embedding"
        elif any(attr == "weight" and any(m is h for h in heads) for m, attr in held):
            role = "head"
        else:
            role = "muon" if p.ndim >= 2 else "adamw"
        roles[role].append(name)
    return roles


@st.composite
def calls(draw) -> tuple[nn.Module, dict[str, Any]]:
    model = draw(zoos())
    names = [n for n, _ in model.named_parameters()]
    modules = [n for n, _ in model.named_modules() if n]
    kw = draw(subset_of(KEYWORDS))
    kw["muon"], kw["adamw"] = draw(glob_patterns(names)), draw(glob_patterns(names))
    patterns = st.lists(st.sampled_from(modules), min_size=1, max_size=2) | st.sampled_from([[], ["nope"]])
    kw["head"] = draw(st.one_of(st.just("auto"), st.none(), patterns))
    return model, kw


class HeadFirst(nn.Module):
    """A head registered before the embedding it is tied to, an EmbeddingBag and a hidden matrix."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = nn.Linear(3, 5, bias=False)
        self.hidden = nn.Linear(3, 3)
        self.bag = nn.EmbeddingBag(4, 3)
        self.wte = nn.Embedding(5, 3)
        self.wte.weight = self.lm_head.weight


# Anchors beside the drawn zoos: the audit's survivors (AdamW groups given Muon's weight decay, an EmbeddingBag
# sent to Muon, a zero embedding/head lr read as "unset") and a tie whose order once decided the role.
ANCHOR_KW = dict(
    weight_decay=0.5, adamw_weight_decay=0.25, adamw_eps=1e-3, adamw_betas=(0.5, 0.75), embedding_lr=0.0
)


@example((HeadFirst(), dict(ANCHOR_KW, muon=[], adamw=[], head="auto")))
@example((HeadFirst(), dict(ANCHOR_KW, head_lr=0.0, muon=[], adamw=[], head=["hidden"])))
@settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(calls())
def test_every_parameter_lands_once_with_its_documented_role_and_keywords(call):
    model, kw = call
    want = expected_roles(model, kw["muon"], kw["adamw"], kw["head"])
    if isinstance(want, str):
        with pytest.raises(ValueError, match=want):
            muon_param_groups(model, **kw)
        return
    by_id = {id(p): n for n, p in model.named_parameters()}
    roles = split_params(model, muon=kw["muon"], adamw=kw["adamw"], head=kw["head"])
    assert {role: [n for n, _ in members] for role, members in roles.items()} == want
    if not any(want.values()):  # nothing trainable: muon_param_groups refuses (split_params only reports it)
        with pytest.raises(ValueError, match="nothing to train|has no parameters"):
            muon_param_groups(model, **kw)
        return
    groups = muon_param_groups(model, **kw)

    value = {n: kw.get(n, DEFAULTS[n]) for n in DEFAULTS if n not in PATTERN_ARGS}
    lrs = {
        "embedding": value["adamw_lr"] if value["embedding_lr"] is None else value["embedding_lr"],
        "head": value["adamw_lr"] if value["head_lr"] is None else value["head_lr"],
        "adamw": value["adamw_lr"],
    }
    order = [role for role in ("muon", "embedding", "head", "adamw") if want[role]]
    assert [g["name"] for g in groups] == order
    for g in groups:
        role = g["name"]
        assert [by_id[id(p)] for p in g["params"]] == want[role], role
        if role == "muon":
            assert g["kind"] == "muon" and all(p.ndim >= 2 for p in g["params"])
            assert (g["lr"], g["momentum"], g["weight_decay"]) == (
                value["lr"],
                value["momentum"],
                value["weight_decay"],
            )
            assert not {"betas", "eps"} & set(g)
        else:
            assert g["kind"] == "adamw" and "momentum" not in g
            assert g["lr"] == lrs[role], (role, g["lr"], lrs[role])
            assert tuple(g["betas"]) == tuple(value["adamw_betas"])
            assert g["eps"] == value["adamw_eps"] and g["weight_decay"] == value["adamw_weight_decay"]
    placed = [id(p) for g in groups for p in g["params"]]
    trainable = [id(p) for p in model.parameters() if p.requires_grad]
    assert sorted(placed) == sorted(trainable) and len(set(placed)) == len(placed)
    if groups:
        DistMuonAdamW(groups)  # the groups are a valid optimizer configuration as they are
