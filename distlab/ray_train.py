"""distlab's strategies on Ray Train's workers (``pip install 'distlab[ray]'``; the whole example: docs/guide.md,
section 4).

``ray.train.torch.TorchTrainer`` starts N worker processes, sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ... and
starts the process group itself; the Trainer in each worker is built with ``devices="auto"`` and Ray's
``RayLightningEnvironment``, so its ``devices x num_nodes`` (1 x 1 on a CPU) is not the job's size. These
strategies take the ranks, the device and the data shard from Ray instead, and Ray's ``prepare_trainer`` accepts
them (as it accepts its own ``RayDDPStrategy`` / ``RayFSDPStrategy``)::

    def train(config):  # each worker's function, given to TorchTrainer
        trainer = L.Trainer(strategy=RayOptimizerSyncDDPStrategy(), plugins=[RayLightningEnvironment()],
                            devices="auto", callbacks=[ModelCheckpoint(dirpath=config["ckpt"], save_last=True)])
        prepare_trainer(trainer).fit(MyModule(), MyData(), ckpt_path="last")  # a restarted group resumes

(``config["ckpt"]``: a folder every worker sees; on the first attempt Lightning finds no ``last`` and starts fresh.)
"""

from __future__ import annotations

from typing import Any

import ray.train
import ray.train.torch
from ray.train.lightning import RayDDPStrategy, RayFSDPStrategy

from distlab.strategies.fsdp2 import FSDP2Strategy
from distlab.strategies.optimizer_sync_ddp import OptimizerSyncDDPStrategy


class _RayWorkers:
    """What Ray decides for each worker: the job's ranks, the worker's device, and its shard of the data."""

    @property
    def root_device(self) -> Any:
        # Ray sets each worker's visible GPUs: its device is not the one at local_rank
        return ray.train.torch.get_device()

    def _launched_world(self) -> int:
        return ray.train.get_context().get_world_size()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        context = ray.train.get_context()
        return {"num_replicas": context.get_world_size(), "rank": context.get_world_rank()}


class RayOptimizerSyncDDPStrategy(_RayWorkers, OptimizerSyncDDPStrategy):
    """``ddp_optimizer_sync`` (DistMuonAdamW syncs the gradients) on Ray Train's workers; the same arguments."""


class RayFSDP2Strategy(_RayWorkers, FSDP2Strategy):
    """``fsdp2`` (and HSDP with ``replicate_degree`` > 1) on Ray Train's workers; the same arguments."""

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return FSDP2Strategy.distributed_sampler_kwargs.fget(self)  # the mesh's, sized from Ray's world


# Ray's prepare_trainer checks the class: these are Ray's kinds of strategy (Lightning's strategies are ABCs).
RayDDPStrategy.register(RayOptimizerSyncDDPStrategy)
RayFSDPStrategy.register(RayFSDP2Strategy)
