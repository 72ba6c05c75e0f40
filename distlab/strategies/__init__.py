"""distlab's Lightning strategies, registered by name on import (``import distlab`` does it).

- ``ddp_optimizer_sync`` / ``ddp_optimizer_sync_spawn``: :class:`OptimizerSyncDDPStrategy`.
"""

from lightning.pytorch.strategies import StrategyRegistry

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


register_strategies()

__all__ = ["OptimizerSyncDDPStrategy", "broadcast_module_states", "grad_sync_for", "register_strategies"]
