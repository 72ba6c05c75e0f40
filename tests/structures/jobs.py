"""The fits of the structure suite, run on real gloo ranks: every drawn combo under the oracle and each strategy.

:func:`structure_job` runs on every rank of one process group (``distlab.testing.run_distributed``) and fits each
combo under each named strategy in turn: Lightning sees processes launched from outside (``LOCAL_RANK`` set, as
under torchrun) and reuses the group, so a fit costs its Trainer, not a process start. What each fit recorded (or
the error it ended with) is returned per rank; ``tests/structures/test_structures.py`` compares.
"""

from __future__ import annotations

import logging
import os
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from tests.structures.zoo import (
    BATCH,
    EVERY,
    N_TRAIN,
    STEPS,
    Combo,
    Tokens,
    ZooModule,
    collate_for,
    eval_loaders,
    full_state,
    oracle_module,
    ties,
    train_loader,
)

ORACLE = "ddp"
COMBO_IDS: dict[Combo, int] = {}
MICRO_SHARDS = 2  # reproducible mode: two micro-batches of BATCH per step at every world size


def layout(cell: str, world: int) -> tuple[str, int, int]:
    """``"fsdp2"`` -> ("fsdp2", 1 node, ``world`` processes); ``"hsdp3@3x2"`` -> ("hsdp3", 3 nodes, 2 processes
    each): a launch over several "nodes", where a rank's local rank and node differ from its global rank."""
    name, _, shape = cell.partition("@")
    nodes, per_node = (int(x) for x in shape.split("x")) if shape else (1, world)
    assert nodes * per_node == world, (cell, world)
    return name, nodes, per_node


def make_strategy(name: str, combo: Combo):
    """``hsdpR``: FSDP2 with R replicas (a (R, W/R) mesh); the other names are the strategies'."""
    from lightning.pytorch.strategies import DDPStrategy

    from distlab.strategies import FSDP2Strategy, OptimizerSyncDDPStrategy

    common = dict(process_group_backend="gloo", timeout=timedelta(seconds=60))
    if name == "ddp":
        return DDPStrategy(find_unused_parameters=combo.needs_unused, **common)
    if name == "ddp_optimizer_sync":
        return OptimizerSyncDDPStrategy(**common)
    if name == "reproducible":
        return OptimizerSyncDDPStrategy(reproducible=True, micro_shards=MICRO_SHARDS, **common)
    if name == "fsdp2":
        return FSDP2Strategy(**common)
    if name.startswith("hsdp"):
        return FSDP2Strategy(replicate_degree=int(name.removeprefix("hsdp")), **common)
    raise ValueError(name)


def training_data(combo: Combo, strategy: str) -> DataLoader:
    if strategy == "reproducible":  # the same micro-batches at every world size
        from distlab.data import MicroShards

        shards = MicroShards(
            Tokens(N_TRAIN, seed=1), batch_size=BATCH, seed=0, collate_fn=collate_for(combo.batch)
        )
        return DataLoader(shards, batch_size=None)
    return train_loader(combo)


class DdpEvaluationBuffers(L.Callback):
    """The oracle (Lightning's ddp) validates nothing (its loop would pad the set); what its evaluation forward would
    do to the buffers, this does at the steps RankZeroValidation validates: DDP broadcasts rank 0's buffers before
    the forward, and eval mode leaves BatchNorm's statistics alone. Plain torch.distributed."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        import torch.distributed as dist

        if trainer.global_step % EVERY == 0 or trainer.global_step == STEPS:
            for b in pl_module.buffers():
                dist.broadcast(b.data, src=0)


class Record(L.Callback):
    """On every rank: training batches run, the final weights and buffers (every name, FSDP2 shards gathered), the
    ties, the logged values, the step."""

    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches += 1

    def on_fit_end(self, trainer, pl_module) -> None:
        self.state = full_state(pl_module)
        self.ties = ties(pl_module)
        self.metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        self.step = trainer.global_step
        mesh = getattr(trainer.strategy, "dp_mesh", None)  # FSDP2's: 1-D, or HSDP's (replicate, shard)
        self.mesh = (
            None
            if mesh is None
            else (tuple(mesh.shape), tuple(mesh.mesh_dim_names or ()), mesh.mesh.tolist())
        )


def _launch_env(rank: int, world: int, per_node: int) -> None:
    """Lightning's LightningEnvironment: LOCAL_RANK set -> processes were launched outside (torchrun-like), here as
    ``world / per_node`` nodes of ``per_node`` processes."""
    os.environ.update(
        LOCAL_RANK=str(rank % per_node),
        NODE_RANK=str(rank // per_node),
        LOCAL_WORLD_SIZE=str(per_node),
        WORLD_SIZE=str(world),
        RANK=str(rank),
    )
    os.environ["PL_GLOBAL_SEED"] = "0"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")  # unused: the process group exists


def fit_once(combo: Combo, cell: str, root: Path, world: int) -> dict[str, Any]:
    """One fit and one test of ``combo`` under the ``cell``'s strategy and launch layout (:func:`layout`) on this
    rank (the oracle only fits)."""
    import torch.distributed as dist

    from distlab.callbacks import RankZeroValidation

    strategy, nodes, per_node = layout(cell, world)
    _launch_env(dist.get_rank(), world, per_node)
    record = Record()
    oracle = strategy == ORACLE
    out: dict[str, Any] = {"batches": 0}
    try:  # a refusal can come from the Trainer's construction or from fit
        trainer = L.Trainer(
            accelerator="cpu",
            devices=per_node,
            num_nodes=nodes,
            strategy=make_strategy(strategy, combo),
            max_steps=STEPS,
            max_epochs=100,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            num_sanity_val_steps=0,
            limit_val_batches=0 if oracle else None,
            default_root_dir=root,
            callbacks=[record, DdpEvaluationBuffers()]
            if oracle
            else [record, RankZeroValidation(every_n_steps=EVERY)],
        )
        module = oracle_module(combo) if oracle else ZooModule(combo)
        val = None if oracle else eval_loaders(combo, "validation")
        trainer.fit(module, train_dataloaders=training_data(combo, strategy), val_dataloaders=val)
        if not oracle:
            trainer.test(module, dataloaders=eval_loaders(combo, "test"), verbose=False)
            out["test_metrics"] = {
                k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test_")
            }
    except Exception as e:  # noqa: BLE001 - a refusal (or a failure) is the cell's result
        out.update(
            error=f"{type(e).__name__}: {e}", error_type=type(e).__name__, traceback=traceback.format_exc()
        )
    out["batches"] = record.batches
    for key in ("state", "ties", "metrics", "step", "mesh"):
        if hasattr(record, key):
            out[key] = getattr(record, key)
    return out


def structure_job(rank: int, world: int, combos: list[Combo], strategies: list[str], root: str) -> dict:
    """On every rank: each combo under each strategy -> {(combo, strategy): result}."""
    import distlab  # noqa: F401 - registers the strategies

    torch.set_num_threads(1)
    for name in ("lightning.pytorch", "lightning.fabric", "distlab"):
        logging.getLogger(name).setLevel(logging.WARNING)
    results = {}
    for combo in combos:
        for strategy in strategies:
            where = Path(root) / f"combo{COMBO_IDS.setdefault(combo, len(COMBO_IDS))}" / strategy
            results[(combo, strategy)] = fit_once(combo, strategy, where, world)
    return results


def one_process_fit(combo: Combo, root: Path) -> dict[str, Any]:
    """The combo in one process on the concatenated batch (the ranks' global batch), torch's optimizers."""
    record = Record()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        max_epochs=100,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        default_root_dir=root,
        callbacks=[record],
    )
    trainer.fit(oracle_module(combo), train_dataloaders=train_loader(combo, one_process_of=2))
    return {"state": record.state, "ties": record.ties, "step": record.step, "metrics": record.metrics}
