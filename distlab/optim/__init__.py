"""Distributed optimizers: ZeRO-1 Muon + AdamW with exact torch math on one process."""

from .comm import CommStats, all_gather, all_reduce_sum, broadcast, comm_stats, reduce_scatter_sum, world_info
from .dist_optim import DistAdamW, DistMuon, DistMuonAdamW
from .muon_math import adjust_lr, newton_schulz

__all__ = [
    "CommStats",
    "DistAdamW",
    "DistMuon",
    "DistMuonAdamW",
    "adjust_lr",
    "all_gather",
    "all_reduce_sum",
    "broadcast",
    "comm_stats",
    "newton_schulz",
    "reduce_scatter_sum",
    "world_info",
]
