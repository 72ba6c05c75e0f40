"""A --ckpt_path checkpoint's hyperparameters are data: applied (the weights need them), never silently."""

from __future__ import annotations

import pytest

from distlab.cli import main
from tests.helpers.cli import CONFIGS


@pytest.mark.timeout(240)
def test_values_from_the_checkpoint_that_differ_are_said(tmp_path, capsys, caplog):
    run = tmp_path / "run"
    debug = ["--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={run}"]
    main(["fit", *debug, "--trainer.max_steps=2", "--trainer.val_check_interval=2"])
    ckpt = next((run / "checkpoints").glob("*.ckpt"))
    capsys.readouterr()
    caplog.clear()
    # The config asks for depth 2 and another learning rate; the checkpoint was trained with depth 1.
    main(["validate", *debug, "--model.depth=2", "--model.matrix_lr=0.5", f"--ckpt_path={ckpt}"])
    said = capsys.readouterr().err + capsys.readouterr().out + caplog.text
    line = next(ln for ln in said.splitlines() if "from the checkpoint, differing from the config" in ln)
    assert "model.depth=1 (config: 2)" in line and "(config: 0.5)" in line
    assert "model.n_head" not in line  # equal values are not listed
