"""Distributed optimizers: ZeRO-1 Muon + AdamW with exact torch math on one process.

- :mod:`~distlab.optim.dist_optim`: DistMuonAdamW / DistMuon / DistAdamW (what users construct; the step).
- :mod:`~distlab.optim.functional`: the Muon and AdamW update math (pure functions).
- :mod:`~distlab.optim.zero1_comm` / :mod:`~distlab.optim.fsdp2_comm`: how tensors move (whole params; FSDP2
  shards); they never see the optimizer.
- :mod:`~distlab.optim.layout`: who owns which piece; :mod:`~distlab.optim.param_groups`: Muon/AdamW split.

Example::

    from distlab.optim import DistMuonAdamW, muon_param_groups
    opt = DistMuonAdamW(muon_param_groups(model, lr=0.02, adamw_lr=3e-4))
"""

from .dist_optim import DistAdamW, DistMuon, DistMuonAdamW
from .functional import POLAR_EXPRESS_COEFFICIENTS, adjust_lr, matrix_shape, newton_schulz
from .param_groups import muon_param_groups, split_params

__all__ = [
    "POLAR_EXPRESS_COEFFICIENTS",
    "DistAdamW",
    "DistMuon",
    "DistMuonAdamW",
    "adjust_lr",
    "matrix_shape",
    "muon_param_groups",
    "newton_schulz",
    "split_params",
]
