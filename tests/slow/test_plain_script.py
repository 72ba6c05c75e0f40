"""distlab's optimizers in a plain torch.distributed script under torchrun (no Lightning, no harness).

The script ends with its own gloo all_gather, the usual trigger of the exit abort (pytorch#117762); the
first distlab collective installs the exit drain, so the job exits 0. scripts/stress_exit.py repeats
this 100+ times (numbers in the README); here each variant runs once, and the drain is checked directly.
"""

from __future__ import annotations

import sys

import pytest

from tests.helpers.cli import REPO, run_subprocess


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("world,which", [(2, "split"), (3, "combined")])
def test_plain_script_trains_one_model_and_exits_cleanly(world, which):
    out = run_subprocess(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={world}",
            str(REPO / "scripts" / "plain_distmuon.py"),
            "--which",
            which,
        ],
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    modes = "reduce,reduce" if which == "split" else "reduce"
    assert f"ranks={world} identical=True modes={modes} exit_drain=True" in out.stdout, out.stdout
