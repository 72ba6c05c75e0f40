"""Every collective distlab issues goes through here: byte counting, the gloo release guard, the exit drain.

Nothing else in the package calls ``torch.distributed`` collectives. Each wrapper counts the *logical*
bytes each rank moves, as NCCL ring algorithms would.

Per rank, for a tensor of S bytes and W ranks:
    reduce_scatter (input S)  -> (W-1)/W * S
    all_gather     (output S) -> (W-1)/W * S
    all_reduce     (S)        -> 2(W-1)/W * S
    broadcast      (S)        -> S

Every tensor wrapper takes ``group`` (None = WORLD) and ``async_op``; with ``async_op=True`` it returns a
:class:`Pending` whose ``wait()`` returns the result. With one rank (or no process group) nothing is sent.
Python objects travel with :func:`broadcast_object` / :func:`gather_objects`; :func:`world_info` and
:func:`is_distributed` answer "how many ranks, which one am I" in one place.

Example::

    comm_stats.reset()
    out = reduce_scatter_sum(torch.randn(world * 4, 3))   # (4, 3) on every rank, summed over ranks
    comm_stats.bytes, comm_stats.by_op                     # logical bytes this rank requested, per op
"""

from __future__ import annotations

import functools
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from distlab.distributed.gloo import handover, install_exit_drain, settle
from distlab.errors import DistlabError


@dataclass
class CommStats:
    """Logical bytes, call counts and blocking seconds per rank, in total and per op name.

    ``seconds``: this rank's host thread inside distlab's collectives (a blocking call whole; an async one's launch
    and ``wait()``, not the overlapped time), with the local work that completes the result (gloo's reduce_scatter
    sums on the host). On NCCL the host does not wait for the kernels: there it is launch overhead, not transfer."""

    bytes: float = 0.0
    calls: int = 0
    seconds: float = 0.0
    by_op: dict[str, dict[str, float]] = field(default_factory=dict)

    def reset(self) -> None:
        self.bytes, self.calls, self.seconds = 0.0, 0, 0.0
        self.by_op.clear()

    def _entry(self, op: str) -> dict[str, float]:
        return self.by_op.setdefault(op, {"bytes": 0.0, "calls": 0, "seconds": 0.0})

    def add(self, op: str, nbytes: float) -> None:
        self.bytes += nbytes
        self.calls += 1
        entry = self._entry(op)
        entry["bytes"] += nbytes
        entry["calls"] += 1

    def add_time(self, op: str, seconds: float) -> None:
        self.seconds += seconds
        self._entry(op)["seconds"] += seconds

    def snapshot(self) -> dict[str, dict[str, float]]:
        """A copy of the per-op counters (subtract two snapshots for what happened in between)."""
        return {op: dict(entry) for op, entry in self.by_op.items()}


comm_stats = CommStats()


class CollectiveFailed(DistlabError):
    """A collective could not complete: the other ranks did not come in time, or one of them is gone.
    The message names this rank and the collective."""


def _explain(e: BaseException, op: str, group: dist.ProcessGroup | None) -> BaseException:
    """A backend error in a collective -> one line naming this rank and the collective (others unchanged)."""
    text = str(e)
    world, rank = world_info(group)
    detail = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)
    if "Timed out" in text or "timed out" in text:
        return CollectiveFailed(
            f"rank {rank}: {op} over {world} ranks timed out waiting for the others ({detail.split('] ')[-1]}); "
            "a rank crashed, hangs, or took another code path (its log says which). If a step legitimately "
            "takes longer, raise the process-group timeout: trainer.strategy.init_args.timeout, e.g. '1:00:00'"
        )
    if "closed by peer" in text or "reset by peer" in text or "Broken pipe" in text:
        return CollectiveFailed(
            f"rank {rank}: {op} over {world} ranks failed: another rank closed its connection (it exited, "
            "crashed or was killed; its log says which)"
        )
    return e


class Pending:
    """Result of an async collective: ``wait()`` blocks and returns the output tensor (the same one on
    every later call: ``finish`` runs once).

    ``handed``: what :func:`distlab.distributed.gloo.handover` recorded; ``wait()`` returns only once gloo's
    worker thread has let go of those tensors (see that module for the exit-time crash this prevents).
    """

    def __init__(
        self,
        work: dist.Work | None,
        finish: Callable[[], Tensor],
        handed: list[tuple[Tensor, int]] | None = None,
        op: str | None = None,
        group: dist.ProcessGroup | None = None,
    ):
        self._work, self._finish, self._handed = work, finish, handed or []
        self._op, self._group = op, group
        self._result: Tensor | None = None

    def wait(self) -> Tensor:
        if self._result is None:
            t0 = time.perf_counter()
            if self._work is not None:
                try:
                    self._work.wait()
                except RuntimeError as e:
                    raise _explain(e, self._op or "collective", self._group) from None
                self._work = None  # the Work holds the tensors too
            settle(self._handed)
            self._handed = []
            self._result = self._finish()
            if self._op is not None:  # None: derived by then(); the collective it waits on counts itself
                comm_stats.add_time(self._op, time.perf_counter() - t0)
        return self._result

    def then(self, fn: Callable[[Tensor], Tensor]) -> Pending:
        """A Pending whose ``wait()`` returns ``fn(this result)``."""
        return Pending(None, lambda: fn(self.wait()))


def resolved(x: Tensor | Pending) -> Tensor:
    """The tensor itself, or a :class:`Pending`'s result (waits)."""
    return x.wait() if isinstance(x, Pending) else x


def then(x: Tensor | Pending, fn: Callable[[Tensor], Tensor]) -> Tensor | Pending:
    """``fn(x)`` now for a tensor; for a :class:`Pending`, when its result is waited for."""
    return x.then(fn) if isinstance(x, Pending) else fn(x)


def _launch(
    op: str,
    call: Callable[[], dist.Work | None],
    tensors: tuple[Tensor, ...],
    group: dist.ProcessGroup | None,
    async_op: bool,
    finish: Callable[[], Any] | None = None,
) -> Any:
    """Run ``call`` (the collective ``op`` on ``tensors``); hold the tensors until the backend released them.
    Returns ``finish()``, by default the first tensor (the output), or a :class:`Pending` of it when ``async_op``."""
    finish = finish or (lambda out=tensors[0]: out)  # (holds the output only, not the input)
    install_exit_drain()  # once per process: also covers gloo collectives of the user's own script
    handed = handover(tensors, group)
    t0 = time.perf_counter()
    try:
        work = call()
    except RuntimeError as e:
        raise _explain(e, op, group) from None
    if async_op:
        comm_stats.add_time(op, time.perf_counter() - t0)
        return Pending(work, finish, handed, op, group)
    settle(handed)
    result = finish()
    comm_stats.add_time(op, time.perf_counter() - t0)
    return result


def _done(t: Tensor, async_op: bool) -> Tensor | Pending:
    return Pending(None, lambda: t) if async_op else t


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def world_info(group: dist.ProcessGroup | None = None) -> tuple[int, int]:
    """(world_size, rank) of ``group``; (1, 0) when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group), dist.get_rank(group)
    return 1, 0


def is_distributed(group: dist.ProcessGroup | None = None) -> bool:
    """True when a process group is running with more than one rank."""
    return world_info(group)[0] > 1


def backend(group: dist.ProcessGroup | None = None) -> str | None:
    """The group's backend name ("gloo", "nccl", ...), None without a process group."""
    return str(dist.get_backend(group)) if dist.is_available() and dist.is_initialized() else None


def new_group(timeout_s: float) -> dist.ProcessGroup:
    """Collective (every rank calls it): a group of all ranks on the default backend with its own timeout."""
    return dist.new_group(backend=dist.get_backend(), timeout=timedelta(seconds=timeout_s))


_cpu_group: tuple[Any, dist.ProcessGroup | None] | None = None  # (the default group it was made for, group)


def cpu_group() -> dist.ProcessGroup | None:
    """A group of every rank for small CPU tensors (control flags) that never waits on a GPU: the default group
    (None) when it is gloo, else a gloo group of all ranks made once per default group. Collective on its first
    call after a process group starts: every rank calls it at the same point."""
    global _cpu_group
    if not is_distributed() or backend() == "gloo":
        return None
    world = dist.group.WORLD
    if _cpu_group is None or _cpu_group[0] is not world:
        _cpu_group = (world, dist.new_group(backend="gloo"))
    return _cpu_group[1]


def tree_sum(parts: list[Tensor]) -> Tensor:
    """The sum of ``parts`` in one fixed order that does not depend on how they were grouped: a binary counter over
    them (adjacent pairs of equal size merge, earlier + later), then the remaining subtrees left to right. For
    ``parts = [a0..a7]``: ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)). Summing each rank's 2**k consecutive parts this way
    and then the ranks' results the same way gives the bits of one sum over all parts (reproducible mode)."""
    stack: list[tuple[int, Tensor]] = []
    for part in parts:
        tree_push(stack, part)
    return functools.reduce(operator.add, (total for _, total in stack))  # the subtrees left to right


def tree_push(
    stack: list[tuple[int, Any]], part: Any, plus: Callable[[Any, Any], Any] = operator.add
) -> None:
    """Add ``part`` to the running :func:`tree_sum` ``stack`` of (subtree size, its sum): adjacent subtrees of equal
    size merge, earlier ``plus`` later."""
    size = 1
    while stack and stack[-1][0] == size:
        size, part = size * 2, plus(stack.pop()[1], part)
    stack.append((size, part))


def reduce_scatter_sum(
    inp: Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False, tree: bool = False
) -> Tensor | Pending:
    """(W*k, ...) -> (k, ...): rank r gets the SUM over ranks of inp[r*k:(r+1)*k].

    On gloo it is an all_to_all and a local sum in rank order (see :func:`_gloo_reduce_scatter`). ``tree``: on any
    backend, the all_to_all and the ranks' contributions summed in :func:`tree_sum`'s fixed order (a backend's own
    reduction order is its business: NCCL's ring differs by world size)."""
    W, r = world_info(group)
    if inp.shape[0] % W:
        raise ValueError(
            f"reduce_scatter input dim 0 must be divisible by world size {W}, got {inp.shape[0]}"
        )
    if W == 1:
        return _done(inp, async_op)
    comm_stats.add("reduce_scatter", (W - 1) / W * _nbytes(inp))
    inp = inp.contiguous()
    if backend(group) == "gloo" or tree:
        return _gloo_reduce_scatter(inp, W, group, async_op, tree)
    out = inp.new_empty((inp.shape[0] // W, *inp.shape[1:]))
    return _launch(
        "reduce_scatter",
        lambda: dist.reduce_scatter_single(out, inp, op=dist.ReduceOp.SUM, group=group, async_op=async_op),
        (out, inp),
        group,
        async_op,
    )


def _gloo_reduce_scatter(
    inp: Tensor, W: int, group: dist.ProcessGroup | None, async_op: bool, tree: bool = False
) -> Tensor | Pending:
    """gloo's reduce_scatter reduces the whole tensor on every rank (measured slower than gloo's all_reduce of
    the same tensor). An all_to_all moves only the chunks each rank owns, (W-1)/W of the input as a ring
    reduce_scatter would; the owner then sums its W received chunks in rank order, or in :func:`tree_sum`'s order
    (the time is counted)."""
    recv = torch.empty_like(inp)  # (W*k, ...): block w is rank w's contribution to this rank's chunk

    def finish() -> Tensor:
        blocks = recv.view(W, inp.shape[0] // W, *inp.shape[1:])  # (W, k, ...)
        if tree:
            return tree_sum(list(blocks)).clone()
        out = blocks[0].clone()
        for w in range(1, W):
            out += blocks[w]
        return out  # (k, ...)

    return _launch(
        "reduce_scatter",
        lambda: dist.all_to_all_single(recv, inp, group=group, async_op=async_op),
        (recv, inp),
        group,
        async_op,
        finish,
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
    # (no fallback to another collective on an error: a fallback taken on one rank only would pair it with the
    # other ranks' next collective)
    return _launch(
        "all_gather",
        lambda: dist.all_gather_single(out, own, group=group, async_op=async_op),
        (out, own),
        group,
        async_op,
    )


def all_reduce(
    t: Tensor, op: str = "sum", group: dist.ProcessGroup | None = None, async_op: bool = False
) -> Tensor | Pending:
    """In-place reduction over ranks (``op``: "sum", "max" or "min"); returns ``t``."""
    W, _ = world_info(group)
    if W == 1:
        return _done(t, async_op)
    comm_stats.add("all_reduce", 2 * (W - 1) / W * _nbytes(t))
    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
    return _launch(
        "all_reduce",
        lambda: dist.all_reduce(t, op=reduce_op, group=group, async_op=async_op),
        (t,),
        group,
        async_op,
    )


def all_reduce_sum(
    t: Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
) -> Tensor | Pending:
    """In-place SUM over ranks; returns ``t``."""
    return all_reduce(t, "sum", group, async_op)


def any_rank(flags: list[bool], group: dist.ProcessGroup | None, device: torch.device) -> list[bool]:
    """Per entry, whether ``flags`` is True on some rank of ``group`` (e.g. a param has a gradient somewhere). Over
    every rank (``group`` None or WORLD) the flags go over :func:`cpu_group`: reading them back (``tolist``) then
    waits for no GPU stream."""
    if not flags:
        return flags
    if group is None or group is dist.group.WORLD:
        group, device = cpu_group(), torch.device("cpu")
    counts = torch.tensor(flags, dtype=torch.int32, device=device)
    return (all_reduce_sum(counts, group) > 0).tolist()


def global_norm(parts: list[Tensor], group: dist.ProcessGroup | None, device: torch.device) -> Tensor:
    """The L2 norm (fp32, a 0-d tensor) of tensors whose ``parts`` partition them over ``group``'s ranks."""
    squares = [t.float().square().sum() for t in parts]
    total = torch.stack(squares).sum() if squares else torch.zeros((), device=device)
    return all_reduce_sum(total.to(device), group).sqrt()


def barrier(group: dist.ProcessGroup | None = None) -> None:
    """Every rank of ``group`` waits here for the others (nothing with one rank)."""
    if world_info(group)[0] > 1:
        _launch("barrier", lambda: dist.barrier(group=group), (), group, False, lambda: None)


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
        "broadcast",
        lambda: dist.broadcast(t, global_src, group=group, async_op=async_op),
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
        "all_to_all",
        lambda: dist.all_to_all_single(out, inp, out_splits, in_splits, group=group, async_op=async_op),
        (out, inp),
        group,
        async_op,
    )


def broadcast_module_states(
    module: torch.nn.Module, group: dist.ProcessGroup | None = None, src: int = 0
) -> None:
    """Make every rank's parameters and buffers of ``module`` equal to group rank ``src``'s (one broadcast each).

    What DDP's constructor does at start-up; needed wherever ranks may have initialised differently."""
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            broadcast(t.data, src=src, group=group)


def broadcast_coalesced(tensors: list[Tensor], src: int = 0, group: dist.ProcessGroup | None = None) -> None:
    """In place: every rank's ``tensors`` become group rank ``src``'s, one broadcast per (dtype, device).
    Every rank passes tensors of the same shapes in the same order."""
    if world_info(group)[0] == 1:
        return
    by_kind: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}
    for t in tensors:
        by_kind.setdefault((t.dtype, t.device), []).append(t)
    with torch.no_grad():
        for same in by_kind.values():
            flat = torch.cat([t.reshape(-1) for t in same])  # (n,)
            if flat.dtype == torch.bool:  # gloo has no bool collectives
                flat = flat.to(torch.uint8)
            broadcast(flat, src=src, group=group)
            for t, part in zip(same, flat.split([t.numel() for t in same]), strict=True):
                t.copy_(part.view_as(t))


def broadcast_buffers(module: torch.nn.Module, group: dist.ProcessGroup | None = None, src: int = 0) -> None:
    """Make every rank's buffers of ``module`` equal to group rank ``src``'s (one broadcast per dtype).

    What a DDP wrapper (``broadcast_buffers=True``, its default) does before a forward; the strategies that run
    without the wrapper call it at the same points (:class:`distlab.strategies.DistlabStrategyMixin`)."""
    broadcast_coalesced(list(module.buffers()), src=src, group=group)


def broadcast_object(obj: Any, src: int = 0, group: dist.ProcessGroup | None = None) -> Any:
    """``src``'s ``obj`` on every rank of ``group`` (``src`` is a group rank); ``obj`` itself with one rank.
    Every rank must call it."""
    if world_info(group)[0] == 1:
        return obj
    payload = [obj]
    global_src = dist.get_global_rank(group, src) if group is not None else src

    def call() -> None:
        dist.broadcast_object_list(payload, src=global_src, group=group)
        if backend(group) == "gloo":
            dist.barrier(group=group)  # the GIL is free while we wait: a worker can drop its temporaries

    return _launch("broadcast_object", call, (), group, False, lambda: payload[0])


def gather_objects(obj: Any, group: dist.ProcessGroup | None = None) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank of ``group``. Every rank must call it."""
    W, _ = world_info(group)
    if W == 1:
        return [obj]
    out: list[Any] = [None] * W

    def call() -> None:
        dist.all_gather_object(out, obj, group=group)
        if backend(group) == "gloo":
            dist.barrier(group=group)  # as in broadcast_object: let gloo's workers drop their temporaries

    return _launch("gather_objects", call, (), group, False, lambda: out)
