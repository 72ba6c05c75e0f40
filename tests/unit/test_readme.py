"""The README's example of a user's own LightningModule runs as written (2 CPU ranks, spawn)."""

from __future__ import annotations

import ast
import re
import sys

import pytest

from tests.helpers.cli import REPO, run_subprocess

MARKER = "<!-- example:user-module"


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    after = text[text.index(MARKER) :]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def run_example(tmp_path, code: str) -> tuple[dict, str]:
    script = tmp_path / "example.py"
    script.write_text(code)
    out = run_subprocess([sys.executable, str(script)], timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return ast.literal_eval(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.timeout(400)
def test_readme_user_module_example_runs_as_written(tmp_path):
    metrics, stderr = run_example(tmp_path, readme_example())
    assert set(metrics) >= {"val_loss", "val_acc", "val_time_s"}
    assert metrics["val_acc"] > 0.5  # 4 classes, learnable labels: it trained
    assert "muon_param_groups(Sequential): Muon 1 tensors" in stderr
    # The same script under Lightning's subprocess launcher (what torchrun and SLURM use; each rank runs the
    # script and builds its own model): the same numbers as under spawn.
    code = readme_example().replace('strategy="ddp_optimizer_sync_spawn"', 'strategy="ddp_optimizer_sync"')
    assert code != readme_example()
    popen, _ = run_example(tmp_path, code)
    for k in ("val_loss", "val_acc"):
        assert popen[k] == pytest.approx(metrics[k], rel=1e-5), k
    # And as the README says to launch it under torchrun (`torchrun --standalone --nproc_per_node=2 my_classifier.py`)
    from pathlib import Path

    torchrun = Path(sys.executable).parent / "torchrun"
    out = run_subprocess(
        [str(torchrun), "--standalone", "--nproc_per_node=2", "example.py"], timeout=180, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    launched = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    for k in ("val_loss", "val_acc"):
        assert launched[k] == pytest.approx(metrics[k], rel=1e-5), k
