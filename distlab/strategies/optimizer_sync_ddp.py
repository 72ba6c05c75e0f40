"""DDP without the DDP wrapper: the optimizer does all gradient communication.

Lightning's ``ddp`` wraps the model in DistributedDataParallel, which all-reduces gradients during backward; a
sharded optimizer (DistMuonAdamW) then reduce-scatters them again: correct, but 1.5-2x the traffic. This strategy
keeps Lightning's process-group / launcher / checkpoint machinery and drops the wrapper: setup broadcasts rank 0's
parameters and buffers once (as DDP's constructor does), backward is local (accumulation costs no communication),
and the optimizer reduce-scatters, updates its shard and all-gathers (docs/internals.md, "Strategies").

Gradient clipping: Lightning clips in ``on_before_optimizer_step``, before anything is averaged, so here it would
clip each rank's local gradients (ranks diverge from ``ddp``). Every Lightning route to clipping
(``Trainer(gradient_clip_val=...)``, ``configure_gradient_clipping``, ``self.clip_gradients``) ends in the
precision plugin's ``clip_gradients``, which this strategy routes to the optimizer's own global-norm clip
(``DistMuonAdamW.max_grad_norm``, applied after its reduction) for that step: the same as ``ddp``'s clip of the
averaged gradients. Clipping by value has no such route and is refused in one line before training; so is
``precision="16-mixed"`` with a gradient scaler (CUDA), which decides from each rank's local gradients whether to
skip the step. Code that reads ``.grad`` itself before the step (``clip_grad_norm_`` called directly, a callback's
``on_before_optimizer_step``) still sees local gradients: tests/matrix/test_parity.py is the net for those.

YAML::

    trainer:
      strategy: ddp_optimizer_sync          # subprocess launch or torchrun
      # strategy: ddp_optimizer_sync_spawn  # CPU CI / notebooks
      # strategy: {class_path: distlab.strategies.OptimizerSyncDDPStrategy, init_args: {reproducible: true}}
"""

from __future__ import annotations

from datetime import timedelta

import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import GradClipAlgorithmType

from distlab.compat import patch, should_accumulate, unpatch
from distlab.distributed import broadcast_module_states
from distlab.domains import PowerOfTwo, check_domains
from distlab.errors import ConfigError
from distlab.strategies.base import BackendName, DistlabStrategyMixin, StartMethod
from distlab.strategies.reproducible import GradientTree, check_plan, check_training_data


class OptimizerSyncDDPStrategy(DistlabStrategyMixin, DDPStrategy):
    """Data parallel where the optimizer, not a DDP wrapper, synchronises gradients (see module docstring).

    Args:
        process_group_backend: "gloo" (CPU; the default there), "nccl" (CUDA; the default there), ...
        timeout: how long a collective may wait for the other ranks before the job fails.
        start_method: "popen" (subprocess launch / torchrun), "spawn", "fork" or "forkserver".
        reproducible: train the same bits at every world size that divides ``micro_shards`` (see
            :mod:`distlab.strategies.reproducible`; it sets accumulate_grad_batches to micro_shards / ranks).
        micro_shards: reproducible mode: micro-batches per global batch (a power of two; the data module's
            batch_size is one micro-batch).
        accelerator, parallel_devices, cluster_environment, checkpoint_io, precision_plugin: as Lightning's
            DDPStrategy (the Trainer fills them in). There is no DDP wrapper, so DDPStrategy's wrapper options
            (``ddp_comm_hook``, ``find_unused_parameters``, ...) do not exist here.
    """

    strategy_name = "ddp_optimizer_sync"
    grad_sync = "reduce"

    def __init__(
        self,
        process_group_backend: BackendName | None = None,
        timeout: timedelta | None = default_pg_timeout,
        start_method: StartMethod = "popen",
        reproducible: bool = False,
        micro_shards: PowerOfTwo = 8,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        check_domains(OptimizerSyncDDPStrategy.__init__, locals())
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
        )
        self.reproducible, self.micro_shards = reproducible, micro_shards
        self._gradient_tree = GradientTree()

    def configure_ddp(self) -> None:
        # No wrapper: the LightningModule runs as is; start every rank from rank 0's weights.
        broadcast_module_states(self.model)

    def check_trainer(self, trainer) -> None:
        super().check_trainer(trainer)
        if self.reproducible:
            check_plan(self.micro_shards, trainer.world_size, trainer.accumulate_grad_batches)
        if trainer.gradient_clip_val and trainer.gradient_clip_algorithm == GradClipAlgorithmType.VALUE:
            raise ConfigError(self._value_clip_refusal(trainer.gradient_clip_val))
        scaler = getattr(self.precision_plugin, "scaler", None)
        if scaler is not None and scaler.is_enabled():
            raise ConfigError(
                f"precision='16-mixed' with a gradient scaler under strategy {self.strategy_name!r}: the scaler skips a "
                "step when its rank's local, unsynced gradients hold an inf, so ranks would skip different steps (a "
                "hang); use precision='bf16-mixed' (no scaler) or strategy: ddp"
            )

    def setup(self, trainer) -> None:
        self.check_trainer(trainer)
        if self.reproducible:  # (check_trainer checked the plan)
            trainer.accumulate_grad_batches = self.micro_shards // trainer.world_size
            self._deterministic_before = (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            )
            torch.use_deterministic_algorithms(True, warn_only=True)
        super().setup(trainer)
        self.setup_optimizers_sync(trainer)
        if self.reproducible and trainer.state.fn == TrainerFn.FITTING:
            if not self.lightning_module.automatic_optimization:
                raise ConfigError(
                    "reproducible mode sums each micro-batch's gradients in a fixed tree through Lightning's gradient "
                    "accumulation, which manual optimization bypasses; use automatic optimization, or reproducible: false"
                )
            for opt in self.optimizers:
                opt.fixed_order = self.micro_shards  # the reduce-scatter and the clip norm in one fixed order
        # Lightning's clip request -> the optimizer's clip after its reduction (module docstring); this plugin
        # instance only, undone at teardown.
        self._max_grad_norms: dict = {}  # optimizer -> its own max_grad_norm while a routed clip is pending
        patch(self.precision_plugin, "clip_gradients", self._clip_after_reduce)

    def teardown(self) -> None:
        unpatch(self.precision_plugin, "clip_gradients")
        before = getattr(self, "_deterministic_before", None)
        if before is not None:  # a process-wide switch: as it was (a notebook's next run, a test process)
            torch.use_deterministic_algorithms(before[0], warn_only=before[1])
            self._deterministic_before = None
        super().teardown()

    def _value_clip_refusal(self, clip_val: float) -> str:
        return (
            f"gradient_clip_algorithm='value' (gradient_clip_val={clip_val}) under strategy {self.strategy_name!r} "
            "would clamp each rank's local, unsynced gradients; use gradient_clip_algorithm='norm' (applied by the "
            "optimizer to the averaged gradients) or strategy: ddp"
        )

    def _clip_after_reduce(
        self,
        optimizer,
        clip_val: float = 0.0,
        gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM,
    ) -> None:
        """Replaces the precision plugin's ``clip_gradients``: the optimizer's next step clips the global norm of
        the averaged gradients to ``clip_val`` (to the smaller of the two when it has a ``max_grad_norm`` of its own,
        which under ``ddp`` would clip a second time)."""
        if clip_val <= 0:  # Lightning's rule: 0 (or unset) means no clipping
            return
        if gradient_clip_algorithm == GradClipAlgorithmType.VALUE:
            raise ConfigError(self._value_clip_refusal(clip_val))
        opt = optimizer.optimizer if isinstance(optimizer, LightningOptimizer) else optimizer
        own = self._max_grad_norms.setdefault(opt, opt.max_grad_norm)
        opt.max_grad_norm = clip_val if own is None else min(own, clip_val)

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        try:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        finally:  # a routed clip lasts one step
            opt = optimizer.optimizer if isinstance(optimizer, LightningOptimizer) else optimizer
            if opt in self._max_grad_norms:
                opt.max_grad_norm = self._max_grad_norms.pop(opt)

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        """Reproducible mode: each micro-batch's gradients are set aside and summed in a fixed tree after the last."""
        super().post_backward(closure_loss)
        module = self.lightning_module
        if self.reproducible:  # (only a fit runs backward, and setup refused manual optimization)
            params = [p for p in module.parameters() if p.requires_grad]
            self._gradient_tree.add(params)
            if not should_accumulate(module.trainer):
                self._gradient_tree.finish(params)

    def process_dataloader(self, dataloader):
        """Reproducible mode: distlab.data.MicroShards learns which micro-batches this rank serves and from which micro
        step (a resume's), before Lightning draws the first batch."""
        dataloader = super().process_dataloader(dataloader)
        configure = getattr(getattr(dataloader, "dataset", None), "configure", None)
        if self.reproducible and callable(configure):
            trainer = self.lightning_module.trainer
            per_rank = trainer.accumulate_grad_batches
            configure(self.micro_shards, self.global_rank, self.world_size, trainer.global_step * per_rank)
        return dataloader

    def on_train_start(self) -> None:
        super().on_train_start()
        if self.reproducible:
            check_training_data(getattr(self.lightning_module.trainer.train_dataloader, "dataset", None))

    def check_optimizer(self, opt) -> None:
        from distlab.optim import DistMuonAdamW

        if not isinstance(opt, DistMuonAdamW):
            raise ConfigError(
                f"strategy {self.strategy_name!r} leaves gradient sync to the optimizer, but "
                f"{type(opt).__name__} does not sync gradients; use distlab.optim.DistMuonAdamW/DistMuon/"
                "DistAdamW (model.optimizer: muon or adamw), or set the strategy to ddp (--trainer.strategy=ddp; under "
                "torchrun or srun the CLI picks ddp_optimizer_sync when none is given)"
            )
