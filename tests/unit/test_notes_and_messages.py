"""Notes said from the parsed config (nothing run), and the way values are shown in one-line messages."""

from __future__ import annotations

import logging

import pytest
import torch

from distlab.errors import ConfigError, shown_briefly
from distlab.preflight import notes


def test_a_limit_on_a_loop_the_subcommand_does_not_run_is_noted():
    said = notes("validate", {"trainer": {"limit_test_batches": 1}})
    assert any("trainer.limit_test_batches=1 has no effect on validate" in n for n in said), said
    assert not notes("validate", {"trainer": {"limit_val_batches": 1}})  # the loop it runs: nothing to say


def test_a_distributed_strategy_on_auto_devices_without_a_launcher_says_it_runs_one_process():
    trainer = {"devices": "auto", "strategy": "ddp_optimizer_sync", "accelerator": "cpu"}
    said = notes("fit", {"trainer": trainer}, env={})
    assert any("this fit runs ONE process" in n for n in said), said
    launched = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    assert not any("ONE process" in n for n in notes("fit", {"trainer": trainer}, env=launched))


def test_a_message_shows_a_tensor_by_its_shape_and_a_long_value_by_its_ends():
    assert shown_briefly(torch.zeros(32, 20)) == "a Tensor of shape (32, 20)"
    long = shown_briefly("x" * 1000)
    assert len(long) <= 120 and long.endswith("(1002 characters)"), long


def test_a_parameter_in_two_groups_is_named_with_both_groups():
    from distlab.optim import DistMuonAdamW, muon_param_groups

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    groups = muon_param_groups(model)
    groups.append({"params": [model[0].weight], "kind": "adamw", "lr": 1e-3})
    with pytest.raises(
        ConfigError, match=r"a parameter of shape \(16, 8\) is in param group 0 \(muon\) and in group"
    ):
        DistMuonAdamW(groups)


def test_early_stopping_on_a_loss_with_mode_max_is_noted(caplog):
    from distlab.callbacks import SyncEarlyStopping

    with caplog.at_level(logging.INFO):
        SyncEarlyStopping(monitor="val_loss", mode="max")
    assert "a loss improves as it falls: set mode='min'" in caplog.text
