"""DDP without the DDP wrapper: the optimizer does all gradient communication.

Lightning's ``ddp`` wraps the model in DistributedDataParallel, which all-reduces gradients during
backward. A sharded optimizer (DistMuonAdamW) then reduce-scatters them again: correct, but 1.5-2x
the traffic. This strategy keeps Lightning's process-group / launcher / checkpoint machinery and
drops the wrapper:

- setup broadcasts rank 0's parameters and buffers once (DDP's constructor normally does this);
- backward is purely local, so gradient accumulation costs no communication until the step;
- the optimizer reduce-scatters gradients, updates its shard, and all-gathers parameters:
  ring-all-reduce traffic with ZeRO-1 sharded optimizer state.

Every optimizer must synchronise gradients itself (``DistMuonAdamW`` / ``DistMuon`` / ``DistAdamW``,
whose mode this strategy sets to "reduce"); anything else is refused at setup with a one-line error,
never trained silently unsynchronised.

YAML::

    trainer:
      strategy: ddp_optimizer_sync          # subprocess launch or torchrun
      # strategy: ddp_optimizer_sync_spawn  # CPU CI / notebooks
"""

from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy

from distlab.distributed import broadcast_module_states
from distlab.errors import ConfigError
from distlab.strategies.base import DistlabStrategyMixin
from distlab.strategies.launcher import SpawnLauncher


class OptimizerSyncDDPStrategy(DistlabStrategyMixin, DDPStrategy):
    """Data parallel where the optimizer, not a DDP wrapper, synchronises gradients (see module docstring)."""

    strategy_name = "ddp_optimizer_sync"
    grad_sync = "reduce"

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        # *_spawn: Lightning's multiprocessing launcher, but allowed in notebooks (see launcher.py)
        if self._start_method != "popen":
            self._launcher = SpawnLauncher(self, start_method=self._start_method)

    def configure_ddp(self) -> None:
        # No wrapper: the LightningModule runs as is; start every rank from rank 0's weights.
        broadcast_module_states(self.model)

    def setup(self, trainer) -> None:
        super().setup(trainer)
        self.setup_optimizers_sync(trainer)

    def check_optimizer(self, opt) -> None:
        from distlab.optim import DistMuonAdamW

        if not isinstance(opt, DistMuonAdamW):
            raise ConfigError(
                f"strategy {self.strategy_name!r} leaves gradient sync to the optimizer, but "
                f"{type(opt).__name__} does not sync gradients; use distlab.optim.DistMuonAdamW/DistMuon/"
                "DistAdamW (model.optimizer: muon or adamw) or strategy: ddp"
            )
