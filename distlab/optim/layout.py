"""Who owns what: the split of an optimizer's params over the ranks of one group, shared by both paths.

Params are numbered in ``param_groups`` order. Muon matrices are grouped into *chunks* of W same-shape
matrices (same group and dtype); slot i of a chunk belongs to rank i, which runs that matrix's
Newton-Schulz. A bucket's last, partial chunk starts where the previous one stopped, so padding (and
the Newton-Schulz work) is spread over the ranks. AdamW params are split element-wise: every rank owns
a flat slice of ``ceil(numel / W)`` elements (ZeRO-1), or its FSDP2 shard.

Example::

    L = Layout.build(opt.param_groups, world=2, rank=0)
    L.chunks          # [[0, 1], [2, None]]: rank 0 owns params 0 and 2, rank 1 owns param 1
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor


@dataclass
class Layout:
    """The ownership of every param for one (world size, rank)."""

    world: int
    rank: int
    params: list[Tensor]  # all params, global order
    kinds: list[str]  # "muon" | "adamw" per param
    group_of: list[int]  # param group index per param
    chunks: list[list[int | None]]  # muon: W param indices per chunk, slot i owned by rank i, None = padding
    muon_owner: dict[int, int]  # muon param index -> owning rank
    bucket_of: dict[int, int]  # muon param index -> bucket (same group, shape, dtype: one batched NS)
    align: int | None = None  # reproducible mode: AdamW slices are whole chunks of `align` per param

    @classmethod
    def build(
        cls, param_groups: list[dict[str, Any]], world: int, rank: int, align: int | None = None
    ) -> Layout:
        params, kinds, group_of = [], [], []
        buckets: dict[tuple, list[int]] = {}
        for gi, group in enumerate(param_groups):
            for p in group["params"]:
                j = len(params)
                params.append(p)
                kinds.append(group["kind"])
                group_of.append(gi)
                if group["kind"] == "muon":
                    buckets.setdefault((gi, tuple(p.shape), p.dtype), []).append(j)
        chunks: list[list[int | None]] = []
        offset = 0
        for idxs in buckets.values():
            n_full = len(idxs) // world * world
            chunks += [list(idxs[c : c + world]) for c in range(0, n_full, world)]
            rest = idxs[n_full:]
            if rest:
                last: list[int | None] = [None] * world
                for i, j in enumerate(rest):
                    last[(offset + i) % world] = j
                offset = (offset + len(rest)) % world
                chunks.append(last)
        muon_owner = {j: slot for chunk in chunks for slot, j in enumerate(chunk) if j is not None}
        bucket_of = {j: b for b, idxs in enumerate(buckets.values()) for j in idxs}
        return cls(world, rank, params, kinds, group_of, chunks, muon_owner, bucket_of, align)

    def by_bucket(self, js: Iterable[int]) -> list[list[int]]:
        """Muon param indices ``js`` grouped by bucket (each a stack for one batched Newton-Schulz), in order."""
        out: dict[int, list[int]] = {}
        for j in js:
            out.setdefault(self.bucket_of[j], []).append(j)
        return list(out.values())

    def shard_len(self, j: int) -> int:
        """AdamW under ZeRO-1: every rank owns a flat slice of ceil(numel / W) elements of param j; with ``align``
        (a multiple of W) the slice is ``align / W`` whole chunks of :meth:`chunk_len` elements."""
        if self.align:
            return self.chunk_len(j) * (self.align // self.world)
        return -(-self.params[j].numel() // self.world)

    def chunk_len(self, j: int) -> int:
        """Reproducible mode: param j's flat elements fall into ``align`` fixed chunks of ceil(numel / align)."""
        return -(-self.params[j].numel() // (self.align or 1))


def first(chunk: list[int | None]) -> int:
    """The first real (non-padding) param index of a chunk."""
    return next(j for j in chunk if j is not None)


class Comm(Protocol):
    """What the optimizer's step asks of its communication, whichever way the params are laid out: every rank's
    averaged gradients of the parts it updates, Newton-Schulz on whole matrices, and the updated parts where they
    belong. :class:`~distlab.optim.zero1_comm.Zero1Comm` (whole params, ZeRO-1) and
    :class:`~distlab.optim.fsdp2_comm.FSDP2Comm` (FSDP2 shards) are the two; they take and return tensors and never
    see the optimizer."""

    layout: Layout
    group: Any
    device: Any
    job_groups: list[Any]
    gathers_state: bool

    def owned_gradients(
        self, active: list[bool], *, reduce: bool, coalesce: bool | None
    ) -> dict[int, Any]: ...

    def owned_part(self, j: int) -> Tensor: ...

    def state_like(self, j: int) -> Tensor: ...

    def row_state(self, j: int) -> Tensor:
        """Zeros (rows, 1) laid out like the rows of param j this rank updates (a per-row state: NorMuon's)."""

    def sum_over_shards(self, t: Tensor) -> Tensor:
        """(B,) per-matrix partial sums of this rank's rows -> the sums over every row of each matrix."""

    def orthogonalize(self, updates: dict[int, Any], ns: Any, ns_dtype: Any) -> dict[int, Tensor]:
        """``ns(js, stack)``: Newton-Schulz on a (B, m, n) stack of whole matrices of one bucket -> (B, m, n)."""

    def gather(
        self, parts: dict[int, Tensor], muon: dict[int, Tensor], muon_dtype: Any, apply_muon: Any
    ) -> None:
        """Every updated param where it belongs: the AdamW ``parts``, and the Muon updates ``muon`` (in
        ``muon_dtype(j)``) applied by ``apply_muon(targets, updates)`` to every copy or shard they update."""

    def full_state(self, states: list[dict[str, Any]]) -> dict[int, dict[str, Any]]: ...

    def owned_state(self, j: int, saved: dict[str, Any]) -> dict[str, Any] | None: ...
