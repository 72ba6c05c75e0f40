"""Tensors a spawned rank received from its parent must not stay in memory shared with the other ranks.

torch's multiprocessing pickler moves the CPU tensors it sends to a rank into shared memory, and Lightning clones
only parameters and buffers (in a spawned child, not in a forkserver's): a torchmetrics state updated in place
(``self.total += n``) on one rank changed every rank's (measured on 3 CPU ranks: a MeanSquaredError's ``total``
counted 57 elements where the ranks together had seen 21; docs/internals.md, "Strategies"). distlab's strategies
and RankZeroValidation call :func:`unshare_tensors` in every rank before anything is updated.
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
