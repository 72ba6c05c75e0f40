"""FSDP2's units, planned over what the blocks hold: for any pattern of shared parameters hypothesis draws (ties
between blocks of a ModuleList, chains of them, a submodule used in two blocks, ties to the model's own layers),
no parameter is held by two units, blocks that share a parameter (directly or through others) are one unit, and a
block sharing with the model outside its blocks is left to the model's unit. The oracle is a graph search written
here, not the code under test."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from distlab.parallel.parallelize import plan_units


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

    def forward(self, x):  # a unit is a module that runs a forward
        return self.b(self.a(x))


class Model(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(n)])
        self.head = nn.Linear(2, 2)


@st.composite
def models(draw):
    n = draw(st.integers(1, 6))
    model = Model(n)
    ties = draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.sampled_from("ab")), max_size=6)
    )
    shared = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2))
    to_head = draw(st.lists(st.integers(0, n - 1), max_size=1))
    edges = []
    for i, j, which in ties:  # block j's weight is block i's (a tie)
        if i != j:
            getattr(model.blocks[j], which).weight = getattr(model.blocks[i], which).weight
            edges.append((i, j))
    for i, j in shared:  # one submodule in two blocks
        if i != j:
            model.blocks[j].b = model.blocks[i].b
            edges.append((i, j))
    for i in to_head:  # the model's own head tied to a block
        model.head.weight = model.blocks[i].a.weight
    return model, n, edges, to_head


def expected_units(n: int, edges: list[tuple[int, int]], to_head: list[int]) -> list[list[int]]:
    """Connected components of the blocks by their sharing edges (a breadth-first search), minus any that reaches a
    block tied to the head. (An edge recorded here may be undone by a later tie of the same weight: the planner reads
    the module, so the test reads it too in the assertion below; this oracle over-approximates the sharing.)"""
    neighbours = {i: set() for i in range(n)}
    for i, j in edges:
        neighbours[i].add(j)
        neighbours[j].add(i)
    seen, units = set(), []
    for start in range(n):
        if start in seen:
            continue
        unit, todo = set(), [start]
        while todo:
            k = todo.pop()
            if k not in unit:
                unit.add(k)
                todo += list(neighbours[k])
        seen |= unit
        if not unit & set(to_head):
            units.append(sorted(unit))
    return sorted(units)


def held_by(model: Model, block: int) -> set[int]:
    return {id(p) for p in model.blocks[block].parameters()}


@settings(max_examples=200, deadline=None, derandomize=True)
@given(models())
def test_units_are_the_blocks_that_share_and_no_parameter_is_in_two(drawn):
    model, n, _, to_head = drawn
    units = [
        [next(i for i, b in enumerate(model.blocks) if b is m) for m in unit] for unit in plan_units([model])
    ]
    # the oracle reads the sharing from the module as built (a later tie may have replaced an earlier one)
    actual = [(i, j) for i in range(n) for j in range(i + 1, n) if held_by(model, i) & held_by(model, j)]
    head_tied = [i for i in range(n) if id(model.head.weight) in held_by(model, i)]
    assert sorted(sorted(u) for u in units) == expected_units(n, actual, head_tied)
    owners: dict[int, int] = {}
    for k, unit in enumerate(units):
        for i in unit:
            for pid in held_by(model, i):
                assert owners.setdefault(pid, k) == k, "a parameter is held by two units"


class Trunk(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.parts = nn.ModuleDict({"enc": Block(), "dec": nn.ModuleList([Block(), Block()])})
        self.scale = nn.Parameter(torch.ones(2))  # the module's own: stays with it
        self.extras = nn.ParameterList([nn.Parameter(torch.ones(2))])
        self.head = nn.Linear(2, 2)

    def forward(self, x):
        return self.head(self.parts["enc"](x) * self.scale)


def _candidates_by_hand(module: nn.Module) -> list[nn.Module]:
    """The oracle: through ModuleList and ModuleDict containers (not into a module that has a forward of its own),
    every module that defines forward, each once."""
    out: list[nn.Module] = []
    todo = list(module.children())
    while todo:
        m = todo.pop(0)
        if type(m).forward is not nn.Module.forward and type(m) not in (nn.ModuleList, nn.ModuleDict):
            if not any(m is o for o in out):
                out.append(m)
        elif isinstance(m, (nn.ModuleList, nn.ModuleDict)):
            todo[:0] = list(m.children())
    return out


def test_unit_candidates_are_found_through_module_dicts_and_lists():
    """A ModuleDict of blocks (one holding a ModuleList) is searched like a ModuleList: each block is a candidate
    unit; a parameter container's parameters stay with the module."""
    from distlab.parallel.parallelize import unit_candidates

    trunk = Trunk()
    found = unit_candidates(trunk)
    want = _candidates_by_hand(trunk)
    assert [id(m) for m in found] == [id(m) for m in want]
    assert {id(trunk.parts["enc"]), id(trunk.parts["dec"][0]), id(trunk.parts["dec"][1])} <= {
        id(m) for m in found
    }
