"""Distributed optimizers: ZeRO-1 Muon + AdamW with exact torch math on one process.

Example::

    from distlab.optim import DistMuonAdamW, muon_param_groups
    opt = DistMuonAdamW(muon_param_groups(model, lr=0.02, adamw_lr=3e-4))
"""

from .comm import CommStats, all_gather, all_reduce_sum, broadcast, comm_stats, reduce_scatter_sum, world_info
from .dist_optim import DistAdamW, DistMuon, DistMuonAdamW, matrix_shape
from .muon_math import adjust_lr, newton_schulz
from .param_groups import muon_param_groups, split_params

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
    "matrix_shape",
    "muon_param_groups",
    "newton_schulz",
    "reduce_scatter_sum",
    "split_params",
    "world_info",
]
