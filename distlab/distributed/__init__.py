"""distlab's distributed layer: the one place collectives are issued, and the rules for rank-local code.

- :mod:`~distlab.distributed.collectives`: every collective distlab issues (byte-counted, gloo-safe),
  object broadcast/gather, ``world_info``.
- :mod:`~distlab.distributed.gloo`: the release guard and exit drain behind them (pytorch#117762).
- :mod:`~distlab.distributed.rank_local`: code that runs on one rank cannot reach a collective.
- :mod:`~distlab.distributed.spawn`: spawned ranks get their own copy of shared-memory tensors.
- :mod:`~distlab.distributed.restart`: a restarted torchrun attempt rendezvous in a store of its own.
- :mod:`~distlab.distributed.mesh_traffic`: every collective's bytes by device-mesh dimension (FSDP2's too).

Example::

    from distlab.distributed import all_reduce_sum, comm_stats, world_info
    world, rank = world_info()
    total = all_reduce_sum(torch.ones(1))      # tensor([world.]) on every rank
"""

from distlab.distributed.collectives import (
    CollectiveFailed,
    CommStats,
    Pending,
    all_gather,
    all_reduce,
    all_reduce_sum,
    all_to_all_single,
    any_rank,
    backend,
    barrier,
    broadcast,
    broadcast_buffers,
    broadcast_coalesced,
    broadcast_module_states,
    broadcast_object,
    comm_stats,
    cpu_group,
    gather_objects,
    global_norm,
    is_distributed,
    new_group,
    reduce_scatter_sum,
    resolved,
    then,
    tree_sum,
    world_info,
)
from distlab.distributed.gloo import install_exit_drain
from distlab.distributed.rank_local import (
    RankLocalCollectiveError,
    forbid_collectives,
    has_sharded_params,
    on_rank_zero,
)
from distlab.distributed.restart import fresh_store_after_restart
from distlab.distributed.spawn import unshare_tensors

__all__ = [
    "CollectiveFailed",
    "CommStats",
    "Pending",
    "RankLocalCollectiveError",
    "all_gather",
    "any_rank",
    "all_reduce",
    "all_reduce_sum",
    "all_to_all_single",
    "backend",
    "barrier",
    "broadcast",
    "broadcast_buffers",
    "broadcast_coalesced",
    "broadcast_module_states",
    "broadcast_object",
    "comm_stats",
    "cpu_group",
    "forbid_collectives",
    "fresh_store_after_restart",
    "gather_objects",
    "global_norm",
    "has_sharded_params",
    "install_exit_drain",
    "is_distributed",
    "new_group",
    "on_rank_zero",
    "reduce_scatter_sum",
    "resolved",
    "then",
    "tree_sum",
    "unshare_tensors",
    "world_info",
]
