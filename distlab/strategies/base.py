"""What every distlab strategy does on top of Lightning's, in one place (:class:`DistlabStrategyMixin`): give each
DistMuonAdamW left at ``grad_sync="auto"`` the strategy's mode, register the gloo exit drain and unshare what the
launcher left in shared memory (docs/internals.md, "Strategies"); refuse, in one line before training, a Trainer
setting the strategy cannot train as ``ddp`` does, and sized per-rank training data of unequal length (streamed
data ends the epoch together); broadcast rank 0's buffers where Lightning's ``ddp`` (its DDP wrapper) does: without
that wrapper BatchNorm running statistics drift apart per rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
import torch.distributed as dist
from lightning.pytorch.trainer.states import TrainerFn

from distlab.compat import layer_sync, set_launcher, start_method
from distlab.distributed import (
    all_gather,
    backend,
    broadcast_buffers,
    cpu_group,
    gather_objects,
    install_exit_drain,
    unshare_tensors,
)
from distlab.errors import ConfigError
from distlab.log import info_rank0
from distlab.strategies.launcher import SpawnLauncher

# The process-group backends this torch build names (generated, so a new one is accepted without an edit).
BackendName = Literal[tuple(b for b in dist.Backend.backend_list if b not in ("undefined", "fake"))]  # type: ignore[valid-type]
StartMethod = Literal["popen", "spawn", "fork", "forkserver"]


class DistlabStrategyMixin:
    """Mix in before a Lightning strategy class; subclasses set ``grad_sync`` and may extend ``check_optimizer``."""

    grad_sync: str  # the DistMuonAdamW mode this strategy implies
    strategy_name: str

    # the launcher of start methods other than "popen" (*_spawn): Lightning's multiprocessing one, allowed in notebooks
    spawn_launcher = SpawnLauncher

    def _configure_launcher(self) -> None:
        """When a Trainer takes the strategy (its process count known): a launch environment that does not fit it,
        or a backend this machine or torch build lacks, is one line here, not a wait or torch's error in each rank."""
        from distlab.launch import check_backend, check_launch_env, started_by_cluster

        check_launch_env(self.num_nodes, self.num_processes, cluster=started_by_cluster(self))
        check_backend(self, self._launched_world())
        super()._configure_launcher()
        if start_method(self) != "popen":
            set_launcher(self, self.spawn_launcher(self, start_method=start_method(self)))

    def _launched_world(self) -> int:
        """The job's ranks: devices x num_nodes, which the launch environment was checked against (Ray's workers:
        the world Ray started, :mod:`distlab.ray_train`)."""
        return self.num_nodes * self.num_processes

    def setup_environment(self) -> None:
        super().setup_environment()
        self._buffers_due = True
        install_exit_drain()
        info_rank0(
            f"distlab: {self.strategy_name} on {backend()} process group, world size {self.world_size} "
            f"({self.num_nodes} node(s) x {self.num_processes} process(es)), device {self.root_device.type}"
        )
        if self.lightning_module is not None:  # spawned ranks: metric states arrive in shared memory
            unshare_tensors(self.lightning_module)

    def check_trainer(self, trainer) -> None:
        """At the start of ``setup``: refuse (one-line ConfigError) what this strategy cannot train as ``ddp`` does."""
        if (
            trainer.state.fn == TrainerFn.FITTING
            and layer_sync(self) is not None
            and self.root_device.type == "cpu"
        ):
            raise ConfigError(
                "Trainer(sync_batchnorm=True) on CPU: torch's SyncBatchNorm runs on GPUs only (Lightning's ddp fails "
                "too: 'SyncBatchNorm layers only work with GPU modules'); set sync_batchnorm=False or train on GPUs"
            )

    # ---- per-rank training data of unequal length ---------------------------------------------------------
    _per_batch_check = False  # some loader has no length: the ranks compare "last batch?" at every batch

    def on_train_start(self) -> None:
        """Compare every rank's batches per epoch (one exchange per fit). Loaders with a length that differ are
        refused in one line: rank r's data would run out at a known step while the others train on. Without a
        length (a stream), the ranks compare at every batch (:meth:`on_train_batch_start`)."""
        super().on_train_start()
        trainer = self.lightning_module.trainer
        # (batches per epoch, inf without a length; whether the stream says it never ends: ``endless = True``)
        dataset = getattr(trainer.train_dataloader, "dataset", None)
        mine = (float(trainer.num_training_batches), bool(getattr(dataset, "endless", False)))
        reports = gather_objects(mine)
        counts = [n for n, _ in reports]
        never_end = all(endless for _, endless in reports)  # distlab's TrainWindows: nobody runs out
        self._per_batch_check = len(counts) > 1 and not never_end and any(c == float("inf") for c in counts)
        self._ran_out_told = -1  # the last epoch whose early end was logged
        self._flag_group = cpu_group() if self._per_batch_check else None  # a CPU exchange: no GPU sync
        if not self._per_batch_check and len(set(counts)) > 1:
            short, longest = counts.index(min(counts)), counts.index(max(counts))
            n = int(min(counts))
            step = trainer.global_step + math.ceil(n / trainer.accumulate_grad_batches)
            raise ConfigError(
                f"per-rank training data of unequal length: rank {short} has {n} batches per epoch, rank {longest} "
                f"{int(max(counts))}, so rank {short}'s data runs out after step {step} while rank {longest} trains "
                "on (under ddp: a hang or an abort); give every rank the same number of batches (a "
                "DistributedSampler does), or stream the data (an IterableDataset: every rank then ends the "
                "epoch when the first runs out)"
            )

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Streamed data: when some rank is at its last batch, it is every rank's last of the epoch (Lightning's
        ``is_last_batch``: accumulation steps there, epoch-end validation runs, the epoch loop ends after it),
        and rank 0 says which rank ran out, after which batch and at which step."""
        super().on_train_batch_start(batch, batch_idx)
        if not self._per_batch_check:
            return
        trainer = self.lightning_module.trainer
        progress = trainer.fit_loop.epoch_loop.batch_progress
        last = torch.tensor([int(progress.is_last_batch)])
        flags = all_gather(last, self._flag_group).tolist()  # (W,): which ranks are at their last batch
        if any(flags):
            if not all(flags) and trainer.current_epoch != self._ran_out_told:
                self._ran_out_told = trainer.current_epoch
                info_rank0(
                    f"distlab: rank {flags.index(1)}'s training data ran out after batch {batch_idx + 1} of epoch "
                    f"{trainer.current_epoch} (step {trainer.global_step + 1}) while rank {flags.index(0)} had more; "
                    "every rank ends the epoch there (under ddp the ranks would hang or abort at the next step); "
                    "give every rank the same number of batches to train on all of them"
                )
            progress.is_last_batch = True

    # ---- buffers: the DDP wrapper's forward-time broadcast, without the wrapper -------------------------
    # DDP (torch/nn/parallel/distributed.py, ``require_forward_param_sync``) broadcasts rank 0's buffers before
    # a forward when the previous forward or backward synced gradients: a grad-enabled training forward
    # outside ``no_sync`` (Lightning's accumulation micro-batches run inside it), or, under manual
    # optimization, ``manual_backward`` (Lightning turns the forward's sync off there). Lightning runs one
    # wrapper forward per step method, so the same rule is kept here per step method.
    _buffers_due = True  # DDP's constructor leaves its flag set: the first forward broadcasts
    _backward_sync_blocked = False

    def _sync_buffers_if_due(self) -> None:
        module = self.lightning_module
        # Lightning's ddp wraps the model only to fit (validate / test / predict run unwrapped): the same here.
        if self._buffers_due and module is not None and module.trainer.state.fn == TrainerFn.FITTING:
            broadcast_buffers(module)

    def _syncing_grad_pass(self) -> bool:
        return torch.is_grad_enabled() and not self._backward_sync_blocked

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        self._sync_buffers_if_due()
        out = super().training_step(*args, **kwargs)
        self._buffers_due = self._syncing_grad_pass() and self.lightning_module.automatic_optimization
        return out

    def _eval_step(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self._sync_buffers_if_due()
        out = getattr(super(), method)(*args, **kwargs)
        self._buffers_due = self._syncing_grad_pass()  # False under Lightning's no_grad / inference_mode
        return out

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._eval_step("validation_step", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._eval_step("test_step", *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._eval_step("predict_step", *args, **kwargs)

    def pre_backward(self, closure_loss: torch.Tensor) -> None:
        super().pre_backward(closure_loss)
        if not self.lightning_module.automatic_optimization:
            self._buffers_due = self._syncing_grad_pass()  # DDP's prepare_for_backward, under manual_backward

    @contextmanager
    def block_backward_sync(self) -> Iterator[None]:
        """Lightning wraps the micro-batches that only accumulate in this (DDP: ``no_sync``)."""
        self._backward_sync_blocked = True
        try:
            with super().block_backward_sync():
                yield
        finally:
            self._backward_sync_blocked = False

    def setup_optimizers_sync(self, trainer) -> None:
        """After Lightning built the optimizers: give each DistMuonAdamW this strategy's mode, check the rest."""
        from distlab.optim import DistMuonAdamW

        if trainer.state.fn != TrainerFn.FITTING:
            return
        module = self.lightning_module
        own = {id(p) for p in module.parameters()}
        updated = {id(p) for opt in self.optimizers for g in opt.param_groups for p in g["params"]}
        left_out = [n for n, p in module.named_parameters() if p.requires_grad and id(p) not in updated]
        if left_out and self.optimizers:
            info_rank0(
                f"distlab: note: {len(left_out)} trainable parameter(s) of {type(module).__name__} are in no "
                f"optimizer and will not train: {left_out[:4]}{' ...' if len(left_out) > 4 else ''}; add them to a "
                "param group (muon_param_groups covers every parameter), or set requires_grad=False"
            )
        for opt in self.optimizers:
            foreign = [tuple(p.shape) for g in opt.param_groups for p in g["params"] if id(p) not in own]
            if foreign:
                raise ConfigError(
                    f"{type(opt).__name__} updates {len(foreign)} tensor(s) that are not parameters of "
                    f"{type(module).__name__} (shapes {foreign[:4]}): the model's loss gives them no gradient and no "
                    "rank syncs them, so they would not train; build the optimizer in configure_optimizers from "
                    "self.parameters() or a submodule's"
                )
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
