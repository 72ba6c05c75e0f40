"""Keep gloo collectives from crashing a process at exit (pytorch/pytorch#117762; the whole story: docs/internals.md,
"A PyTorch crash at exit that distlab works around").

gloo's C++ worker thread drops its reference to a collective's tensors just *after* ``wait()`` returned; freeing the
Python object then needs the GIL, and taking it while the interpreter finalizes ends the thread inside a ``noexcept``
destructor: ``std::terminate``, SIGABRT (a core dump showed the main thread in ``Py_FinalizeEx``, a
``ProcessGroupGloo::runLoop`` thread in ``~AsyncAllgatherWork -> decref_pyobject -> take_gil -> pthread_exit``).
So Python drops the last reference: every tensor handed to a gloo collective is kept until the worker released it
(``Tensor._use_count()``), and object collectives end with a barrier, the GIL free while it waits. For collectives
out of reach (FSDP2's, DCP's, Lightning's: CI hit the crash once more in an FSDP2 fit with the guards in place),
:func:`install_exit_drain` frees the GIL for a moment before the interpreter finalizes. NCCL needs none of this:
its ``wait()`` does not block the host.

Example::

    with hold_until_released(t, group=group):
        dist.all_reduce(t, group=group)
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch.distributed as dist
from torch import Tensor

from distlab.compat import use_count

# A worker releases its reference microseconds after completion; this only bounds a mistake.
RELEASE_TIMEOUT_S = 5.0
# At exit: how long the GIL is left free for workers still dropping a finished collective's tensors.
EXIT_DRAIN_S = 0.2
_exit_drain_installed = False


def _is_gloo(group: dist.ProcessGroup | None) -> bool:
    try:
        return dist.get_backend(group) == "gloo"
    except (RuntimeError, ValueError):  # not initialised, or not a member of this group
        return False


def handover(tensors: Iterable[Tensor], group: dist.ProcessGroup | None = None) -> list[tuple[Tensor, int]]:
    """Record each tensor's reference count *before* it is handed to a collective (empty unless gloo)."""
    return [(t, use_count(t)) for t in tensors] if _is_gloo(group) else []


def settle(handed: list[tuple[Tensor, int]]) -> None:
    """After the collective completed (and its Work was dropped): wait until gloo released the tensors."""
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    for t, before in handed:
        while use_count(t) > before and time.monotonic() < deadline:
            time.sleep(0)  # yield (and the GIL) to the worker thread


@contextmanager
def hold_until_released(*tensors: Tensor, group: dist.ProcessGroup | None = None) -> Iterator[None]:
    """Around a *synchronous* collective on ``tensors``: return only once gloo let go of them."""
    handed = handover(tensors, group)
    yield
    settle(handed)


def _drain_at_exit() -> None:
    import signal

    # The process is exiting: a SIGTERM now (the launcher stopping the ranks after another one died) ends it, and
    # must not run Lightning's handler, whose collective over the dead peer's connection prints a traceback.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(EXIT_DRAIN_S)  # the GIL is free: a gloo worker finishing a collective's cleanup can take it


def install_exit_drain() -> None:
    """Once per process, when the default process group uses gloo: give gloo's worker threads the GIL for
    ``EXIT_DRAIN_S`` at exit, before the interpreter finalizes. Call it after the process group exists (atexit runs
    handlers last-in first-out: this runs before Lightning destroys the group). The strategies call it at set-up and
    every distlab collective on its first use, so a plain torch.distributed script using distlab's optimizers is
    covered too, with its own trailing gloo collectives (the usual trigger: 9 of 20 pure-torch runs ending in a
    ``dist.all_gather`` aborted this way, 0 of 20 with the drain)."""
    global _exit_drain_installed
    initialized = dist.is_available() and dist.is_initialized()
    if not _exit_drain_installed and initialized and "gloo" in str(dist.get_backend()):
        atexit.register(_drain_at_exit)
        _exit_drain_installed = True
