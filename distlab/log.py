"""distlab's logger: one line per event, printed once (by global rank 0) unless the rank matters.

Lightning configures its own loggers; distlab's pieces also run in plain torch.distributed scripts, so
the ``distlab`` logger gets a stream handler of its own when the application configured none.

Example::

    from distlab.log import info_rank0
    info_rank0("muon_param_groups: Muon 24 tensors (3.1M params) | AdamW 6 tensors (0.5M params)")
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator

import torch.distributed as dist

from distlab.switches import switch_on

logger = logging.getLogger("distlab")
if not logging.getLogger().handlers and not logger.handlers:
    logger.addHandler(logging.StreamHandler())
    logger.setLevel(logging.INFO)
    logger.propagate = False


VERBOSE_ENV = "DISTLAB_VERBOSE"
# Where Lightning's rank_zero_info logs: the unified package's, and the standalone packages' once imported (a config
# naming pytorch_lightning.* imports it, and Lightning's helpers then log under its name).
RANK_ZERO_LOGGERS = tuple(
    f"{package}.utilities.rank_zero"
    for package in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric")
)
# Lightning's rank_zero_info lines that advertise other products (matched by their start).
MOOT_LOG_LINES = ("💡 Tip:",)
# Warnings raised by one pinned dependency inside another, that a user can do nothing about: the literal start
# of the message, in the form PYTHONWARNINGS takes (no ':' or ','), so spawned and launched ranks inherit it.
# "`isinstance(treespec, LeafSpec)` is deprecated": torch 2.13's pytree, from Lightning 2.6's _pytree.py.
MOOT_WARNINGS = ("`isinstance(treespec",)
# Lightning's advice for values logged on epoch level without sync_dist: moot where distlab's exact
# evaluation computes them over the whole set (RankZeroValidation).
SYNC_DIST_ADVICE = "It is recommended to use `self.log("


def _drop_moot(record: logging.LogRecord) -> bool:
    return not str(record.getMessage()).startswith(MOOT_LOG_LINES)


def silence_moot_messages() -> None:
    """Silence :data:`MOOT_LOG_LINES` and :data:`MOOT_WARNINGS` in this process and every rank it starts (unless
    ``DISTLAB_VERBOSE=1``). Called by the ``distlab`` command, not on import: a library leaves a user's own
    script's logging alone."""
    verbose = switch_on(VERBOSE_ENV)
    for name in RANK_ZERO_LOGGERS:  # (a filter added again, by a notebook's second call, is there once)
        lg = logging.getLogger(name)
        lg.removeFilter(_drop_moot) if verbose else lg.addFilter(_drop_moot)
    if verbose:
        return
    inherited = [w for w in os.environ.get("PYTHONWARNINGS", "").split(",") if w]
    for message in MOOT_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message))
        entry = f"ignore:{message}"
        if entry not in inherited:
            inherited.append(entry)
    os.environ["PYTHONWARNINGS"] = ",".join(inherited)  # spawned / launched ranks start with these filters
    os.environ[_SILENCED_ENV] = "1"  # and a spawned rank, a fresh interpreter, silences its own on import


_SILENCED_ENV = "DISTLAB_SILENCED_MOOT"


@contextlib.contextmanager
def sync_dist_advice_silenced() -> Iterator[None]:
    """Inside distlab's exact evaluation, Lightning's ``sync_dist`` advice is moot (unless ``DISTLAB_VERBOSE=1``)."""
    with warnings.catch_warnings():
        if not switch_on(VERBOSE_ENV):
            warnings.filterwarnings("ignore", message=re.escape(SYNC_DIST_ADVICE))
        yield


def info_rank0(message: str) -> None:
    """Log ``message`` once per job (on global rank 0: the process group's, else the launcher's RANK)."""
    initialized = dist.is_available() and dist.is_initialized()
    if (dist.get_rank() if initialized else int(os.environ.get("RANK", 0))) == 0:
        logger.info(message)


if os.environ.get(_SILENCED_ENV) == "1":  # a rank the distlab command spawned (never a user's own script)
    silence_moot_messages()
