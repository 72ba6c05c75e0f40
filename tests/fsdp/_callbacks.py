"""Test-only callbacks for FSDP2 fits (referenced from configs by class path)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.callbacks import SaveRankWeights


class SaveFullRankWeights(SaveRankWeights):
    """SaveRankWeights, but DTensor shards are gathered into full tensors first (collective, every rank)."""

    def on_fit_end(self, trainer, pl_module) -> None:
        from torch.distributed.tensor import DTensor

        state = {
            k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
            for k, v in pl_module.state_dict().items()
        }
        Path(self.dirpath).mkdir(parents=True, exist_ok=True)
        out = {
            "state": state,
            "world_size": trainer.world_size,
            "rank": trainer.global_rank,
            "global_step": trainer.global_step,
            "strategy": type(trainer.strategy).__name__,
            "losses": self.losses,
        }
        torch.save(out, Path(self.dirpath) / f"rank{trainer.global_rank}.pt")
