"""ZeRO-1: every rank holds the whole model; optimizer state and update work are split over the ranks.

One step is four phases, each a method of :class:`Zero1Engine`:

  1. reduce  - this rank's averaged gradient of each piece it owns. A *piece* is a Muon chunk (W
               same-shape matrices, one per rank) or one AdamW param (a flat 1/W slice per rank). Three
               ways, each returning the owned gradients: one coalesced reduce_scatter for every piece,
               one async reduce_scatter per piece, or (grads already averaged by a DDP wrapper, or one
               process) just this rank's part of the local gradient.
  2. clip    - optional global-norm clipping from the owned gradients (one scalar all_reduce).
  3. update  - torch's exact Muon / AdamW math (:mod:`distlab.optim.functional`) on the owned pieces;
               state lives only on the owner.
  4. gather  - all_gather the updated pieces so every rank ends with bit-identical params.

In the per-piece path each piece is updated as soon as its reduction lands and its all_gather starts
right away, so Newton-Schulz on one piece overlaps the communication of others.

Checkpoints: :meth:`Zero1Engine.consolidate` gathers the full, torch-format state on one rank;
:meth:`Zero1Engine.load_param_state` keeps the part of a full state this rank owns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from distlab.distributed import Pending, all_gather, backend, reduce_scatter_sum, world_info

from .functional import (
    adamw_,
    adamw_state,
    any_rank,
    clip_coefficient,
    global_grad_norm,
    matrix_shape,
    muon_apply_,
    muon_momentum_,
    scalar_dtype,
    torch_scalar,
)
from .layout import Layout, first

if TYPE_CHECKING:
    from .dist_optim import DistMuonAdamW


@dataclass
class Piece:
    """One unit of step work: a Muon chunk or an AdamW param, of which this rank owns one part."""

    kind: str  # "muon" | "adamw"
    slots: list[int | None]  # muon: param index per rank (None = padding); adamw: [j]
    owned: int | None  # the param this rank updates (None: a padding slot)
    numel: int  # elements each rank owns: a whole matrix, or a flat 1/W slice
    updates: bool  # this rank has something to update (its param is active)


def flat_slice(t: Tensor, k: int, rank: int, world: int) -> Tensor:
    """(any shape, numel n) -> (k,) = rank's slice of flatten(t) zero-padded to W*k. A view when no padding is needed."""
    flat, lo = t.reshape(-1), rank * k
    hi = min(lo + k, flat.numel())
    if world == 1 or (hi - lo == k and t.is_contiguous()):
        return flat[lo:hi]
    out = t.new_zeros(k)
    if hi > lo:
        out[: hi - lo] = flat[lo:hi]
    return out


def _grad_or_zeros(L: Layout, j: int | None, like: Tensor) -> Tensor:
    g = None if j is None else L.params[j].grad
    return torch.zeros_like(like) if g is None else g


def _owned(piece: Piece, g: Tensor | Pending | None) -> Tensor | None:
    """Wait for a piece's reduction (idempotent); the owned gradient, or None when there is nothing to update."""
    if isinstance(g, Pending):
        g = g.wait()
    return g if piece.updates else None


class Zero1Engine:
    """The ZeRO-1 step and state handling of a :class:`~distlab.optim.DistMuonAdamW` (modes reduce/averaged)."""

    modes = ("reduce", "averaged")  # DistMuonAdamW's grad_sync values for this path

    def __init__(self, opt: DistMuonAdamW) -> None:
        self.opt = opt
        self.group = opt.process_group
        world, rank = world_info(self.group)
        self.layout = Layout.build(opt.param_groups, world, rank)
        self.gathers_state = world > 1  # state_dict() needs consolidate() first

    # ---- the step ------------------------------------------------------------------------------------

    def step(self, mode: str) -> None:
        """One step. ``mode``: "reduce" - average the gradients here; "averaged" - a DDP wrapper already did."""
        L = self.layout
        active = any_rank([p.grad is not None for p in L.params], self.group, L.params[0].device)
        pieces, coalesce = self._pieces(active), self._coalesced()
        if mode == "averaged" or L.world == 1:
            grads = self._local_grads(pieces)  # 1. reduce: nothing to do
        elif coalesce:
            grads = self._reduce_coalesced(pieces)  # 1. reduce: one reduce_scatter for every piece
        else:
            grads = [self._reduce_piece(p) for p in pieces]  # 1. reduce: one async reduce_scatter per piece
        coef = self._clip(pieces, grads)  # 2. clip (None: off)
        self._update_and_gather(pieces, grads, coef, coalesce)  # 3. update each owned part, 4. gather

    def _pieces(self, active: list[bool]) -> list[Piece]:
        """Muon chunks with an active matrix, then active AdamW params (the same order on every rank)."""
        L, out = self.layout, []
        for chunk in L.chunks:
            if any(j is not None and active[j] for j in chunk):
                mine = chunk[L.rank]
                updates = mine is not None and active[mine]
                out.append(Piece("muon", chunk, mine, L.params[first(chunk)].numel(), updates))
        for j, kind in enumerate(L.kinds):
            if kind == "adamw" and active[j]:
                out.append(Piece("adamw", [j], j, L.shard_len(j), True))
        return out

    # 1. reduce -----------------------------------------------------------------------------------------

    def _local_grads(self, pieces: list[Piece]) -> list[Tensor | None]:
        """Grads already averaged (or one process): this rank's part of its own gradient."""
        L, out = self.layout, []
        for piece in pieces:
            j = piece.owned
            if piece.kind == "muon":
                out.append(_grad_or_zeros(L, j, L.params[j]) if piece.updates else None)
            else:
                out.append(flat_slice(_grad_or_zeros(L, j, L.params[j]), piece.numel, L.rank, L.world))
        return out

    def _reduce_coalesced(self, pieces: list[Piece]) -> list[Tensor]:
        """One reduce_scatter for every piece; each owned gradient is a view of its result."""
        L = self.layout
        owned = reduce_scatter_sum(self._pack_grads(pieces), self.group).div_(L.world)  # (S,)
        parts = owned.split([piece.numel for piece in pieces])
        return [
            part.view(L.params[first(p.slots)].shape) if p.kind == "muon" else part  # (m, n) / (k,)
            for p, part in zip(pieces, parts, strict=True)
        ]

    def _reduce_piece(self, piece: Piece) -> Pending:
        """One async reduce_scatter: Muon (W, m, n) -> this rank's (m, n); AdamW (W*k,) -> its (k,)."""
        L, W = self.layout, self.layout.world
        like = L.params[first(piece.slots)]
        if piece.kind == "muon":
            stacked = torch.stack([_grad_or_zeros(L, j, like) for j in piece.slots])  # (W, m, n)
            return reduce_scatter_sum(stacked, self.group, async_op=True).then(lambda g: g[0].div_(W))
        padded = F.pad(_grad_or_zeros(L, piece.owned, like).reshape(-1), (0, W * piece.numel - like.numel()))
        return reduce_scatter_sum(padded, self.group, async_op=True).then(lambda g: g.div_(W))

    def _pack_grads(self, pieces: list[Piece]) -> Tensor:
        """All pieces' gradients side by side: row w of the (W, S) buffer is what rank w owns; returned flat.

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

    def _coalesced(self) -> bool:
        """Whether this step packs every piece into one reduce_scatter and one all_gather (see ``coalesce``)."""
        L, coalesce = self.layout, self.opt.coalesce
        if L.world == 1:
            return False
        uniform = len({(p.dtype, p.device) for p in L.params}) == 1
        if coalesce is None:
            return uniform and backend(self.group) == "gloo"
        if coalesce and not uniform:
            kinds = sorted({f"{p.dtype}/{p.device}" for p in L.params})
            raise ValueError(
                f"coalesce=True needs one dtype and device for all params, got {kinds}; set coalesce=False"
            )
        return coalesce

    # 2. clip -------------------------------------------------------------------------------------------

    def _clip(self, pieces: list[Piece], grads: list) -> Tensor | None:
        """The clipping coefficient from the owned gradients (they partition the model; padding is zero).
        Waits for every reduction first."""
        if self.opt.max_grad_norm is None:
            return None
        owned = [g for g in map(_owned, pieces, grads) if g is not None]
        total = global_grad_norm(owned, self.group, self.layout.params[0].device)
        self.opt.last_grad_norm = total
        return clip_coefficient(total, self.opt.max_grad_norm)

    # 3. update and 4. gather ---------------------------------------------------------------------------

    def _update_and_gather(
        self, pieces: list[Piece], grads: list, coef: Tensor | None, coalesce: bool
    ) -> None:
        """Each piece is updated as soon as its reduction lands; coalesced: one all_gather at the end,
        else each piece's all_gather starts right away (overlapping the next piece's Newton-Schulz)."""
        L = self.layout
        gathers: list[tuple[Piece, Pending]] = []
        parts: list[Tensor] = []  # coalesced: every updated part, gathered at once
        for piece, g in zip(pieces, grads, strict=True):
            g = _owned(piece, g)
            part = self._update(piece, g if coef is None or g is None else g * coef.to(g.dtype))
            if L.world == 1:
                continue
            if coalesce:
                parts.append(part.reshape(-1))
            else:
                part = part.unsqueeze(0) if piece.kind == "muon" else part  # gathers to (W, m, n) / (W*k,)
                gathers.append((piece, all_gather(part, self.group, async_op=True)))
        if parts:
            full = all_gather(torch.cat(parts), self.group).view(L.world, -1)  # (W, S)
            for piece, block in zip(pieces, full.split([p.numel for p in pieces], dim=1), strict=True):
                self._write_back(piece, block)  # block: (W, n)
        for piece, handle in gathers:
            self._write_back(piece, handle.wait())

    def _update(self, piece: Piece, g: Tensor | None) -> Tensor:
        """Update this rank's part of the piece (when it has a gradient); return the part to gather."""
        L, j = self.layout, piece.owned
        if piece.kind == "muon":
            if g is not None:
                self._muon(j, g)
            return L.params[j] if j is not None else torch.zeros_like(L.params[first(piece.slots)])
        p = L.params[j]
        own = flat_slice(p, piece.numel, L.rank, L.world)  # (k,): a view, or a padded copy
        if g is not None:
            self._adamw(j, own, g)
            if L.world == 1 and own.data_ptr() != p.data_ptr():
                p.copy_(own.view(p.shape))  # a non-contiguous param got a copy
        return own

    def _write_back(self, piece: Piece, full: Tensor) -> None:
        """Copy the gathered parts into every param: Muon (W, m, n) or (W, mn); AdamW (W*k,) or (W, k)."""
        L = self.layout
        if piece.kind == "adamw":
            p = L.params[piece.owned]
            p.copy_(full.reshape(-1)[: p.numel()].view(p.shape))
            return
        for w, j in enumerate(piece.slots):
            if j is not None and w != L.rank:
                L.params[j].copy_(full[w].view(L.params[j].shape))

    def _muon(self, j: int, g: Tensor) -> None:
        """torch.optim.Muon's math on one owned (m, n) matrix (or conv kernel, as its 2-D view)."""
        p, group = self.layout.params[j], self.opt.param_groups[self.layout.group_of[j]]
        state = self.opt.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(g)
        update = muon_momentum_(
            g, state["momentum_buffer"], momentum=group["momentum"], nesterov=group["nesterov"]
        )
        ortho = self.opt._newton_schulz(p, group, update)  # (out, in), or a conv kernel's (out, in*kh*kw)
        muon_apply_(
            p,
            ortho,
            lr=torch_scalar(group["lr"]),
            weight_decay=group["weight_decay"],
            adjust_lr_fn=group["adjust_lr_fn"],
            shape=matrix_shape(p),
        )

    def _adamw(self, j: int, own: Tensor, g: Tensor) -> None:
        """torch.optim.AdamW's math on this rank's flat slice ``own`` (k,) of param j."""
        p, group = self.layout.params[j], self.opt.param_groups[self.layout.group_of[j]]
        state = self.opt.state[p]
        if len(state) == 0:
            state.update(adamw_state(own))
        adamw_(
            own,
            g,
            step=state["step"],
            exp_avg=state["exp_avg"],
            exp_avg_sq=state["exp_avg_sq"],
            lr=torch_scalar(group["lr"]),
            betas=group["betas"],
            eps=group["eps"],
            weight_decay=group["weight_decay"],
        )

    # ---- checkpoints ---------------------------------------------------------------------------------

    def consolidate(self, to: int) -> dict[int, dict[str, Any]] | None:
        """Collective: the full, torch-format state (param index -> state) on rank ``to``; None elsewhere."""
        L, state = self.layout, self.opt.state
        has = any_rank([len(state.get(p, {})) > 0 for p in L.params], self.group, L.params[0].device)
        full: dict[int, dict[str, Any]] = {}
        for chunk in L.chunks:
            if not any(j is not None and has[j] for j in chunk):
                continue
            mine, like = chunk[L.rank], L.params[first(chunk)]
            st = state.get(L.params[mine], {}) if mine is not None else {}
            bufs = all_gather(
                st.get("momentum_buffer", torch.zeros_like(like)).unsqueeze(0), self.group
            )  # (W, m, n)
            if L.rank == to:
                for i, j in enumerate(chunk):
                    if j is not None and has[j]:
                        full[j] = {"momentum_buffer": bufs[i].clone()}
        for j, p in enumerate(L.params):
            if L.kinds[j] != "adamw" or not has[j]:
                continue
            st = state[p]
            if L.rank == to:
                full[j] = {"step": st["step"].clone()}
            for key in ("exp_avg", "exp_avg_sq"):
                whole = all_gather(st[key], self.group)  # (W*k,)
                if L.rank == to:
                    full[j][key] = whole[: p.numel()].view(p.shape).clone()
        return full if L.rank == to else None

    def local_full_state(self) -> dict[int, dict[str, Any]]:
        """One process: every piece is local; AdamW's flat state reshaped to the param."""
        full = {}
        for j, p in enumerate(self.layout.params):
            st = self.opt.state.get(p, {})
            if st and self.layout.kinds[j] == "adamw":
                full[j] = {"step": st["step"], **{k: st[k].view(p.shape) for k in ("exp_avg", "exp_avg_sq")}}
            elif st:
                full[j] = {"momentum_buffer": st["momentum_buffer"]}
        return full

    def load_param_state(self, j: int, saved: dict[str, Any]) -> dict[str, Any] | None:
        """The part of param j's full saved state that this rank keeps (None: another rank owns it)."""
        L, p = self.layout, self.layout.params[j]
        if L.kinds[j] == "muon":
            if L.muon_owner[j] != L.rank:
                return None
            return {"momentum_buffer": saved["momentum_buffer"].to(device=p.device, dtype=p.dtype, copy=True)}
        step = saved["step"]
        step = (
            step.detach().clone().to(scalar_dtype())
            if isinstance(step, Tensor)
            else torch.tensor(float(step), dtype=scalar_dtype())
        )
        out = {"step": step}
        for key in ("exp_avg", "exp_avg_sq"):
            t = saved[key].to(device=p.device, dtype=p.dtype)
            out[key] = flat_slice(t, L.shard_len(j), L.rank, L.world).clone()
        return out
