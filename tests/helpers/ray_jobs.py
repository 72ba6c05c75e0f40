"""The training function tests/slow/test_ray_train.py gives Ray Train's workers, and what its reference on distlab's
own spawned ranks trains: the debug recipe's tiny GPT on the embedded corpus (a stream each rank reads its share of),
or the digits CNN on a map-style dataset (Lightning's DistributedSampler deals it by the strategy's ranks); the same
seed, steps and checkpoints."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

STEPS = 6
RUNS = {  # tag -> (distlab strategy name, its arguments)
    "ddp_optimizer_sync": ("ddp_optimizer_sync", {}),
    "fsdp2": ("fsdp2", {}),
    "hsdp": ("fsdp2", {"replicate_degree": 2}),  # 2 replicas of 1 shard: HSDP's 2-D mesh
    "digits": ("ddp_optimizer_sync", {}),
}


def module_and_data(tag: str):
    from distlab.data import DigitsDataModule, TextDataModule
    from distlab.modules import GPTLightningModule, ImageClassifier
    from distlab.testing import TINY_GPT

    L.seed_everything(0, verbose=False)
    if tag == "digits":
        return ImageClassifier(width=8), DigitsDataModule(batch_size=32)
    return GPTLightningModule(**TINY_GPT), TextDataModule(seq_len=32, batch_size=4, max_val_windows=8)


def trainer_arguments(ckpt_dir: Path) -> dict:
    checkpoints = ModelCheckpoint(dirpath=ckpt_dir, save_last=True, every_n_train_steps=2, save_top_k=-1)
    return dict(
        accelerator="cpu",
        max_steps=STEPS,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoints],
    )


def full_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every weight whole (FSDP2's shards gathered: a collective, so every rank calls it)."""
    out = {}
    for name, value in module.state_dict().items():
        full = getattr(value, "full_tensor", None)
        out[name] = (full() if callable(full) else value).detach().clone()
    return out


class KillOnce(L.Callback):
    """Rank ``rank`` SIGKILLs its own process at ``step`` (once: a marker file says it happened)."""

    def __init__(self, rank: int, step: int, marker: Path) -> None:
        self.rank, self.step, self.marker = rank, step, marker

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step and not self.marker.exists():
            self.marker.write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)


class RecordStart(L.Callback):
    """Appends the step each attempt's fit starts from to ``path`` (rank 0)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_start(self, trainer, *args) -> None:
        if trainer.global_rank == 0:
            with open(self.path, "a") as f:
                f.write(f"{trainer.global_step}\n")


def train(config: dict) -> None:
    """One Ray worker: each run in ``config["runs"]`` with distlab's Ray strategy; rank 0 saves its whole weights."""
    import ray.train
    from ray.train.lightning import RayLightningEnvironment, prepare_trainer

    from distlab.ray_train import RayFSDP2Strategy, RayOptimizerSyncDDPStrategy

    torch.set_num_threads(1)
    out = Path(config["out"])
    rank = ray.train.get_context().get_world_rank()
    for tag in config["runs"]:
        name, kwargs = RUNS[tag]
        strategy = (RayOptimizerSyncDDPStrategy if name == "ddp_optimizer_sync" else RayFSDP2Strategy)(
            **kwargs
        )
        arguments = trainer_arguments(out / tag / "checkpoints")
        arguments["callbacks"].append(RecordStart(out / f"{tag}-starts.txt"))
        if config.get("kill", (None,))[0] == tag:
            arguments["callbacks"].append(KillOnce(1, config["kill"][1], out / tag / "killed"))
        trainer = L.Trainer(
            strategy=strategy, plugins=[RayLightningEnvironment()], devices="auto", **arguments
        )
        module, data = module_and_data(tag)
        prepare_trainer(trainer).fit(module, data, ckpt_path="last")
        state = full_state(module)
        if rank == 0:
            torch.save(
                {"state": state, "step": trainer.global_step, "world": trainer.world_size}, out / f"{tag}.pt"
            )
