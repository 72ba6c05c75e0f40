"""Thin collective wrappers that count the *logical* bytes each rank moves, as NCCL ring algorithms would.

Per rank, for a tensor of S bytes and W ranks:
    reduce_scatter (input S)  -> (W-1)/W * S
    all_gather     (output S) -> (W-1)/W * S
    all_reduce     (S)        -> 2(W-1)/W * S
    broadcast      (S)        -> S

Every wrapper takes ``group`` (None = WORLD) and ``async_op``; with ``async_op=True`` it returns a
:class:`Pending` whose ``wait()`` returns the result. With one rank (or no process group) nothing is sent.

Example::

    comm_stats.reset()
    out = reduce_scatter_sum(torch.randn(world * 4, 3))   # (4, 3) on every rank, summed over ranks
    comm_stats.bytes, comm_stats.by_op                     # logical bytes this rank requested, per op
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from distlab.gloo import handover, install_exit_drain, settle


@dataclass
class CommStats:
    """Logical bytes and call counts per rank, in total and per op name."""

    bytes: float = 0.0
    calls: int = 0
    by_op: dict[str, dict[str, float]] = field(default_factory=dict)

    def reset(self) -> None:
        self.bytes, self.calls = 0.0, 0
        self.by_op.clear()

    def add(self, op: str, nbytes: float) -> None:
        self.bytes += nbytes
        self.calls += 1
        entry = self.by_op.setdefault(op, {"bytes": 0.0, "calls": 0})
        entry["bytes"] += nbytes
        entry["calls"] += 1


comm_stats = CommStats()


class Pending:
    """Result of an async collective: ``wait()`` blocks and returns the output tensor.

    ``handed``: what :func:`distlab.gloo.handover` recorded; ``wait()`` returns only once gloo's worker
    thread has let go of those tensors (see distlab.gloo for the exit-time crash this prevents).
    """

    def __init__(
        self,
        work: dist.Work | None,
        finish: Callable[[], Tensor],
        handed: list[tuple[Tensor, int]] | None = None,
    ):
        self._work, self._finish, self._handed = work, finish, handed or []

    def wait(self) -> Tensor:
        if self._work is not None:
            self._work.wait()
            self._work = None  # the Work holds the tensors too
        settle(self._handed)
        self._handed = []
        return self._finish()


def _launch(
    call: Callable[[], dist.Work | None],
    finish: Callable[[], Tensor],
    tensors: tuple[Tensor, ...],
    group: dist.ProcessGroup | None,
    async_op: bool,
) -> Tensor | Pending:
    """Run ``call`` (a collective on ``tensors``); hold the tensors until the backend released them."""
    install_exit_drain()  # once per process: also covers gloo collectives of the user's own script
    handed = handover(tensors, group)
    work = call()
    if async_op:
        return Pending(work, finish, handed)
    settle(handed)
    return finish()


def _done(t: Tensor, async_op: bool) -> Tensor | Pending:
    return Pending(None, lambda: t) if async_op else t


# torch >= 2.13 renamed the tensor collectives (*_into_tensor / *_tensor are deprecated aliases)
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or getattr(
    dist, "reduce_scatter_tensor", None
)
_all_gather_into_tensor = getattr(dist, "all_gather_single", None) or getattr(
    dist, "all_gather_into_tensor", None
)


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def world_info(group: dist.ProcessGroup | None = None) -> tuple[int, int]:
    """(world_size, rank) of ``group``; (1, 0) when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group), dist.get_rank(group)
    return 1, 0


def reduce_scatter_sum(
    inp: Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
) -> Tensor | Pending:
    """(W*k, ...) -> (k, ...): rank r gets the SUM over ranks of inp[r*k:(r+1)*k]."""
    W, r = world_info(group)
    if inp.shape[0] % W:
        raise ValueError(
            f"reduce_scatter input dim 0 must be divisible by world size {W}, got {inp.shape[0]}"
        )
    if W == 1:
        return _done(inp, async_op)
    comm_stats.add("reduce_scatter", (W - 1) / W * _nbytes(inp))
    inp = inp.contiguous()
    out = inp.new_empty((inp.shape[0] // W, *inp.shape[1:]))
    try:
        return _launch(
            lambda: _reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM, group=group, async_op=async_op),
            lambda: out,
            (out, inp),
            group,
            async_op,
        )
    except (NotImplementedError, RuntimeError):  # older gloo: all_reduce the whole thing, keep our chunk
        pass
    buf = inp.clone()
    return _launch(
        lambda: dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group, async_op=async_op),
        lambda: buf.chunk(W)[r],
        (buf,),
        group,
        async_op,
    )


def all_gather(
    own: Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
) -> Tensor | Pending:
    """(k, ...) -> (W*k, ...): concatenation of every rank's ``own`` in rank order."""
    W, _ = world_info(group)
    if W == 1:
        return _done(own, async_op)
    own = own.contiguous()
    out = own.new_empty((own.shape[0] * W, *own.shape[1:]))
    comm_stats.add("all_gather", (W - 1) / W * _nbytes(out))
    try:
        return _launch(
            lambda: _all_gather_into_tensor(out, own, group=group, async_op=async_op),
            lambda: out,
            (out, own),
            group,
            async_op,
        )
    except (NotImplementedError, RuntimeError):  # older gloo: list-based all_gather
        pass
    parts = list(out.chunk(W))
    return _launch(
        lambda: dist.all_gather(parts, own, group=group, async_op=async_op),
        lambda: torch.cat(parts),
        (own, *parts),
        group,
        async_op,
    )


def all_reduce_sum(
    t: Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
) -> Tensor | Pending:
    """In-place SUM over ranks; returns ``t``."""
    W, _ = world_info(group)
    if W == 1:
        return _done(t, async_op)
    comm_stats.add("all_reduce", 2 * (W - 1) / W * _nbytes(t))
    return _launch(
        lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group, async_op=async_op),
        lambda: t,
        (t,),
        group,
        async_op,
    )


def broadcast(
    t: Tensor, src: int, group: dist.ProcessGroup | None = None, async_op: bool = False
) -> Tensor | Pending:
    """In-place broadcast from group rank ``src``; returns ``t``."""
    W, _ = world_info(group)
    if W == 1:
        return _done(t, async_op)
    comm_stats.add("broadcast", float(_nbytes(t)))
    global_src = dist.get_global_rank(group, src) if group is not None else src
    return _launch(
        lambda: dist.broadcast(t, global_src, group=group, async_op=async_op),
        lambda: t,
        (t,),
        group,
        async_op,
    )


def all_to_all_single(
    out: Tensor,
    inp: Tensor,
    out_splits: list[int],
    in_splits: list[int],
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
) -> Tensor | Pending:
    """1-D all_to_all with split sizes (elements): rank r sends inp's i-th split to rank i, fills ``out``.

    Logical bytes per rank: what it sends to the other ranks, sum(in_splits[i] for i != r) * itemsize.
    Returns ``out``.
    """
    W, r = world_info(group)
    if len(in_splits) != W or len(out_splits) != W:
        raise ValueError(
            f"all_to_all needs {W} split sizes, got {len(in_splits)} in and {len(out_splits)} out"
        )
    if W == 1:
        out.copy_(inp)
        return _done(out, async_op)
    comm_stats.add("all_to_all", float((sum(in_splits) - in_splits[r]) * inp.element_size()))
    inp = inp.contiguous()
    return _launch(
        lambda: dist.all_to_all_single(out, inp, out_splits, in_splits, group=group, async_op=async_op),
        lambda: out,
        (out, inp),
        group,
        async_op,
    )


def broadcast_module_states(
    module: torch.nn.Module, group: dist.ProcessGroup | None = None, src: int = 0
) -> None:
    """Make every rank's parameters and buffers of ``module`` equal to group rank ``src``'s (one broadcast each).

    What DDP's constructor does at start-up; needed wherever ranks may have initialised differently."""
    W, _ = world_info(group)
    if W == 1:
        return
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            broadcast(t.data, src=src, group=group)
