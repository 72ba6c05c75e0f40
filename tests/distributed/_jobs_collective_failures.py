"""Rank jobs for test_collective_failures (module-level so spawned ranks can import them)."""

from __future__ import annotations

import torch

from distlab.distributed import CollectiveFailed, all_reduce_sum, barrier, new_group


def job_one_rank_never_comes(rank: int, world: int) -> str | None:
    """Rank 0 enters an all_reduce in a group with a 2 s timeout; the others never do: they wait in a
    barrier on the main group (60 s timeout) that rank 0 joins once its all_reduce has failed."""
    group = new_group(2.0)  # collective: every rank creates it
    message = None
    if rank == 0:
        try:
            all_reduce_sum(torch.ones(1), group=group)
            message = "no error"
        except CollectiveFailed as e:
            message = str(e)
    barrier()
    return message
