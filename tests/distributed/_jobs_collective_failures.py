"""Rank jobs for test_collective_failures (module-level so spawned ranks can import them)."""

from __future__ import annotations

import time

import torch

from distlab.distributed import CollectiveFailed, all_reduce_sum, new_group


def job_one_rank_never_comes(rank: int, world: int) -> str | None:
    """Rank 0 enters an all_reduce in a group with a 2 s timeout; the others never do."""
    group = new_group(2.0)  # collective: every rank creates it
    if rank != 0:
        time.sleep(5)  # longer than the timeout, then leave without joining
        return None
    try:
        all_reduce_sum(torch.ones(1), group=group)
    except CollectiveFailed as e:
        return str(e)
    return "no error"
