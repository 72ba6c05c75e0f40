"""distlab's optimizers in a plain torch.distributed script: no Lightning, no distlab harness.

    torchrun --standalone --nproc_per_node=2 scripts/plain_distmuon.py
    torchrun --standalone --nproc_per_node=3 scripts/plain_distmuon.py --which combined

A small MLP trains a few steps with DistMuon (hidden matrices) + DistAdamW (the rest), or with one
DistMuonAdamW over muon_param_groups (``--which combined``). No gradient-sync mode is given: the
optimizers see different gradients per rank and average them themselves. At the end the script checks,
with its own ``dist.all_gather`` (the kind of trailing gloo collective that used to abort a process at
exit, pytorch#117762), that every rank holds the same weights, and prints one line on rank 0.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import distlab.distributed.gloo
from distlab.optim import DistAdamW, DistMuon, DistMuonAdamW, muon_param_groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--which", choices=["split", "combined"], default="split")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial weights on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 4),
    )
    if args.which == "split":
        opts = [
            DistMuon([p for p in model.parameters() if p.ndim == 2], lr=0.02),
            DistAdamW([p for p in model.parameters() if p.ndim != 2], lr=1e-3),
        ]
    else:
        opts = [DistMuonAdamW(muon_param_groups(model, lr=0.02, adamw_lr=1e-3, verbose=False))]
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own micro-batches
    for _ in range(args.steps):
        loss = model(torch.randn(8, 16, generator=data)).square().mean()
        loss.backward()
        for opt in opts:
            opt.step()
            opt.zero_grad()

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)  # the user's own gloo collective, right before exit
    identical = all(torch.equal(everyone[0], t) for t in everyone)
    if rank == 0:
        modes = ",".join(str(o.mode) for o in opts)
        print(
            f"ranks={world} identical={identical} modes={modes} exit_drain={distlab.distributed.gloo._exit_drain_installed}"
        )
    if not identical:
        raise SystemExit(f"rank {rank}: weights differ across ranks")


if __name__ == "__main__":
    main()
