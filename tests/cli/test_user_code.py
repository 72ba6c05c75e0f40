"""Errors in the user's own code are theirs to see: the line names their file and line (not "refused input"),
and the full traceback is saved; a script that would re-launch itself in every spawned rank is refused at once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_subprocess


@pytest.mark.timeout(180)
def test_a_bug_in_the_users_module_points_at_their_line(tmp_path):
    out = run_subprocess(
        [sys.executable, "-m", "distlab", "fit", "--model", "tests.helpers.broken_module.Broken"]
        + ["--trainer.max_steps=1", f"--trainer.default_root_dir={tmp_path / 'run'}"],
        timeout=150,
    )
    line = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert line.startswith("distlab: error: KeyError: 'width' (raised in your code, "), line
    assert "tests/helpers/broken_module.py:13 in __init__" in line, line
    saved = Path(line.rsplit("full traceback: ", 1)[1].rstrip(")"))
    assert 'self.width = table["width"]' in saved.read_text()


UNGUARDED = """
import lightning as L
from lightning.pytorch.demos.boring_classes import BoringModel
import distlab
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_optimizer_sync_spawn", max_steps=1, logger=False)
trainer.fit(BoringModel())
"""


@pytest.mark.timeout(120)
def test_spawning_from_an_unguarded_script_is_refused_before_any_rank_starts(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED)
    out = run_subprocess([sys.executable, str(script)], timeout=90, cwd=tmp_path)
    assert out.returncode != 0
    assert (
        'line 6 of this script starts spawned ranks outside an `if __name__ == "__main__":` block'
        in out.stderr
    )
    assert "MASTER_ADDR" not in out.stderr and out.stderr.count("Traceback") == 1  # no rank ever ran
