"""What every distlab strategy does on top of Lightning's, in one place.

- Once the process group exists, register the gloo exit drain (see :mod:`distlab.distributed.gloo`), and give each
  spawned rank its own copy of tensors the launcher left in shared memory (:mod:`distlab.distributed.spawn`).
- Tell each :class:`~distlab.optim.DistMuonAdamW` who averages the gradients under this strategy
  (``grad_sync``: "reduce" when the optimizer must, "sharded" under FSDP2). An optimizer left at
  ``grad_sync="auto"`` takes the strategy's mode; an explicit, different mode is a one-line error.
  Strategies without a distlab mixin (Lightning's ``ddp``) leave "auto" to the optimizer's own
  first-step check.
"""

from __future__ import annotations

from lightning.pytorch.trainer.states import TrainerFn

from distlab.distributed import backend, install_exit_drain, unshare_tensors
from distlab.errors import ConfigError
from distlab.log import info_rank0


class DistlabStrategyMixin:
    """Mix in before a Lightning strategy class; subclasses set ``grad_sync`` and may extend ``check_optimizer``."""

    grad_sync: str  # the DistMuonAdamW mode this strategy implies
    strategy_name: str

    def setup_environment(self) -> None:
        super().setup_environment()
        install_exit_drain()
        info_rank0(
            f"distlab: {self.strategy_name} on {backend()} process group, world size {self.world_size} "
            f"({self.num_nodes} node(s) x {self.num_processes} process(es)), device {self.root_device.type}"
        )
        if self.lightning_module is not None:  # spawned ranks: metric states arrive in shared memory
            unshare_tensors(self.lightning_module)

    def setup_optimizers_sync(self, trainer) -> None:
        """After Lightning built the optimizers: give each DistMuonAdamW this strategy's mode, check the rest."""
        from distlab.optim import DistMuonAdamW

        if trainer.state.fn != TrainerFn.FITTING:
            return
        for opt in self.optimizers:
            if isinstance(opt, DistMuonAdamW):
                if opt.grad_sync == "auto":
                    opt.grad_sync = self.grad_sync
                elif opt.grad_sync != self.grad_sync:
                    raise ConfigError(
                        f"strategy {self.strategy_name!r} needs the optimizer's grad_sync={self.grad_sync!r}, but "
                        f"{type(opt).__name__} was given grad_sync={opt.grad_sync!r}; leave it at 'auto'"
                    )
            self.check_optimizer(opt)

    def check_optimizer(self, opt) -> None:
        """Refuse an optimizer this strategy cannot train correctly (one-line ConfigError)."""
