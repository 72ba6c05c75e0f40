"""ZeRO-1's communication: every rank holds the whole model; each owns a part of the update work and state.

A *piece* is one unit of communication: a Muon chunk (W same-shape matrices, slot i owned by rank i, see
:class:`~distlab.optim.layout.Layout`) or one AdamW param (a flat ``ceil(numel / W)`` slice per rank).
:class:`Zero1Comm` moves the tensors of :class:`~distlab.optim.DistMuonAdamW`'s step (its phases: docs/internals.md,
"DistMuonAdamW") and a checkpoint's full state, gathered on one rank and split again on load.

Example::

    comm = Zero1Comm(Layout.build(opt.param_groups, world, rank), group=None)
    grads = comm.owned_gradients(active, reduce=True, coalesce=None)   # {param index: Tensor | Pending}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from distlab.distributed import (
    Pending,
    all_gather,
    all_reduce_sum,
    any_rank,
    backend,
    reduce_scatter_sum,
    resolved,
)

from .functional import adamw_step
from .layout import Layout, first


@dataclass
class Piece:
    """One unit of communication: a Muon chunk or an AdamW param, of which this rank owns one part."""

    kind: str  # "muon" | "adamw"
    slots: list[int | None]  # muon: param index per rank (None = padding); adamw: [j]
    owned: int | None  # the param this rank updates (None: a padding slot)
    numel: int  # elements each rank owns: a whole matrix, or a flat 1/W slice
    updates: bool  # this rank has something to update (its param is active)


def flat_slice(t: Tensor, k: int, rank: int, world: int) -> Tensor:
    """(any shape, numel n) -> (k,) = rank's slice of flatten(t) zero-padded to W*k. A view when no padding is needed."""
    flat, lo = t.reshape(-1), rank * k
    if world == 1:
        return flat
    hi = min(lo + k, flat.numel())
    if hi - lo == k and t.is_contiguous():
        return flat[lo:hi]
    out = t.new_zeros(k)
    if hi > lo:
        out[: hi - lo] = flat[lo:hi]
    return out


def coalesced(layout: Layout, group: dist.ProcessGroup | None, coalesce: bool | None) -> bool:
    """Whether a step packs every piece into one reduce_scatter and one all_gather (DistMuonAdamW's ``coalesce``:
    None -> yes on gloo, where each call has a high fixed cost, when every param has one dtype and device)."""
    if layout.world == 1:
        return False
    uniform = len({(p.dtype, p.device) for p in layout.params}) == 1
    if coalesce is None:
        return uniform and backend(group) == "gloo"
    if coalesce and not uniform:
        kinds = sorted({f"{p.dtype}/{p.device}" for p in layout.params})
        raise ValueError(
            f"coalesce=True needs one dtype and device for all params, got {kinds}; set coalesce=False"
        )
    return coalesce


class Zero1Comm:
    """The collectives of a ZeRO-1 step for one :class:`Layout` over ``group`` (tensors in, tensors out)."""

    run_elements = 1 << 18  # the fewest elements one coalesced reduce_scatter carries when a step splits them

    def __init__(self, layout: Layout, group: dist.ProcessGroup | None) -> None:
        self.layout, self.group = layout, group
        self.job_groups = [group]  # every rank the params live on
        self.tree = layout.align is not None  # reproducible mode: reductions in tree_sum's fixed order
        self.device = layout.params[0].device
        self.gathers_state = layout.world > 1  # the optimizer's state_dict() needs consolidate_state() first
        self.pieces: list[Piece] = []  # this step's, set by owned_gradients() and read by gather()
        self.active: list[bool] = []  # this step's: whether some rank has param j's gradient
        self._views: dict[int, tuple[Tensor, int]] = {}  # owned parts that view their param, and its storage
        self.coalesced = False

    # ---- the step ------------------------------------------------------------------------------------

    def owned_gradients(
        self, active: list[bool], *, reduce: bool, coalesce: bool | None
    ) -> dict[int, Tensor | Pending]:
        """Param index -> this rank's averaged gradient of the part it updates: a whole Muon matrix it owns,
        or its flat slice (k,) of an AdamW param. ``active[j]``: some rank has param j's gradient.
        ``reduce``: average over the ranks here (else the gradients are already averaged)."""
        L = self.layout
        self.pieces, self.coalesced = self._pieces(active), coalesced(L, self.group, coalesce)
        self.active = active
        if not reduce or L.world == 1:
            grads = self._local_grads()
        elif self.coalesced:
            grads = self._reduce_coalesced()
        else:
            grads = [self._reduce_piece(p) for p in self.pieces]
        return {p.owned: g for p, g in zip(self.pieces, grads, strict=True) if p.updates}

    def owned_part(self, j: int) -> Tensor:
        """The tensor param j's update is applied to on this rank: the whole matrix, or a flat (k,) slice (a view
        of the param when no padding is needed, kept for the next steps; else a copy that :meth:`gather` writes
        back)."""
        L, p = self.layout, self.layout.params[j]
        view, storage = self._views.get(j, (None, None))
        if view is not None and storage == p.data_ptr():  # (p.data replaced, by .to() say: a new view)
            return view
        part = p if L.kinds[j] == "muon" else flat_slice(p, L.shard_len(j), L.rank, L.world)
        if part.untyped_storage().data_ptr() == p.untyped_storage().data_ptr():  # a view: kept while p's is
            self._views[j] = (part, p.data_ptr())
        return part

    def state_like(self, j: int) -> Tensor:
        """What param j's optimizer state is laid out like on this rank (its owned part)."""
        return self.owned_part(j)

    def row_state(self, j: int) -> Tensor:
        """Zeros (rows, 1) for a per-row state of Muon matrix j (NorMuon's), on its owner with the whole matrix."""
        p = self.layout.params[j]
        return torch.zeros(p.shape[0], 1, dtype=p.dtype, device=p.device)

    def sum_over_shards(self, t: Tensor) -> Tensor:
        """Per-matrix sums over the ranks holding its rows: one owner holds every row here."""
        return t

    def orthogonalize(
        self,
        updates: dict[int, Tensor | Pending],
        ns: Callable[[list[int], Tensor], Tensor],
        ns_dtype: Callable[[int], torch.dtype],
    ) -> dict[int, Tensor]:
        """Newton-Schulz on every matrix this rank owns, where it is (whole): no communication. One batched call per
        bucket of same-shape matrices, as soon as their gradients land (the other buckets' reductions in flight)."""
        out: dict[int, Tensor] = {}
        for js in self.layout.by_bucket(updates):
            stack = torch.stack([resolved(updates[j]) for j in js])  # (B, *shape)
            out.update(zip(js, ns(js, stack).unbind(0), strict=True))
        return out

    def gather(
        self,
        parts: dict[int, Tensor],
        muon: dict[int, Tensor],
        muon_dtype: Callable[[int], torch.dtype],
        apply_muon: Callable[[dict[int, Tensor], dict[int, Tensor]], None],
    ) -> None:
        """Every rank ends with every updated param. ``parts``: this rank's updated AdamW parts; ``muon``: the final
        updates of the Muon matrices it owns, in ``muon_dtype(j)``. Every rank receives every matrix's update and
        applies it to its own copy (``apply_muon(targets, updates)``): the owner's bits on every rank, in half the
        bytes of the updated matrix when the update is bf16."""
        L = self.layout
        if L.world == 1:
            apply_muon({j: L.params[j] for j in muon}, muon)
            for j, part in parts.items():  # a non-contiguous param's slice was a copy
                p = L.params[j]
                if part.data_ptr() != p.data_ptr():
                    p.copy_(part.view(p.shape))
            return
        if not self.pieces:  # no gradient on any rank: nothing changed
            return
        # this rank's part of each piece: its updated AdamW slice, or a Muon matrix's final update (zeros for a
        # padding slot or a matrix without a gradient anywhere)
        sent = [
            parts[p.owned]
            if p.kind == "adamw"
            else muon[p.owned]
            if p.owned in muon
            else torch.zeros_like(L.params[first(p.slots)], dtype=muon_dtype(first(p.slots)))
            for p in self.pieces
        ]
        if self.coalesced:  # one all_gather per dtype sent, all in flight before the first is written back
            by_dtype: dict[torch.dtype, list[int]] = {}
            for i, s in enumerate(sent):
                by_dtype.setdefault(s.dtype, []).append(i)
            gathers = [
                (ids, all_gather(torch.cat([sent[i].reshape(-1) for i in ids]), self.group, async_op=True))
                for ids in by_dtype.values()
            ]
            for ids, gathered in gathers:
                blocks = gathered.wait().view(L.world, -1).split([self.pieces[i].numel for i in ids], dim=1)
                self._write_back([self.pieces[i] for i in ids], blocks, apply_muon)  # (W, n) each
            return
        handles = [  # gathers to (W, m, n) / (W*k,)
            all_gather(s.unsqueeze(0) if piece.kind == "muon" else s, self.group, async_op=True)
            for piece, s in zip(self.pieces, sent, strict=True)
        ]
        for piece, handle in zip(self.pieces, handles, strict=True):
            self._write_back([piece], [handle.wait()], apply_muon)

    def chunk_norms(self, grads: dict[int, Tensor]) -> Tensor:
        """Reproducible mode (``layout.align`` = V): (P, V) fp32, the sum of squares of each of param j's V fixed
        chunks of its averaged gradient, on every rank (one all_reduce: each entry comes from the one rank that
        owns it, every other adds an exact 0). The same bits at every world size: each chunk is summed whole, as a
        fresh tensor of the same length, wherever it lives."""
        L, V = self.layout, self.layout.align
        table = torch.zeros((len(L.params), V), dtype=torch.float32, device=self.device)
        for j, g in grads.items():
            n, q = L.params[j].numel(), L.chunk_len(j)
            flat = g.reshape(-1)
            if L.kinds[j] == "muon":  # the owner holds the whole matrix: all V chunks
                first_chunk, offset = 0, 0
            else:  # a slice of V/W whole chunks, from chunk rank * V/W
                first_chunk = L.rank * (V // L.world)
                offset = first_chunk * q
            for c in range(first_chunk, V):
                lo, hi = c * q, min((c + 1) * q, n)
                if lo >= hi or lo - offset >= flat.numel():
                    break
                table[j, c] = flat[lo - offset : hi - offset].float().clone().square().sum()
        return all_reduce_sum(table, self.group)

    # ---- pieces and their reductions ---------------------------------------------------------------

    def _pieces(self, active: list[bool]) -> list[Piece]:
        """Muon chunks with an active matrix, then active AdamW params (the same order on every rank); built once
        per pattern of which params have gradients, with their runs (the pattern of the last step is kept)."""
        key = tuple(active)
        if getattr(self, "_pieces_for", (None,))[0] != key:
            L, out = self.layout, []
            for chunk in L.chunks:
                if any(j is not None and active[j] for j in chunk):
                    mine = chunk[L.rank]
                    updates = mine is not None and active[mine]
                    out.append(Piece("muon", chunk, mine, L.params[first(chunk)].numel(), updates))
            for j, kind in enumerate(L.kinds):
                if kind == "adamw" and active[j]:
                    out.append(Piece("adamw", [j], j, L.shard_len(j), True))
            self._pieces_for = (key, out, self._runs(out))
        return self._pieces_for[1]

    def _grad_or_zeros(self, j: int | None, like: Tensor) -> Tensor:
        g = None if j is None else self.layout.params[j].grad
        return torch.zeros_like(like) if g is None else g

    def _local_grads(self) -> list[Tensor | None]:
        """Grads already averaged (or one process): this rank's part of its own gradient."""
        L, out = self.layout, []
        for piece in self.pieces:
            j = piece.owned
            if piece.kind == "muon":
                out.append(self._grad_or_zeros(j, L.params[j]) if piece.updates else None)
            else:
                out.append(flat_slice(self._grad_or_zeros(j, L.params[j]), piece.numel, L.rank, L.world))
        return out

    def _reduce_coalesced(self) -> list[Pending]:
        """One async reduce_scatter per run of pieces (:meth:`_runs`); each owned gradient is a view of its run's
        result, waited for when the step first needs it: Newton-Schulz on one run overlaps the next run's transfer."""
        L, out = self.layout, []
        for run in self._pieces_for[2]:
            pieces = [self.pieces[i] for i in run]
            reduced = reduce_scatter_sum(self._pack_grads(pieces), self.group, async_op=True, tree=self.tree)
            parts = reduced.then(lambda g, pieces=pieces: g.div_(L.world).split([p.numel for p in pieces]))
            out += [
                parts.then(lambda ps, i=i, shape=L.params[first(p.slots)].shape: ps[i].view(shape))
                if p.kind == "muon"
                else parts.then(lambda ps, i=i: ps[i])  # (m, n) / (k,)
                for i, p in enumerate(pieces)
            ]
        return out

    def _runs(self, pieces: list[Piece]) -> list[list[int]]:
        """``pieces`` (indices) in runs reduced by one collective each, in the order the step needs them: Muon's
        buckets, whole, about a third of Muon's elements per run; then the AdamW params (updated after
        Newton-Schulz). A run holds at least :attr:`run_elements` (below that a call's fixed cost is more than
        what the overlap hides)."""
        L, runs, size, last = self.layout, [[]], 0, None
        third = sum(p.numel for p in pieces if p.kind == "muon") / 3
        for i, p in enumerate(pieces):
            bucket = L.bucket_of[first(p.slots)] if p.kind == "muon" else "adamw"
            full = size >= self.run_elements and (bucket == "adamw" or size >= third)
            if bucket != last and full:
                runs.append([])
                size = 0
            runs[-1].append(i)
            size, last = size + p.numel, bucket
        return [r for r in runs if r]

    def _reduce_piece(self, piece: Piece) -> Pending:
        """One async reduce_scatter: Muon (W, m, n) -> this rank's (m, n); AdamW (W*k,) -> its (k,)."""
        L, W = self.layout, self.layout.world
        like = L.params[first(piece.slots)]
        if piece.kind == "muon":
            stacked = torch.stack([self._grad_or_zeros(j, like) for j in piece.slots])  # (W, m, n)
            reduced = reduce_scatter_sum(stacked, self.group, async_op=True, tree=self.tree)
            return reduced.then(lambda g: g[0].div_(W))
        padded = F.pad(
            self._grad_or_zeros(piece.owned, like).reshape(-1), (0, W * piece.numel - like.numel())
        )
        return reduce_scatter_sum(padded, self.group, async_op=True, tree=self.tree).then(lambda g: g.div_(W))

    def _pack_grads(self, pieces: list[Piece]) -> Tensor:
        """The ``pieces``' gradients side by side: row w of the (W, S) buffer is what rank w owns; returned flat.

        Muon chunk: slot w's whole matrix; AdamW param: its w-th flat slice, zero-padded. A missing grad is zeros.
        """
        L = self.layout
        buf = L.params[0].new_empty((L.world, sum(p.numel for p in pieces)))
        blocks = buf.split([p.numel for p in pieces], dim=1)  # (W, n) views, one per piece
        for piece, dst in zip(pieces, blocks, strict=True):
            if piece.kind == "muon":
                for w, j in enumerate(piece.slots):
                    g = None if j is None else L.params[j].grad
                    dst[w].zero_() if g is None else dst[w].copy_(g.reshape(-1))
                continue
            g, k = L.params[piece.owned].grad, piece.numel
            if g is None:
                dst.zero_()
                continue
            flat = g.reshape(-1)
            rows, rem = divmod(flat.numel(), k)
            dst[:rows].copy_(flat[: rows * k].view(rows, k))
            dst[rows:].zero_()
            if rem:
                dst[rows, :rem].copy_(flat[rows * k :])
        return buf.reshape(-1)

    def _write_back(
        self,
        pieces: list[Piece],
        fulls: list[Tensor],
        apply_muon: Callable[[dict[int, Tensor], dict[int, Tensor]], None],
    ) -> None:
        """Copy the gathered AdamW parts into their params ((W*k,) or (W, k)); apply the gathered Muon updates
        ((W, m, n) or (W, mn)) to every matrix a rank updated, in one call."""
        L, targets, updates = self.layout, {}, {}
        for piece, full in zip(pieces, fulls, strict=True):
            if piece.kind == "adamw":
                p = L.params[piece.owned]
                p.copy_(full.reshape(-1)[: p.numel()].view(p.shape))
                continue
            for w, j in enumerate(piece.slots):
                if j is not None and self.active[j]:
                    targets[j], updates[j] = L.params[j], full[w]
        if updates:
            apply_muon(targets, updates)

    # ---- checkpoints ---------------------------------------------------------------------------------

    def consolidate_state(self, states: list[dict[str, Any]], to: int) -> dict[int, dict[str, Any]] | None:
        """Collective: the full, torch-format state (param index -> state) on rank ``to``; None elsewhere.
        ``states[j]``: this rank's state of param j (empty where another rank owns it)."""
        L = self.layout
        has = any_rank([len(st) > 0 for st in states], self.group, self.device)
        owned = [states[c[L.rank]] if c[L.rank] is not None else {} for c in L.chunks]
        rowwise = any_rank(["normuon_v" in st for st in owned], self.group, self.device)  # NorMuon's rows
        full: dict[int, dict[str, Any]] = {}
        for chunk, st, with_rows in zip(L.chunks, owned, rowwise, strict=True):
            if not any(j is not None and has[j] for j in chunk):
                continue
            like = L.params[first(chunk)]
            keys = {"momentum_buffer": torch.zeros_like(like)}
            if with_rows:
                keys["normuon_v"] = torch.zeros(like.shape[0], 1, dtype=like.dtype, device=like.device)
            for key, zeros in keys.items():
                bufs = all_gather(st.get(key, zeros).unsqueeze(0), self.group)  # (W, *shape)
                if L.rank == to:
                    for i, j in enumerate(chunk):
                        if j is not None and has[j]:
                            full.setdefault(j, {})[key] = bufs[i].clone()
        for j, p in enumerate(L.params):
            if L.kinds[j] != "adamw" or not has[j]:
                continue
            st = states[j]
            if L.rank == to:
                full[j] = {"step": st["step"].clone()}
            for key in ("exp_avg", "exp_avg_sq"):
                whole = all_gather(st[key], self.group)  # (W*k,)
                if L.rank == to:
                    full[j][key] = whole[: p.numel()].view(p.shape).clone()
        return full if L.rank == to else None

    def full_state(self, states: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """One process: every part is whole; AdamW's flat state reshaped to the param."""
        full = {}
        for j, (p, st) in enumerate(zip(self.layout.params, states, strict=True)):
            if st and self.layout.kinds[j] == "adamw":
                full[j] = {"step": st["step"], **{k: st[k].view(p.shape) for k in ("exp_avg", "exp_avg_sq")}}
            elif st:
                full[j] = dict(st)
        return full

    def owned_state(self, j: int, saved: dict[str, Any]) -> dict[str, Any] | None:
        """The part of param j's full saved state that this rank keeps (None: another rank owns it)."""
        L, p = self.layout, self.layout.params[j]
        if L.kinds[j] == "muon":
            if L.muon_owner[j] != L.rank:
                return None
            return {k: v.to(device=p.device, dtype=p.dtype, copy=True) for k, v in saved.items()}
        out = {"step": adamw_step(saved["step"])}
        for key in ("exp_avg", "exp_avg_sq"):
            t = saved[key].to(device=p.device, dtype=p.dtype)
            out[key] = flat_slice(t, L.shard_len(j), L.rank, L.world).clone()
        return out
