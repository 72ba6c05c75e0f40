"""Tests use the package's multi-rank harness (also used by the benchmark scripts), and ports for the launches they
start themselves (torchrun, SLURM's srun stand-in, Lightning's own launcher)."""

import random
import socket

from distlab.testing import run_distributed

__all__ = ["free_port", "run_distributed"]


def free_port() -> int:
    """A TCP port nothing listens on now, below the kernel's ephemeral range (Linux: 32768 and up), where no outgoing
    connection takes its source port. Found free and bound later by another process: a short gap, which distlab's
    own spawn launcher closes by hosting the store itself (tests/distributed/test_strategy_fit.py)."""
    for _ in range(100):
        port = random.randrange(20000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free TCP port in 20000-32767")
