"""distlab's Lightning strategies, registered by name on import (``import distlab`` does it).

- ``ddp_optimizer_sync`` / ``ddp_optimizer_sync_spawn``: :class:`OptimizerSyncDDPStrategy`.
- ``fsdp2`` / ``fsdp2_spawn``: :class:`FSDP2Strategy` (FSDP2 on CUDA/nccl or CPU/gloo).
"""

from lightning.pytorch.strategies import StrategyRegistry

from distlab.strategies.fsdp2 import FSDP2Strategy
from distlab.strategies.optimizer_sync_ddp import (
    OptimizerSyncDDPStrategy,
    broadcast_module_states,
    grad_sync_for,
)


def register_strategies() -> None:
    for name, start_method in (("ddp_optimizer_sync", "popen"), ("ddp_optimizer_sync_spawn", "spawn")):
        if name not in StrategyRegistry:
            StrategyRegistry.register(
                name,
                OptimizerSyncDDPStrategy,
                description=f"DDP without a wrapper; the optimizer syncs gradients (start_method={start_method!r})",
                start_method=start_method,
            )
    for name, start_method in (("fsdp2", "popen"), ("fsdp2_spawn", "spawn")):
        if name not in StrategyRegistry:
            StrategyRegistry.register(
                name,
                FSDP2Strategy,
                description=f"FSDP2 (fully_shard) data parallel; DistMuonAdamW on shards (start_method={start_method!r})",
                start_method=start_method,
            )


register_strategies()

__all__ = [
    "FSDP2Strategy",
    "OptimizerSyncDDPStrategy",
    "broadcast_module_states",
    "grad_sync_for",
    "register_strategies",
]
