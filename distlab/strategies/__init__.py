"""distlab's Lightning strategies, registered by name on import (``import distlab`` does it).

- ``ddp_optimizer_sync`` / ``ddp_optimizer_sync_spawn``: :class:`OptimizerSyncDDPStrategy`.
- ``fsdp2`` / ``fsdp2_spawn``: :class:`FSDP2Strategy` (FSDP2 on CUDA/nccl or CPU/gloo).
"""

from lightning.pytorch.strategies import StrategyRegistry

from distlab.strategies.base import DistlabStrategyMixin
from distlab.strategies.fsdp2 import FSDP2Strategy
from distlab.strategies.launcher import quick_start_method
from distlab.strategies.optimizer_sync_ddp import OptimizerSyncDDPStrategy

_STRATEGIES = (
    (OptimizerSyncDDPStrategy, "ddp_optimizer_sync", "DDP without a wrapper; the optimizer syncs gradients"),
    (FSDP2Strategy, "fsdp2", "FSDP2 (fully_shard) data parallel; DistMuonAdamW on shards"),
)


def register_strategies() -> None:
    """Register each strategy as NAME (subprocess launch / torchrun) and NAME_spawn (CPU CI, notebooks: the ranks
    start from this process, by a preloaded forkserver where the platform has one; docs/internals.md)."""
    spawn = quick_start_method("spawn")
    for cls, name, description in _STRATEGIES:
        for suffix, start_method in (("", "popen"), ("_spawn", spawn)):
            if name + suffix not in StrategyRegistry:
                StrategyRegistry.register(
                    name + suffix,
                    cls,
                    description=f"{description} (start_method={start_method!r})",
                    start_method=start_method,
                )


register_strategies()

__all__ = [
    "DistlabStrategyMixin",
    "FSDP2Strategy",
    "OptimizerSyncDDPStrategy",
    "register_strategies",
]
