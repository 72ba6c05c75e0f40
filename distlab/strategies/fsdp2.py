"""FSDP2 (``fully_shard``) data parallelism on CUDA (nccl) and CPU (gloo), with DistMuonAdamW on the shards.

Built on Lightning 2.6's ``ModelParallelStrategy`` (FSDP2 + TP, where the LightningModule shards itself in
``configure_model()``); docs/internals.md, "FSDP2", says what it adds: the strategy shards any LightningModule
(:func:`distlab.parallel.shard_lightning_module`), and ``start_method`` "spawn"/"fork", which the parent lacks. Also:

- The parent's ``"auto"`` sizes mean dp = nodes, tp = devices per node: we pin dp = world size, tp = 1. Its mesh is
  ``init_device_mesh(root_device.type, ...)``, so CPU/gloo works as is.
- Checkpoints: DCP's ``get/set_optimizer_state_dict`` call the optimizer's own ``state_dict()`` /
  ``load_state_dict()`` and map param ids <-> names, so DistMuonAdamW's state (DTensors sharded like the params)
  is saved without consolidation. ``save_distributed_checkpoint=True`` (default): a DCP folder per checkpoint,
  which reshards on load. (DCP's ``_init_optim_state`` first runs one zero-grad, lr=0 step on an empty optimizer;
  harmless here.) ``async_save=True``: see :mod:`distlab.checkpoint.async_save`. DCP writes one rank's copy of
  each replicated (non-DTensor) tensor, and buffers such as BatchNorm's running statistics differ per rank:
  ``lightning_module_state_dict`` gives DCP rank 0's, as ``ddp`` checkpoints hold.
- ``Trainer(sync_batchnorm=True)``, which ModelParallelStrategy ignores, converts the BatchNorm layers before
  sharding, as ``ddp`` does before wrapping.
- Mixed precision is FSDP2's ``MixedPrecisionPolicy`` (``param_dtype``, ``reduce_dtype``); keep the Trainer's
  ``precision`` at "32-true" (fp32 master weights).

YAML::

    trainer:
      strategy: fsdp2             # popen / torchrun; fsdp2_spawn for CPU CI and notebooks
    # or, with options:
      strategy:
        class_path: distlab.strategies.FSDP2Strategy
        init_args: {param_dtype: bfloat16, reduce_dtype: float32}
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from distlab.checkpoint import check_lightning_checkpoint
from distlab.checkpoint.async_save import AsyncCheckpointWriter
from distlab.checkpoint.integrity import check_intact, write_record
from distlab.compat import (
    GradientUse,
    layer_sync,
    materialize_distributed_module,
    optimizers_to_device,
    patched,
    saves_distributed_checkpoint,
    set_parallel_sizes,
    set_start_method,
)
from distlab.distributed import any_rank, broadcast_coalesced, cpu_group
from distlab.domains import PositiveInt, check_domains
from distlab.dtypes import DtypeName, parse_dtype
from distlab.errors import ConfigError, DistlabError
from distlab.log import info_rank0
from distlab.parallel.parallelize import STEP_METHODS, hsdp_mesh, shard_lightning_module
from distlab.strategies.base import BackendName, DistlabStrategyMixin, StartMethod
from distlab.strategies.launcher import SpawnLauncher


class _FullStateMultiProcessingLauncher(SpawnLauncher):
    """Lightning's spawn launcher (allowed in notebooks: launcher.py), but rank 0 sends full tensors (not
    DTensor shards) to the parent."""

    def _collect_rank_zero_results(self, trainer, results):
        from torch.distributed.tensor import DTensor

        module = trainer.lightning_module
        original = module.state_dict

        def full_state_dict(*args: Any, **kwargs: Any) -> dict:
            state = original(*args, **kwargs)  # same order on every rank: full_tensor() is collective
            return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}

        with patched(module, "state_dict", full_state_dict):
            return super()._collect_rank_zero_results(trainer, results)


class FSDP2Strategy(DistlabStrategyMixin, ModelParallelStrategy):
    """FSDP2 data parallel over all processes (see the module docstring for what differs from Lightning's).

    Args:
        param_dtype: compute dtype of gathered params ("bfloat16" on GPU); None keeps fp32.
        reduce_dtype: gradient reduce-scatter dtype (default fp32).
        reshard_after_forward: free each block's gathered params after its forward.
        cpu_offload: keep sharded params / grads / optimizer state on CPU (FSDP2 CPUOffloadPolicy).
        start_method: "popen" (subprocess script / torchrun), "spawn" or "fork".
        save_distributed_checkpoint: True: DCP folder per checkpoint (resharding resume); False: one file
            assembled on rank 0.
        process_group_backend: "gloo" (CPU; the default there), "nccl" (CUDA; the default there), ...
        timeout: how long a collective may wait for the other ranks before the job fails.
        replicate_degree: HSDP when > 1: the ranks form ``replicate_degree`` replicas (set it to the number of
            nodes) and each parameter is sharded within a replica and replicated across them, so forward and
            backward all-gather inside a node only; must divide the world size. 1: FSDP2 over every rank.
        find_unused_parameters: as under ``ddp(find_unused_parameters=True)``, a parameter a rank did not use in a
            step gets a zero gradient from that rank, and one no rank used gets none; a unit (a block) only some
            ranks run is refused in one line instead of pairing its collectives with another unit's. Costs a flag
            per parameter per step and a tiny CPU all-reduce per unit per forward and backward. False: every rank
            must run every unit and give every trainable parameter a gradient in every step (else gloo aborts, nccl
            hangs), as FSDP2 requires; the faster choice for a transformer whose blocks all run.
    """

    strategy_name = "fsdp2"
    grad_sync = "sharded"
    spawn_launcher = _FullStateMultiProcessingLauncher

    def __init__(
        self,
        param_dtype: DtypeName | None = None,
        reduce_dtype: DtypeName | None = "float32",
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        start_method: StartMethod = "popen",
        save_distributed_checkpoint: bool = True,
        process_group_backend: BackendName | None = None,
        timeout: timedelta | None = default_pg_timeout,
        replicate_degree: PositiveInt = 1,
        find_unused_parameters: bool = True,
        async_save: bool = False,
    ) -> None:
        check_domains(FSDP2Strategy.__init__, locals())
        self._async = AsyncCheckpointWriter() if async_save else None
        self.replicate_degree = replicate_degree
        self.find_unused_parameters = find_unused_parameters
        self._gradient_use: GradientUse | None = None
        self._hsdp_mesh = None
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        set_start_method(self, start_method)
        self.fsdp2_kwargs: dict[str, Any] = dict(
            param_dtype=parse_dtype(param_dtype, "param_dtype"),
            reduce_dtype=parse_dtype(reduce_dtype, "reduce_dtype"),
            reshard_after_forward=reshard_after_forward,
            cpu_offload=cpu_offload,
        )

    @property
    def dp_mesh(self):
        """The mesh FSDP2 shards over: 1-D over all ranks, or HSDP's 2-D (replicate, shard) one."""
        if self.replicate_degree == 1:
            return self.device_mesh["data_parallel"]
        if self._hsdp_mesh is None:
            self._hsdp_mesh = hsdp_mesh(self.root_device.type, self.world_size, self.replicate_degree)
        return self._hsdp_mesh

    def setup_environment(self) -> None:
        set_parallel_sizes(self, self._launched_world(), 1)  # ranks are known by now
        super().setup_environment()

    def setup(self, trainer) -> None:
        """ModelParallelStrategy.setup, except that the strategy shards the module (no configure_model needed)."""
        assert self.model is not None and self.accelerator is not None
        self.check_trainer(trainer)
        self.accelerator.setup(trainer)
        sync = layer_sync(self)
        if trainer.state.fn == TrainerFn.FITTING and sync:
            self.model = sync.apply(self.model)
        roots = shard_lightning_module(self.lightning_module, self.dp_mesh, **self.fsdp2_kwargs)
        if roots:
            R = self.replicate_degree
            layout = f"{self.world_size // R} ranks" + (f" in each of {R} replicas (HSDP)" if R > 1 else "")
            info_rank0(
                f"fsdp2: sharded {', '.join(roots)} of {type(self.lightning_module).__name__} over {layout}"
            )
        if trainer.state.fn == TrainerFn.FITTING and self.find_unused_parameters and roots:
            self._gradient_use = GradientUse(self.lightning_module, STEP_METHODS, cpu_group)
        materialize_distributed_module(self.model, self.root_device)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.barrier()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            optimizers_to_device(self.optimizers, self.root_device)
        self.setup_optimizers_sync(trainer)

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        """Lightning's, with the gradients of parameters no rank used in this step dropped after the closure's
        backward and before the update (``find_unused_parameters``)."""
        if self._gradient_use is None:
            return super().optimizer_step(optimizer, closure, model, **kwargs)

        def closure_then_drop_unused():
            out = closure()
            params = [p for group in optimizer.param_groups for p in group["params"]]
            used = any_rank(self._gradient_use.take(params), cpu_group(), torch.device("cpu"))
            for p, someone in zip(params, used, strict=True):
                if not someone:
                    p.grad = None
            return out

        return super().optimizer_step(optimizer, closure_then_drop_unused, model, **kwargs)

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """Lightning's, with rank 0's copy of every replicated tensor (buffers) in a distributed checkpoint
        (collective; see the module docstring)."""
        from torch.distributed.tensor import DTensor

        state = super().lightning_module_state_dict()
        if saves_distributed_checkpoint(self):
            replicated = [
                k for k, v in state.items() if isinstance(v, torch.Tensor) and not isinstance(v, DTensor)
            ]
            copies = [state[k].clone() for k in replicated]  # the module's own buffers stay as they are
            broadcast_coalesced(copies, src=0)
            state.update(zip(replicated, copies, strict=True))
        return state

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        """Lightning's save; a DCP folder then gets its integrity record (every file's CRC-32), written by rank 0
        once every rank's shards are written."""
        if self._async is not None and saves_distributed_checkpoint(self):
            # Lightning's layout, so that its load reads it
            optimizers = checkpoint.pop("optimizer_states", [])
            state = {"state_dict": checkpoint.pop("state_dict")}
            state.update({f"optimizer_{i}": opt for i, opt in enumerate(optimizers)})
            self._async.save(state, checkpoint, Path(self.broadcast(filepath)), self.is_global_zero)
            return
        super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(filepath))
        if path.is_dir():
            self.barrier()
            if self.is_global_zero:
                write_record(path)

    def finish_checkpoints(self) -> None:
        """Every rank: wait for the checkpoint written in the background (``async_save``), if one is."""
        if self._async is not None:
            self._async.wait()

    def remove_checkpoint(self, filepath: Any) -> None:
        if self._async is not None and self._async.target == Path(filepath):
            self._async.wait()  # (removed after it is written, not before: it would reappear)
        super().remove_checkpoint(filepath)

    def on_train_end(self) -> None:
        self.finish_checkpoints()
        super().on_train_end()

    def teardown(self) -> None:
        try:
            self.finish_checkpoints()
        except DistlabError as e:  # the fit's own error, if any, is what the user must see first
            rank_zero_warn(str(e))
        super().teardown()

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's load (a DCP folder, or a full checkpoint file from any strategy), after the checks the CLI
        makes, so that ``trainer.fit(ckpt_path=...)`` from Python gets them too: a folder whose .metadata pickle
        would run code, and a file that is not a Lightning checkpoint readable with
        ``weights_only=True``, are one-line ConfigErrors; nothing in them runs."""
        check_intact(checkpoint_path)
        check_lightning_checkpoint(checkpoint_path)
        weights_only = True if weights_only is None else weights_only
        try:
            return super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        except (RuntimeError, ValueError, KeyError) as e:
            # a one-file checkpoint: torch's set_optimizer_state_dict on another layout
            if isinstance(e, ConfigError) or Path(checkpoint_path).is_dir():
                raise
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            raise ConfigError(
                f"{str(checkpoint_path)!r} is a one-file checkpoint (one process or ddp) whose state cannot be loaded "
                f"into fsdp2's sharded model and optimizer ({first}); resume it under the strategy that wrote it, or "
                "resume an fsdp2 fit from the checkpoint folder an fsdp2 run saved"
            ) from None

    def check_trainer(self, trainer) -> None:
        super().check_trainer(trainer)
        if trainer.world_size % self.replicate_degree:
            raise ConfigError(
                f"trainer.strategy.replicate_degree={self.replicate_degree} does not divide the {trainer.world_size} "
                f"ranks into equal replicas; set it to a divisor of {trainer.world_size} (the number of nodes, usually)"
            )
        from lightning.pytorch.callbacks import StochasticWeightAveraging, WeightAveraging

        # Lightning checks its own FSDP and DeepSpeed only; FSDP2 fails later, or pickles
        averaging = [
            cb for cb in trainer.callbacks if isinstance(cb, (WeightAveraging, StochasticWeightAveraging))
        ]
        if averaging:
            raise ConfigError(
                f"{type(averaging[0]).__name__} (Lightning's weight averaging) keeps an unsharded copy of the whole module "
                f"and does not work with a sharded model, and strategy {self.strategy_name!r} shards it; drop the "
                "callback, or train with ddp_optimizer_sync (replicated weights)"
            )
        if self.fsdp2_kwargs["cpu_offload"] and self.root_device.type == "cpu":
            raise ConfigError(
                "fsdp2 cpu_offload=true keeps GPU ranks' shards in CPU memory, but these ranks run on the CPU already "
                "(it fails in pin_memory without a GPU); set cpu_offload: false, or train on GPUs"
            )

    def check_optimizer(self, opt) -> None:
        if isinstance(opt, torch.optim.Muon):
            raise ConfigError(
                f"strategy {self.strategy_name!r} shards every matrix, and torch.optim.Muon's Newton-Schulz "
                "must see whole matrices; use distlab.optim.DistMuon / DistMuonAdamW"
            )
