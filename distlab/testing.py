"""Run a function on N real gloo ranks (CPU processes) and collect each rank's return value.

Used by the test suite and the benchmark scripts; fn must be importable (module level).

Example::

    def _job(rank, world_size, scale):        # module-level, importable from the tests package
        t = torch.ones(1) * rank * scale
        dist.all_reduce(t)
        return {"sum": t}

    results = run_distributed(_job, 3, 2.0)   # [{"sum": tensor([6.])}, ...] indexed by rank
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distlab.distributed import barrier

# The GPT shrunk for tests and the benchmarks' tiny modes (seconds on a CPU; configs/debug.yaml is the same):
# the same code paths as the demo model, nothing worth measuring.
TINY_GPT = dict(depth=1, aspect_ratio=32, head_dim=16, sequence_len=32)


# Ranks fork from one server process that has imported these once (a spawned rank would import them
# again: ~4 s of a 2-core machine per job). The server holds no threads and no process group, so a fork
# of it is as clean as a spawn; what differs is the environment, which the server fixed when it started:
# each rank takes the caller's environment at call time instead (``env`` below).
_PRELOAD = ("torch", "torch.distributed", "lightning.pytorch")


def _worker(
    rank: int,
    fn: Callable[..., Any],
    world_size: int,
    out_dir: str,
    args: tuple,
    env: dict[str, str],
    backend: str = "gloo",
) -> None:
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(1)
    if backend == "nccl":  # one GPU per rank
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend,
        init_method=f"file://{os.path.join(out_dir, 'rendezvous')}",  # no port to race for
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        # Every rank is done: with the GIL free while we wait, gloo's worker threads finish dropping the
        # temporaries of fn's last collectives before the interpreter finalizes (see distlab.distributed.gloo).
        barrier()  # (distlab's barrier also installs the gloo exit drain)
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_distributed(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120, backend: str = "gloo"
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks (gloo CPU processes; ``backend="nccl"``: one GPU
    per rank, ``cuda:rank``); return the results by rank (tensors on the CPU).

    A failing rank fails the caller with that rank's traceback; a hang is killed after ``timeout`` seconds.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    mp.get_context("forkserver").set_forkserver_preload(list(_PRELOAD))  # takes effect when the server starts
    with tempfile.TemporaryDirectory(prefix="distlab_test_", ignore_cleanup_errors=True) as out_dir:
        ctx = mp.start_processes(
            _worker,
            args=(fn, world_size, out_dir, args, env, backend),
            nprocs=world_size,
            join=False,
            start_method="forkserver",
        )
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"distributed job {fn.__name__} (world {world_size}) hung for > {timeout}s"
                    )
        except Exception as e:  # ProcessRaisedException / ProcessExitedException / TimeoutError
            errors = [
                f"--- rank {r} ---\n" + open(os.path.join(out_dir, f"rank{r}.err")).read()
                for r in range(world_size)
                if os.path.exists(os.path.join(out_dir, f"rank{r}.err"))
            ]
            raise RuntimeError(f"{type(e).__name__}: {e}\n" + "\n".join(errors)) from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
        return [
            torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False, map_location="cpu")
            for r in range(world_size)
        ]
