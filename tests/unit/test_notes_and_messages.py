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


def test_settings_rank_zero_validation_replaces_are_noted():
    rzv = {"class_path": "distlab.callbacks.RankZeroValidation", "init_args": {"every_n_steps": 2}}
    said = notes("fit", {"trainer": {"callbacks": [rzv], "val_check_interval": 3, "num_sanity_val_steps": 2}})
    assert any("trainer.val_check_interval=3 has no effect with RankZeroValidation" in n for n in said), said
    assert any("trainer.num_sanity_val_steps=2 has no effect" in n for n in said), said
    assert not notes(
        "fit", {"trainer": {"callbacks": [rzv], "num_sanity_val_steps": 0}}
    )  # the recipes' setting


def test_version_prints_what_a_bug_report_needs(capsys):
    from distlab.cli import main

    main(["--version"])
    out = capsys.readouterr().out
    assert out.startswith("distlab ") and "torch " in out and "lightning " in out, out


def test_the_prepare_script_exits_with_the_commands_status(tmp_path):
    import subprocess
    import sys

    from tests.helpers.cli import REPO

    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "prepare_data.py"), "--paths", str(tmp_path / "nothing"), "--out",
         str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 2 and "distlab: error:" in done.stderr, done.stderr[-1000:]


def test_a_deleted_working_folder_is_named_not_torch(tmp_path):
    import subprocess
    import sys

    from tests.helpers.cli import REPO

    gone = tmp_path / "gone"
    gone.mkdir()
    script = f"import os, runpy, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); sys.argv = ['distlab', '--version']; runpy.run_module('distlab', run_name='__main__')"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 2 and "the current folder no longer exists" in done.stderr, done.stderr[-1000:]
