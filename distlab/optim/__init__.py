"""Distributed optimizers: ZeRO-1 Muon + AdamW with exact torch math on one process (what each of the package's
files does: docs/architecture.md, "Where each file lives").

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
