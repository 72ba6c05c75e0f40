"""A restarted torchrun job must not rendezvous on the previous attempt's keys (pytorch/pytorch#167288).

``torchrun --max-restarts`` restarts every worker after a failure. The workers' process group meets in
the agent's TCPStore, which keeps the first attempt's keys: a new worker can read a dead worker's
address before its peer overwrites it, and gloo then fails with "connectFullMesh ... Connection refused"
or hangs (measured: 5 of 6 restarted two-rank jobs on this machine). :func:`fresh_store_after_restart`
gives each restarted attempt a store of its own: rank 0 picks a free port and posts it in the agent
store under a key only this attempt uses; every rank then rendezvous there (``env://``, rank 0 hosts).
The ``distlab`` CLI calls it before a restarted fit.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping
from datetime import timedelta

import torch.distributed as dist


def fresh_store_after_restart(
    env: MutableMapping[str, str] | None = None, timeout_s: float = 300
) -> int | None:
    """In a restarted torchrun attempt: point MASTER_PORT at a new store for this attempt; returns the port
    (None when this is not a restarted attempt using torchrun's agent store). Every rank must call it."""
    env = os.environ if env is None else env
    attempt = int(env.get("TORCHELASTIC_RESTART_COUNT") or 0)
    if attempt == 0 or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    agent = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=timeout_s)
    )
    key = f"distlab/{env.get('TORCHELASTIC_RUN_ID', '')}/attempt_{attempt}/master_port"
    if int(env["RANK"]) == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            agent.set(key, str(s.getsockname()[1]))
    port = int(agent.get(key))  # waits until rank 0 posted it
    env["MASTER_PORT"], env["TORCHELASTIC_USE_AGENT_STORE"] = str(port), "False"
    return port
