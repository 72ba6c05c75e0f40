"""A restarted torchrun attempt rendezvouses on a port of its own: rank 0 posts it under a key of this attempt
in the agent's store, and every other rank waits for that key (a key shared across attempts would hand a rank
of attempt 2 the port attempt 1 used). An in-process TCPStore stands in for torchrun's agent store."""

from __future__ import annotations

import socket
import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from distlab.distributed.restart import fresh_store_after_restart


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attempts", [2, 3])
def test_each_attempt_waits_for_its_own_port(attempts):
    agent_port = _free_port()
    agent = dist.TCPStore("127.0.0.1", agent_port, is_master=True, timeout=timedelta(seconds=30))  # noqa: F841

    def env(rank: int, attempt: int) -> dict[str, str]:
        return {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(agent_port),
            "RANK": str(rank),
            "TORCHELASTIC_RESTART_COUNT": str(attempt),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RUN_ID": "job",
        }

    assert fresh_store_after_restart(env(0, 0)) is None  # the first attempt keeps torchrun's own store
    for attempt in range(1, attempts + 1):
        got: dict[str, int] = {}
        rank1 = threading.Thread(
            target=lambda a=attempt, out=got: out.update(port=fresh_store_after_restart(env(1, a), 20))
        )
        rank1.start()
        rank1.join(timeout=0.5)
        assert rank1.is_alive(), (
            f"attempt {attempt}: rank 1 did not wait for rank 0 (it read an old attempt's port)"
        )
        port0 = fresh_store_after_restart(env(0, attempt), 20)
        rank1.join(timeout=20)
        assert got["port"] == port0, (
            f"attempt {attempt}: rank 1 got port {got['port']}, rank 0 posted {port0}"
        )
