"""Stress the exit of plain torch.distributed jobs on gloo: how many runs abort after their work is done?

    python scripts/stress_exit.py --runs 50                   # 50 x (2-rank + 3-rank) jobs of plain_distmuon.py
    python scripts/stress_exit.py --runs 20 --script nodistlab # the same trailing collective, no distlab at all

Each run is ``torchrun --standalone --nproc_per_node=N`` of the script; a run fails when torchrun exits
non-zero (an abort at exit shows as ``terminate called without an active exception`` + SIGABRT).
Prints one table line per script and world size, and a total.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NO_DISTLAB = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(7)])
for _ in range(5):
    for p in model.parameters():
        dist.all_reduce(p.data)
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(everyone, flat)
"""


def run_once(script: Path, world: int, extra: list[str]) -> tuple[bool, str]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={world}",
        str(script),
        *extra,
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    tail = (out.stdout + out.stderr).strip().splitlines()
    aborted = next(
        (ln for ln in tail if "terminate called" in ln or "SIGABRT" in ln), tail[-1] if tail else ""
    )
    return out.returncode == 0, aborted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="runs per world size")
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--script", choices=["plain_distmuon", "nodistlab"], default="plain_distmuon")
    args = parser.parse_args()
    if args.script == "nodistlab":
        script = Path(tempfile.mkdtemp()) / "nodistlab.py"
        script.write_text(NO_DISTLAB)
    else:
        script = HERE / "plain_distmuon.py"
    total_fail = total = 0
    t0 = time.time()
    for world in args.worlds:
        fails = []
        for i in range(args.runs):
            ok, why = run_once(
                script, world, ["--which", "combined"] if (args.script != "nodistlab" and i % 2) else []
            )
            if not ok:
                fails.append(why)
        total_fail += len(fails)
        total += args.runs
        print(
            f"{args.script} world={world}: {len(fails)} of {args.runs} runs failed"
            + (f" ({fails[0]})" if fails else "")
        )
    print(f"total: {total_fail} of {total} runs failed ({time.time() - t0:.0f}s)")
    sys.exit(1 if total_fail else 0)


if __name__ == "__main__":
    main()
