"""Per-rank FSDP2 shards, for checks that must not compare gathered tensors (identical by construction).

A DTensor's ``full_tensor()`` is an all-gather: every rank gets the same tensor whatever its own shard
holds. To check ranks, compare each rank's *local* rows with the matching rows of a reference.
"""

from __future__ import annotations

import torch


def chunk_rows(n: int, world: int, rank: int) -> tuple[int, int]:
    """Rows [lo, hi) that torch.chunk gives ``rank`` of ``world`` (FSDP2's Shard(0) layout)."""
    k = -(-n // world)
    lo = min(rank * k, n)
    return lo, min(lo + k, n)


def local_shards(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, int, torch.Tensor]]:
    """{name: (lo, hi, this rank's rows)} for every DTensor in ``state`` (e.g. a module's state_dict())."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, t in state.items():
        if isinstance(t, DTensor):
            mesh = t.device_mesh
            lo, hi = chunk_rows(
                t.shape[0], mesh.size(-1), mesh.get_local_rank(-1)
            )  # the shard dimension (HSDP: the last)
            local = t.to_local().detach().cpu().clone()
            assert local.shape[0] == hi - lo, f"{name}: {local.shape[0]} local rows, expected {hi - lo}"
            out[name] = (lo, hi, local)
    return out


def assert_shards_tile(ranks_shards: list[dict], reference: dict[str, torch.Tensor], **tol) -> None:
    """Every rank's rows equal the reference's rows there, and together the ranks hold every row once."""
    assert ranks_shards and all(ranks_shards), "no shards recorded: were the parameters DTensors?"
    for name, ref in reference.items():
        covered = 0
        for r, shards in enumerate(ranks_shards):
            if name not in shards:
                continue
            lo, hi, local = shards[name]
            assert lo == covered, f"{name}: rank {r} starts at row {lo}, expected {covered}"
            torch.testing.assert_close(
                local, ref[lo:hi], **tol, msg=lambda m, n=name, r=r: f"rank {r} {n}: {m}"
            )
            covered = hi
        if any(name in s for s in ranks_shards):
            assert covered == ref.shape[0], (
                f"{name}: the ranks' shards cover {covered} of {ref.shape[0]} rows"
            )
