"""distlab's distributed layer: what runs across ranks, and what must not run on one rank alone."""

from distlab.distributed.rank_local import (
    RankLocalCollectiveError,
    forbid_collectives,
    has_sharded_params,
    on_rank_zero,
)

__all__ = ["RankLocalCollectiveError", "forbid_collectives", "has_sharded_params", "on_rank_zero"]
