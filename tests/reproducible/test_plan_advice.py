"""Reproducible mode's refusal of a world size is advice that works: every alternative it names, taken, is accepted.

Walks every world size 1..12 against every power-of-two ``micro_shards`` 1..64 (the strategy's domain); a refusal
must name at least one alternative, and each named one (a ``micro_shards`` value, a list of rank counts) must pass
:func:`check_plan`. An impossible suggestion ("a power of two that 3 divides") fails here.
"""

from __future__ import annotations

import re

import pytest

from distlab.errors import ConfigError
from distlab.strategies.reproducible import check_plan

SHARDS = [2**k for k in range(7)]


@pytest.mark.parametrize("world", range(1, 13))
def test_each_alternative_a_refusal_names_is_accepted(world):
    for shards in SHARDS:
        try:
            assert check_plan(shards, world, 1) * world == shards
            continue
        except ConfigError as err:
            message = str(err)
        named_shards = [int(v) for v in re.findall(r"micro_shards=(\d+) \(or", message)]
        ranks = re.search(r"run on ([\d, ]+) ranks", message)
        named_ranks = [int(v) for v in ranks.group(1).split(",")] if ranks else []
        assert named_shards or named_ranks, message
        for v in named_shards:
            assert v & (v - 1) == 0, message  # the strategy's domain: a power of two
            check_plan(v, world, 1)
        for w in named_ranks:
            check_plan(shards, w, 1)
        if world & (world - 1):
            assert "power-of-two number of ranks" in message and not named_shards, message


def test_an_accumulation_other_than_the_plan_is_refused():
    with pytest.raises(ConfigError, match="leave accumulate_grad_batches unset"):
        check_plan(8, 2, 3)
    assert check_plan(8, 2, 4) == 4
