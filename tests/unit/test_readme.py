"""The README's example of a user's own LightningModule runs as written (2 CPU ranks, spawn)."""

from __future__ import annotations

import ast
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers.cli import REPO, run_subprocess

MARKER = "<!-- example:user-module"


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    after = text[text.index(MARKER) :]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def run_example(folder, code: str, launcher: tuple[str, ...] = (sys.executable,)) -> tuple[dict, str]:
    folder.mkdir()
    (folder / "example.py").write_text(code)
    out = run_subprocess([*launcher, "example.py"], timeout=180, cwd=folder)
    assert out.returncode == 0, out.stderr[-3000:]
    return ast.literal_eval(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.timeout(400)
def test_readme_user_module_example_runs_as_written(tmp_path):
    # As written (spawned ranks); under Lightning's subprocess launcher (what torchrun and SLURM use; each rank runs
    # the script and builds its own model); and as the README says to launch it under torchrun (`torchrun
    # --standalone --nproc_per_node=2 my_classifier.py`): three independent runs, side by side.
    code = readme_example().replace('strategy="ddp_optimizer_sync_spawn"', 'strategy="ddp_optimizer_sync"')
    assert code != readme_example()
    torchrun = (str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2")
    with ThreadPoolExecutor(3) as pool:
        spawned = pool.submit(run_example, tmp_path / "spawn", readme_example())
        popen = pool.submit(run_example, tmp_path / "popen", code)
        launched = pool.submit(run_example, tmp_path / "torchrun", code, torchrun)
        (metrics, stderr), (popen, _), (launched, _) = spawned.result(), popen.result(), launched.result()
    assert set(metrics) >= {"val_loss", "val_acc", "val_time_s"}
    assert metrics["val_acc"] > 0.5  # 4 classes, learnable labels: it trained
    assert "muon_param_groups(Sequential): Muon 1 tensors" in stderr
    for k in ("val_loss", "val_acc"):  # the same numbers under each launcher
        assert popen[k] == pytest.approx(metrics[k], rel=1e-5), k
        assert launched[k] == pytest.approx(metrics[k], rel=1e-5), k
