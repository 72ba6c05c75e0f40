"""Tensors a spawned rank received from its parent must not stay in memory shared with the other ranks.

``ddp_spawn``-style launchers pickle the LightningModule to every child process, and torch's
multiprocessing pickler moves CPU tensors to *shared memory*: every rank then holds the same storage.
Lightning clones the parameters and buffers in each spawned child (not in a forkserver's), but torchmetrics keeps
metric states as plain tensor attributes (neither), so an in-place update like ``self.total += n`` on one rank changes
every rank's state. Measured on a 3-rank CPU fit: a MeanSquaredError's ``total`` counted 57 elements
where the ranks together had seen 21. :func:`unshare_tensors` gives each rank its own copy; distlab's
strategies and RankZeroValidation call it in every rank before anything is updated.
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def unshare_tensors(module: nn.Module) -> int:
    """Clone every shared-memory tensor of ``module``'s submodules: parameters and buffers (their ``.data``: ties
    and optimizer references stay) and plain tensor attributes (metric states); returns how many were cloned."""
    cloned = 0
    for m in module.modules():
        for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]:
            if t.is_shared():
                t.data = t.data.clone()
                cloned += 1
        for name, value in list(vars(m).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and value.is_shared():
                setattr(m, name, value.clone())
                cloned += 1
            elif isinstance(value, list) and any(
                isinstance(v, torch.Tensor) and v.is_shared() for v in value
            ):
                setattr(m, name, [v.clone() if isinstance(v, torch.Tensor) else v for v in value])
                cloned += 1
    return cloned
