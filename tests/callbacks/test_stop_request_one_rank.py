"""CheckpointOnStopRequest on 2 real gloo ranks when only ONE rank can see the stop file.

The module docstring of distlab.callbacks.preemption promises that the ranks agree (one all_reduce), "so they stop at
the same step even if the file shows up on one node first". On one host every rank sees the same file, so a callback
that decided per rank would pass every other test; here each rank looks for its own file (as if each node had its
own file system) and only rank 1's is ever created: both ranks must still save and stop at that step, and last.ckpt
must hold it.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from distlab.callbacks import CheckpointOnStopRequest
from tests.helpers.callbacks import RecordEnd, load_ends

WORLD = 2
ASKING_RANK = 1  # the only rank whose stop file appears
ASK_AT = 2  # the optimizer step after which it appears
MAX_STEPS = 6  # where the fit would end if no stop were requested


class TinyRegression(L.LightningModule):
    """A LightningModule written the way a user writes one."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(64, 4, generator=g)
        return DataLoader(TensorDataset(x, x.sum(-1, keepdim=True)), batch_size=4)


class OwnStopFilePerRank(CheckpointOnStopRequest):
    """The callback under test, looking for ``{base}.rank{r}`` on rank r: what one node sees, the others do not.
    Each rank also writes the step at which it saves (``stopped{r}.pt``), so a disagreement reads as steps by rank."""

    def __init__(self, base: str, record_dir: str) -> None:
        super().__init__(base)
        self.base, self.record_dir = base, record_dir

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.stop_file = f"{self.base}.rank{trainer.global_rank}"

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Every rank runs this inside trainer.save_checkpoint, before the save's closing barrier: a rank that
        # decided to stop is on record even if the other rank never joins it. (Here the stop is the only save.)
        Path(self.record_dir).mkdir(parents=True, exist_ok=True)
        torch.save({"step": trainer.global_step}, Path(self.record_dir) / f"stopped{trainer.global_rank}.pt")


class CreateFileOnRankAtStep(L.Callback):
    """On rank ``rank`` only, create ``path`` right after optimizer step ``step`` (before the stop callback looks)."""

    def __init__(self, path: str, rank: int, step: int) -> None:
        self.path, self.rank, self.step = path, rank, step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            Path(self.path).touch()


@pytest.mark.timeout(120)
def test_a_stop_file_seen_by_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    base = str(tmp_path / "STOP")
    records = tmp_path / "records"
    stop = OwnStopFilePerRank(base, str(records))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=WORLD,
        # a short process-group timeout: ranks that disagree fail in seconds, not minutes
        strategy=DDPStrategy(start_method="spawn", timeout=timedelta(seconds=20)),
        max_steps=MAX_STEPS,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,  # the only save is the stop callback's: default_root_dir/checkpoints/last.ckpt
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        # the file is created before the stop callback runs at the same step (callbacks run in list order)
        callbacks=[
            CreateFileOnRankAtStep(f"{base}.rank{ASKING_RANK}", ASKING_RANK, ASK_AT),
            stop,
            RecordEnd(str(records)),
        ],
    )
    error: BaseException | None = None
    try:
        trainer.fit(TinyRegression())
    except Exception as e:  # noqa: BLE001 - ranks that disagree end in a collective error: reported below
        error = e

    assert not Path(f"{base}.rank0").exists()  # rank 0 never saw a stop file of its own
    stopped = {
        r: torch.load(records / f"stopped{r}.pt", weights_only=False)["step"]
        for r in range(WORLD)
        if (records / f"stopped{r}.pt").exists()
    }
    assert stopped == {r: ASK_AT for r in range(WORLD)}, (
        f"only rank {ASKING_RANK} saw the stop file (after step {ASK_AT}); every rank must save and stop at that "
        f"step, but the ranks saved at {stopped} (rank: step; a rank missing never stopped); fit error: "
        f"{type(error).__name__ if error else None}: {str(error).strip().splitlines()[-1] if error else ''}"
    )
    assert error is None, f"{type(error).__name__}: {error}"
    ends = load_ends(records, WORLD)
    assert [e["global_step"] for e in ends] == [ASK_AT] * WORLD, ends  # stopped there, short of max_steps
    assert all(e["error"] is None for e in ends), ends
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert last.is_file(), sorted(str(p) for p in tmp_path.rglob("*.ckpt"))
    assert torch.load(last, weights_only=False, map_location="cpu")["global_step"] == ASK_AT
