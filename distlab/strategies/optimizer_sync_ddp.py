"""DDP without the DDP wrapper: the optimizer does all gradient communication.

Lightning's ``ddp`` wraps the model in DistributedDataParallel, which all-reduces gradients during
backward. A sharded optimizer (DistMuonAdamW) then reduce-scatters them again: correct, but 1.5-2x
the traffic. This strategy keeps Lightning's process-group / launcher / checkpoint machinery and
drops the wrapper:

- setup broadcasts rank 0's parameters and buffers once (DDP's constructor normally does this);
- backward is purely local, so gradient accumulation costs no communication until the step;
- the optimizer reduce-scatters gradients, updates its shard, and all-gathers parameters:
  ring-all-reduce traffic with ZeRO-1 sharded optimizer state.

Every optimizer must synchronise gradients itself (``DistMuonAdamW`` with ``grad_sync="reduce"``);
anything else is refused at setup with a one-line error, never trained silently unsynchronised.

YAML::

    trainer:
      strategy: ddp_optimizer_sync          # subprocess launch or torchrun
      # strategy: ddp_optimizer_sync_spawn  # CPU CI / notebooks
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn

from distlab.errors import ConfigError
from distlab.gloo import install_exit_drain
from distlab.optim import DistMuonAdamW
from distlab.optim.comm import broadcast


def broadcast_module_states(module: torch.nn.Module, src: int = 0) -> None:
    """Make every rank's parameters and buffers equal to rank ``src``'s (one broadcast per tensor)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            broadcast(t.data, src=src)


class OptimizerSyncDDPStrategy(DDPStrategy):
    """Data parallel where the optimizer, not a DDP wrapper, synchronises gradients (see module docstring)."""

    strategy_name = "ddp_optimizer_sync"

    def configure_ddp(self) -> None:
        # No wrapper: the LightningModule runs as is; start every rank from rank 0's weights.
        broadcast_module_states(self.model)

    def setup_environment(self) -> None:
        super().setup_environment()
        install_exit_drain()  # see distlab.gloo

    def setup(self, trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            self._check_optimizers()

    def _check_optimizers(self) -> None:
        for opt in self.optimizers:
            if not isinstance(opt, DistMuonAdamW):
                raise ConfigError(
                    f"strategy {self.strategy_name!r} leaves gradient sync to the optimizer, but "
                    f"{type(opt).__name__} does not sync gradients; use distlab.optim.DistMuonAdamW/DistMuon/"
                    "DistAdamW (model.optimizer: muon or adamw) or strategy: ddp"
                )
            if opt.grad_sync != "reduce":
                raise ConfigError(
                    f"strategy {self.strategy_name!r} does not average gradients, but the optimizer has "
                    f"grad_sync={opt.grad_sync!r}; set grad_sync='reduce' (see distlab.strategies.grad_sync_for)"
                )


def grad_sync_for(strategy) -> str:
    """The DistMuonAdamW ``grad_sync`` mode a Lightning strategy needs, chosen explicitly.

    - OptimizerSyncDDPStrategy (no wrapper) and single-process strategies: "reduce";
    - DDPStrategy (DDP wrapper averages in backward): "averaged" — the optimizer then only shards
      the Newton-Schulz work and state, and all-gathers.
    - FSDP2Strategy (params are DTensor shards, grads reduce-scattered + averaged): "sharded".
    """
    from lightning.pytorch.strategies import SingleDeviceStrategy

    from distlab.strategies.fsdp2 import FSDP2Strategy

    if isinstance(strategy, FSDP2Strategy):
        return "sharded"
    if isinstance(strategy, OptimizerSyncDDPStrategy) or isinstance(strategy, SingleDeviceStrategy):
        return "reduce"
    if isinstance(strategy, DDPStrategy):
        return "averaged"
    raise ConfigError(
        f"DistMuonAdamW does not support strategy {type(strategy).__name__} yet; use ddp_optimizer_sync, ddp, "
        "fsdp2, or a single device"
    )
