"""Code that runs on one rank must not start a collective: the other ranks would never join it.

A collective called on rank 0 alone (a torchmetrics sync inside ``compute()``, ``self.all_gather``, a
barrier, or the forward of an FSDP2 model, which all-gathers each block's shards) waits forever for
ranks that are not coming, or aborts gloo with "Received data size doesn't match expected size".
:func:`forbid_collectives` turns that into an immediate, one-line :class:`RankLocalCollectiveError`
naming the work and the collective. distlab wraps every piece of work it runs on one rank in it
(rank-0 validation, SampleText on rank 0); the caller shares the error with the waiting ranks.

It replaces the collectives in ``torch.distributed`` (and its c10d module) and in the functional
collectives DTensor uses, for the duration of the block, in this process only.

Example::

    with forbid_collectives("SampleText on rank 0"):
        model.generate(idx, 100)        # raises RankLocalCollectiveError if the model is FSDP2-sharded
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from distlab.compat import functional_collectives, patched
from distlab.distributed.collectives import world_info
from distlab.errors import DistlabError

COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "send",
    "recv",
    "isend",
    "irecv",
    "send_object_list",
    "recv_object_list",
    "batch_isend_irecv",
)
T = TypeVar("T")
_FUNCTIONAL_PREFIXES = (
    "all_",
    "reduce_scatter",
    "broadcast",
    "permute_tensor",
    "batch_p2p",
    "isend",
    "irecv",
)


class RankLocalCollectiveError(DistlabError):
    """A collective was called by code that runs on one rank only."""


def _targets() -> list[tuple[object, str]]:
    funcol = functional_collectives()
    found = [(mod, name) for mod in (dist, c10d) for name in COLLECTIVES if hasattr(mod, name)]
    for name in dir(funcol):
        if name.startswith(_FUNCTIONAL_PREFIXES) and not name.endswith(("_backward", "_setup_context")):
            if callable(getattr(funcol, name)):
                found.append((funcol, name))
    return found


@contextmanager
def forbid_collectives(what: str, hint: str = "") -> Iterator[None]:
    """Within the block, any collective raises :class:`RankLocalCollectiveError` (``what`` names the work)."""
    world, rank = world_info()
    if world == 1:
        yield  # nobody to wait for
        return
    with contextlib.ExitStack() as swapped:
        for module, name in _targets():
            original = getattr(module, name)

            @functools.wraps(original)
            def refuse(*args, _name=name, _module=module, **kwargs):
                raise RankLocalCollectiveError(
                    f"{what} runs on rank {rank} alone but called the collective "
                    f"{_module.__name__}.{_name}; the other ranks would wait forever"
                    + (f"; {hint}" if hint else "")
                )

            # process-wide: torch has no hook that sees every collective before it is issued
            swapped.enter_context(patched(module, name, refuse))
        yield


def has_sharded_params(module) -> bool:
    """True when some parameter is a DTensor shard (FSDP2): a forward then needs every rank."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def on_rank_zero(module, what: str, fn: Callable[[], T]) -> T | None:
    """Run model code whose result only rank 0 needs (sampling, exporting), where it is safe.

    Every rank holds the whole model (DDP, one process): rank 0 runs ``fn`` alone, collectives forbidden.
    The parameters are sharded (FSDP2): every rank runs ``fn``, since each forward is collective.
    Returns ``fn()``'s result on rank 0 and None on the other ranks. Every rank must call it.
    """
    rank = world_info()[1]
    if has_sharded_params(module):
        result = fn()
        return result if rank == 0 else None
    if rank != 0:
        return None
    with forbid_collectives(what):  # (with one rank: nothing forbidden)
        return fn()
