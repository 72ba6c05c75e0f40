"""`import distlab` is all a user needs: strategy names registered, the pieces importable as documented."""

from __future__ import annotations

import sys

from tests.helpers.cli import run_subprocess

SCRIPT = """
import distlab  # nothing else from distlab: the names must be registered by this import alone
import lightning as L
from distlab.callbacks import RankZeroValidation, SampleText, SyncEarlyStopping, LossCurvePlot
from distlab.optim import DistAdamW, DistMuon, DistMuonAdamW, muon_param_groups, split_params
from distlab.strategies import FSDP2Strategy, OptimizerSyncDDPStrategy
for name in ("ddp_optimizer_sync", "ddp_optimizer_sync_spawn", "fsdp2", "fsdp2_spawn"):
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=name, logger=False)
    print(name, type(trainer.strategy).__name__)
assert distlab.DistMuon is DistMuon and distlab.RankZeroValidation is RankZeroValidation
"""


def test_import_distlab_registers_every_strategy_name():
    out = run_subprocess([sys.executable, "-c", SCRIPT], timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "ddp_optimizer_sync",
        "OptimizerSyncDDPStrategy",
        "ddp_optimizer_sync_spawn",
        "OptimizerSyncDDPStrategy",
        "fsdp2",
        "FSDP2Strategy",
        "fsdp2_spawn",
        "FSDP2Strategy",
    ]
