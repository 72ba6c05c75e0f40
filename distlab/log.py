"""distlab's logger: one line per event, printed once (by global rank 0) unless the rank matters.

Lightning configures its own loggers; distlab's pieces also run in plain torch.distributed scripts, so
the ``distlab`` logger gets a stream handler of its own when the application configured none.

Example::

    from distlab.log import info_rank0
    info_rank0("muon_param_groups: Muon 24 tensors (3.1M params) | AdamW 6 tensors (0.5M params)")
"""

from __future__ import annotations

import logging
import os

import torch.distributed as dist

logger = logging.getLogger("distlab")
if not logging.getLogger().handlers and not logger.handlers:
    logger.addHandler(logging.StreamHandler())
    logger.setLevel(logging.INFO)
    logger.propagate = False


def global_rank() -> int:
    """This process's global rank: the process group's, else the launcher's RANK, else 0."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", 0))


def info_rank0(message: str) -> None:
    """Log ``message`` once per job (on global rank 0)."""
    if global_rank() == 0:
        logger.info(message)
