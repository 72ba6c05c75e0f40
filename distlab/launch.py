"""Make the Trainer's process layout agree with the launcher that started us: its world size fills in ``devices``
/ ``num_nodes`` / ``strategy`` (Lightning's ``auto`` under torchrun on CPU is one single-device process each: N
silently independent models), else one line says what to set. Never fewer processes than the launcher started.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment

from distlab.compat import process_group_backend
from distlab.errors import ConfigError


def restart_count() -> int:
    """How many times the launcher restarted this job (torchrun's or SLURM's count; 0 for the first attempt)."""
    # each count only under its own launcher: a count left in a shell's environment is no restart of this job
    counts = [os.environ.get("TORCHELASTIC_RESTART_COUNT", "") if "TORCHELASTIC_RUN_ID" in os.environ else ""]
    counts.append(os.environ.get("SLURM_RESTART_COUNT", "") if "SLURM_JOB_ID" in os.environ else "")
    return max((int(c) for c in counts if c.strip().isdigit()), default=0)


def _count(env: Mapping[str, str], key: str, default: int = 0) -> int:
    """A process count from the environment (SLURM writes "2(x3)" for 2 tasks on each of 3 nodes), else ``default``;
    a value that is no count is a one-line ConfigError (never a guess)."""
    text = env.get(key, "").split("(")[0].strip()
    if text and not text.isdigit():
        raise ConfigError(
            f"{key}={env[key]!r} is not a process count (an integer >= 1); unset {key} (a launcher sets it), or set it "
            "to a number"
        )
    return int(text) if text else default


def launcher_world(env: Mapping[str, str] | None = None) -> tuple[str, int, int] | None:
    """(launcher name, world size, processes per node) if an external launcher started >1 process."""
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" in env and "WORLD_SIZE" in env:
        world = _count(env, "WORLD_SIZE")
        local = _count(env, "LOCAL_WORLD_SIZE", world)
        return ("torchrun", world, local) if world > 1 else None
    if "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        world = _count(env, "SLURM_NTASKS")
        per_node = _count(env, "SLURM_NTASKS_PER_NODE", world)
        return ("srun", world, per_node) if world > 1 else None
    return None


def several_processes_launched() -> str | None:
    """Which launcher started this process as one of several ("torchrun started 2 processes (WORLD_SIZE=2)"), or None.
    Only a launcher's own mark counts (TORCHELASTIC_RUN_ID, an srun step's SLURM_STEP_ID, MPI's world size)."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env and (n := _count(env, "WORLD_SIZE")) > 1:
        return f"torchrun started {n} processes (WORLD_SIZE={n})"
    if "SLURM_STEP_ID" in env or "SLURM_STEPID" in env:
        key = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
        if (n := _count(env, key)) > 1:
            return f"srun started {n} tasks ({key}={n})"
    for key in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if (n := _count(env, key)) > 1:
            return f"an MPI launcher started {n} processes ({key}={n})"
    return None


def _as_count(devices: Any) -> int | None:
    if isinstance(devices, int):
        return devices
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        return int(devices)
    return None  # "auto" or -1: decided by us below


def reconcile_trainer_config(config: dict[str, Any], env: Mapping[str, str] | None = None) -> list[str]:
    """Adjust trainer kwargs in place to the launcher's world size; return notes of what changed."""
    found = launcher_world(env)
    if found is None:
        return []
    launcher, world, per_node = found
    notes = []
    devices = _as_count(config.get("devices", "auto"))
    if devices is None or devices == -1:
        config["devices"] = per_node
        notes.append(f"devices={per_node}")
        devices = per_node
    nodes = world // per_node
    num_nodes = int(config.get("num_nodes", 1) or 1)
    if num_nodes == 1 and nodes > 1:
        config["num_nodes"] = num_nodes = nodes
        notes.append(f"num_nodes={nodes}")
    if devices != per_node or num_nodes != nodes:
        said, advice = f"{launcher} started {world} processes ({per_node} per node)", ""
        if launcher == "srun":
            said = f"SLURM says the job has {world} tasks ({per_node} per node; SLURM_NTASKS, SLURM_NTASKS_PER_NODE)"
            advice = "; under SLURM, start one process per task with srun (as scripts/slurm.sbatch in distlab's repository does)"
        raise ConfigError(
            f"{said} but the trainer asks for devices={devices} x num_nodes={num_nodes}; set trainer.devices={per_node} "
            f"and trainer.num_nodes={nodes} (or leave devices: auto){advice}"
        )
    strategy = config.get("strategy", "auto")
    if strategy in ("auto", None, "single_device"):
        config["strategy"] = "ddp_optimizer_sync"
        notes.append("strategy=ddp_optimizer_sync")
    elif isinstance(strategy, str) and "spawn" in strategy:
        raise ConfigError(
            f"trainer.strategy={strategy!r} spawns its own processes but {launcher} already started {world}; "
            "use strategy: ddp_optimizer_sync (or ddp) under a launcher"
        )
    return notes


def _backend_built(name: str) -> bool:
    """Whether this torch build has the process-group backend ``name`` (torch.distributed's own probes)."""
    probe = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available, "mpi": dist.is_mpi_available,
             "ucc": getattr(dist, "is_ucc_available", lambda: False), "xccl": getattr(dist, "is_xccl_available", lambda: False)}  # fmt: skip
    return probe.get(name, lambda: True)()


def check_backend(strategy, world_size: int) -> None:
    """The strategy's process-group backend must fit this machine and torch build (one-line ConfigError): called by
    the CLI and by distlab's strategies when a Trainer takes them, before any process or group starts."""
    backend = process_group_backend(strategy)
    if backend == "nccl" and not torch.cuda.is_available():
        raise ConfigError(
            "process_group_backend='nccl' needs CUDA GPUs, but torch.cuda.is_available() is False here; leave "
            "process_group_backend unset (gloo on CPU) or run on a GPU machine"
        )
    if backend and world_size > 1 and not _backend_built(backend.split(":")[-1]):
        built = [b for b in ("gloo", "nccl", "mpi", "ucc", "xccl") if _backend_built(b)]
        raise ConfigError(
            f"process_group_backend={backend!r} is not built into this torch ({torch.__version__}); set "
            f"process_group_backend to one it has ({', '.join(built)}), or leave it unset"
        )


def check_process_group_plan(trainer, env: Mapping[str, str] | None = None) -> None:
    """Before any process starts: the backend must fit the machine, and a fixed MASTER_PORT must be free."""
    env = os.environ if env is None else env
    check_backend(trainer.strategy, trainer.world_size)
    port = env.get("MASTER_PORT")
    # only the process that will host the rendezvous store (not a rank Lightning's launcher started: LOCAL_RANK)
    if (
        port
        and trainer.world_size > 1
        and launcher_world(env) is None
        and trainer.node_rank == 0
        and "LOCAL_RANK" not in env
    ):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", int(port)))
            except OSError as e:
                raise ConfigError(
                    f"MASTER_PORT={port} is already in use on this machine ({e.strerror}); unset MASTER_PORT "
                    "(a free port is picked) or set a free one"
                ) from None


def started_by_cluster(strategy: Any) -> bool:
    """Whether the user gave the Trainer a cluster environment that starts the processes itself (Lightning's
    ``KubeflowEnvironment`` for a PyTorchJob of one process per pod, or their own): its variables are a launch."""
    cluster = getattr(strategy, "cluster_environment", None)
    return (
        cluster is not None
        and type(cluster) is not LightningEnvironment  # Lightning's default; a subclass (Ray's) is a choice
        and cluster.creates_processes_externally
    )


def check_launch_env(nodes: int, devices: int, *, cluster: bool = False) -> None:
    """The launch environment must agree with the trainer's ``nodes`` x ``devices`` processes (one-line
    ConfigError): never a wait with no end, never one process where the environment asked for several.
    ``cluster``: a cluster environment the user chose started this process (:func:`started_by_cluster`)."""
    env = os.environ
    launched = cluster or launcher_world(env) is not None
    world = env.get("WORLD_SIZE", "").strip()
    if world and "LOCAL_RANK" not in env and not launched and world.isdigit() and int(world) > 1:
        raise ConfigError(
            f"WORLD_SIZE={world} is set, but no launcher (torchrun, srun) started this process: it would train "
            f"alone; launch it with torchrun --nproc_per_node={world} -m distlab ... (in a Kubeflow pod: torchrun "
            "-m distlab ..., which reads the PET_* variables), or unset WORLD_SIZE"
        )
    for key, other in (("LOCAL_RANK", "RANK"), ("RANK", "LOCAL_RANK")):  # (both: a launch)
        if key in env and other not in env and not world and not launched and devices * nodes > 1:
            raise ConfigError(
                f"{key}={env[key]} is set, but no {other}, no WORLD_SIZE and no launcher (torchrun, srun): Lightning "
                f"would take this process for one of several started elsewhere and wait for the others; unset {key}"
            )
    if world.isdigit() and "LOCAL_RANK" in env and not launched and int(world) != devices * nodes:
        raise ConfigError(
            f"WORLD_SIZE={world} (with LOCAL_RANK={env['LOCAL_RANK']}) says this process is one of {world}, but the "
            f"trainer runs devices={devices} x num_nodes={nodes}; set devices and num_nodes to match the launch, or "
            "unset WORLD_SIZE and LOCAL_RANK (left over from another job?)"
        )
    if "TORCHELASTIC_RUN_ID" in env and world.isdigit() and int(world) < nodes:
        raise ConfigError(
            f"torchrun started {world} process(es) in all, and the trainer asks for num_nodes={nodes}; launch torchrun "
            f"--nnodes={nodes} on each node, or set num_nodes to the nodes torchrun starts"
        )
    node_known = ("NODE_RANK" in env or "GROUP_RANK" in env) and "MASTER_ADDR" in env
    if nodes > 1 and not launched and not node_known:
        raise ConfigError(
            f"num_nodes={nodes} but nothing says which node this is and where rank 0 is, so the job would wait forever "
            f"for the others; launch with torchrun --nnodes={nodes} (or srun), or set NODE_RANK and MASTER_ADDR on each"
        )
    # a SLURM job's tasks (a job named bash/interactive launches by hand)
    slurm = (
        "SLURM_NTASKS" in env
        and "TORCHELASTIC_RUN_ID" not in env
        and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")
    )
    slurm_tasks = _count(env, "SLURM_NTASKS") if slurm else 0
    if slurm_tasks > 1 and "SLURM_STEP_ID" not in env and "SLURM_STEPID" not in env:  # its batch script
        raise ConfigError(
            f"this process runs in the batch script of a SLURM job of {slurm_tasks} tasks, but no srun started it (no "
            "SLURM_STEP_ID), so nothing starts the other ranks and rank 0 would wait forever; start one process per "
            "task with srun, or one torchrun per node as scripts/slurm.sbatch does"
        )
    if slurm and devices * nodes > slurm_tasks:
        raise ConfigError(
            f"this process runs in a SLURM job of {slurm_tasks} task(s), and Lightning takes the world size from "
            f"SLURM, so the trainer's devices={devices} x num_nodes={nodes} processes would each train alone; ask "
            f"SLURM for {devices} tasks per node and start them with srun, or set SLURM_JOB_NAME=interactive to "
            "let distlab start them on this node"
        )
