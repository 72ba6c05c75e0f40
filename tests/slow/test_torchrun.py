"""The real launch paths on CPU, as users type them: `torchrun -m distlab fit ...` on one node, on two
"nodes" (two torchrun agents meeting at a c10d rendezvous on 127.0.0.1), a job that loses a rank, and a
job restarted by `torchrun --max-restarts=1` after an injected crash.

Oracle: the single-node, uninterrupted run. Same world size, same data stream (a function of the seed
and the step) and gloo: the other paths must end with bit-identical weights on every rank.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.helpers.callbacks import load_rank_weights
from tests.helpers.cli import CONFIGS, subprocess_env, write_yaml
from tests.helpers.dist import free_port

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
STEPS = 6


def fit_command(
    tmp_path: Path, *, steps: int = STEPS, ckpt_every: int = 2, filename: str = "last"
) -> list[str]:
    """`-m distlab fit` on the debug recipe, every rank's final weights saved, a checkpoint every 2 steps
    (``filename``: last.ckpt, or Lightning's default step-named one)."""
    extra = {
        "trainer": {
            "default_root_dir": str(tmp_path / "run"),
            "callbacks": [
                {
                    "class_path": "tests.helpers.callbacks.SaveRankWeights",
                    "init_args": {"dirpath": str(tmp_path / "weights")},
                },
                {  # a step cadence, independent of validation: what a restart resumes from
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"filename": filename, "every_n_train_steps": ckpt_every, "save_top_k": 1},
                },
            ],
        }
    }
    return [
        "-m",
        "distlab",
        "fit",
        "--config",
        str(CONFIGS / "debug.yaml"),
        "--config",
        write_yaml(tmp_path / "extra.yaml", extra),
        "--trainer.devices=auto",  # left to the CLI: it must match what torchrun started
        f"--trainer.max_steps={steps}",
    ]


def run_job(args: list[str], env: dict | None = None, timeout: float = 240) -> tuple[int, str, str, bool]:
    """Run a launcher in its own process group; (return code, stdout, stderr, whether a process outlived it).

    Whatever happens (a timeout included), no process of the job survives the call."""
    job = subprocess.Popen(
        args,
        env={**subprocess_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the job's process group: every worker it started is in it
    )
    try:
        out, err = job.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)
            leftover = True
        except ProcessLookupError:
            leftover = False
        if job.poll() is None:
            job.kill()
            job.communicate()
    return job.returncode, out, err, leftover


def assert_same_weights(ranks: list[dict], reference: list[dict]) -> None:
    for r, (got, want) in enumerate(zip(ranks, reference, strict=True)):
        for k, v in want["state"].items():
            assert torch.equal(got["state"][k], v), f"rank {r} differs from the single-node run at {k}"


@pytest.fixture(scope="module")
def single_node(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("single_node")
    code, out, err, _ = run_job([*TORCHRUN, "--standalone", "--nproc_per_node=2", *fit_command(tmp)])
    assert code == 0, err[-4000:]
    assert "matched the launcher: devices=2, strategy=ddp_optimizer_sync" in out + err
    start = "distlab: ddp_optimizer_sync on gloo process group, world size 2 (1 node(s) x 2 process(es)), device cpu"
    assert (out + err).count(start) == 1  # one start-up line per job
    return load_rank_weights(tmp / "weights", 2)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_two_processes_train_one_model(single_node):
    assert [r["world_size"] for r in single_node] == [2, 2]
    assert [r["strategy"] for r in single_node] == ["OptimizerSyncDDPStrategy"] * 2
    for k, v in single_node[0]["state"].items():
        assert torch.equal(v, single_node[1]["state"][k]), f"ranks differ at {k}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_nodes_equal_one_node(single_node, tmp_path):
    """`torchrun --nnodes=2 --nproc_per_node=1` twice (one agent per "node"), c10d rendezvous on 127.0.0.1."""
    port = free_port()
    node_args = [
        [
            *TORCHRUN,
            "--nnodes=2",
            "--nproc_per_node=1",
            f"--node_rank={node}",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}",
            "--rdzv_id=distlab-two-nodes",
            *fit_command(tmp_path),
        ]
        for node in (0, 1)
    ]
    with ThreadPoolExecutor(2) as pool:  # the two agents run at once, as on two machines
        results = list(pool.map(run_job, node_args))
    for code, _, err, leftover in results:
        assert code == 0 and not leftover, err[-4000:]
    outputs = [(out, err) for _, out, err, _ in results]
    log = "".join(o + e for o, e in outputs)
    assert "matched the launcher: devices=1, num_nodes=2" in log
    assert "process group, world size 2 (2 node(s) x 1 process(es)), device cpu" in log
    ranks = load_rank_weights(tmp_path / "weights", 2)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert_same_weights(ranks, single_node)


def kubeflow_pod_env(node: int, nodes: int, port: int) -> dict[str, str]:
    """What Kubeflow (Trainer v2's torch runtime, and the training operator's PyTorchJob) puts in a pod's
    environment for ``torchrun`` (which reads PET_* as its options), plus the pod-level variables the operator also
    sets: WORLD_SIZE/RANK count pods, not processes, and torchrun replaces them for its workers."""
    return {
        "PET_NNODES": str(nodes),
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": str(node),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(nodes),
        "RANK": str(node),
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_PORT": "tcp://10.96.0.1:443",
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kubeflow_pods_environment_trains_as_one_node(single_node, tmp_path):
    """Two "pods" on this machine, each started as the manifest's command (`torchrun -m distlab fit ...`, no
    launcher options: torchrun takes them from PET_*) in exactly the environment Kubeflow gives a pod: the job
    trains one model, bit-identical to the single-node run."""
    port = free_port()
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(
                lambda node: run_job(
                    [*TORCHRUN, *fit_command(tmp_path)], env=kubeflow_pod_env(node, 2, port)
                ),
                (0, 1),
            )
        )
    for code, _, err, leftover in results:
        assert code == 0 and not leftover, err[-4000:]
    log = "".join(out + err for _, out, err, _ in results)
    assert "process group, world size 2 (2 node(s) x 1 process(es)), device cpu" in log
    ranks = load_rank_weights(tmp_path / "weights", 2)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert_same_weights(ranks, single_node)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pytorchjob_one_process_per_pod_with_lightnings_kubeflow_environment(single_node, tmp_path):
    """A PyTorchJob whose pods run `python -m distlab fit` directly (one process per pod, WORLD_SIZE/RANK from the
    operator, no torchrun), with Lightning's KubeflowEnvironment given as the Trainer's plugin: not refused as a
    stray WORLD_SIZE, and the job equals the single-node run bit for bit."""
    port = free_port()
    pod = [
        *fit_command(tmp_path),
        "--trainer.num_nodes=2",
        "--trainer.devices=1",
        "--trainer.strategy=ddp_optimizer_sync",
        "--trainer.plugins=lightning.fabric.plugins.environments.KubeflowEnvironment",
    ]
    env = {k: v for k, v in kubeflow_pod_env(0, 2, port).items() if not k.startswith("PET_")}
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(lambda node: run_job([sys.executable, *pod], env={**env, "RANK": str(node)}), (0, 1))
        )
    for code, _, err, leftover in results:
        assert code == 0 and not leftover, err[-4000:]
    ranks = load_rank_weights(tmp_path / "weights", 2)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert_same_weights(ranks, single_node)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("filename", ["last", None])
def test_restart_resumes_from_the_newest_checkpoint(single_node, tmp_path, filename):
    """Rank 1 crashes at step 3 (a checkpoint was written at step 2: last.ckpt, or a recipe's step-named one):
    torchrun restarts both workers, which resume from it on their own, in the same run folder, and end where the
    uninterrupted run did."""
    code, out, err, _ = run_job(
        [
            *TORCHRUN,
            "--standalone",
            "--nproc_per_node=2",
            "--max-restarts=1",
            *fit_command(tmp_path, filename=filename),
        ],
        env={"DISTLAB_FAULT": "crash:1:3"},
    )
    log = out + err
    assert code == 0, log[-4000:]
    assert "injected crash on rank 1 at step 3" in log
    saved = "last.ckpt" if filename else "epoch=0-step=2.ckpt"
    assert f"restart 1 of this job: resuming from {tmp_path / 'run' / 'checkpoints' / saved}" in log, log[
        -3000:
    ]
    run = tmp_path / "run"
    if filename:
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt"]
    else:  # the restart's own checkpoints continue the numbering: no "-v1" copy of an earlier step
        names = sorted(p.name for p in (run / "checkpoints").iterdir())
        assert f"epoch=0-step={STEPS}.ckpt" in names and not any("-v" in n for n in names), names
    assert [p.relative_to(run) for p in run.rglob("metrics.csv")] == [
        Path("metrics.csv")
    ]  # one logger version
    ranks = load_rank_weights(tmp_path / "weights", 2)
    assert [len(r["losses"]) for r in ranks] == [STEPS - 2] * 2  # the restarted attempt began at step 2
    assert [r["losses"] for r in ranks] == [r["losses"][2:] for r in single_node]
    assert_same_weights(ranks, single_node)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["crash", "sigkill"])
def test_one_failing_rank_ends_the_whole_job(tmp_path, kind):
    """An exception (or SIGKILL) on rank 1 only: the job exits non-zero, names the rank, and leaves no
    process behind (rank 0 was waiting in a collective). The timeout is the hang bound."""
    code, _, err, leftover = run_job(
        [*TORCHRUN, "--standalone", "--nproc_per_node=2", *fit_command(tmp_path, steps=50)],
        env={"DISTLAB_FAULT": f"{kind}:1:1"},
        timeout=90,
    )
    assert code != 0
    assert not leftover, "a worker outlived the job"
    assert re.search(r"rank\s*:\s*1\b", err), err[-3000:]  # torchrun's failure summary names the rank
    if kind == "crash":
        assert "distlab: error: injected crash on rank 1 at step 1" in err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_with_mismatched_devices_fails_in_one_line(tmp_path):
    code, _, err, leftover = run_job(
        [
            *TORCHRUN,
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "distlab",
            "fit",
            "--config",
            str(CONFIGS / "debug.yaml"),
            "--trainer.devices=1",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    assert code != 0 and not leftover
    assert (
        "distlab: error: torchrun started 2 processes (2 per node) but the trainer asks for devices=1" in err
    )


HSDP = ["--trainer.strategy=distlab.strategies.FSDP2Strategy", "--trainer.strategy.replicate_degree=2"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hsdp_on_two_torchrun_nodes_of_two_processes_equals_one_node_of_four(tmp_path):
    """HSDP as users launch it across nodes: two torchrun agents ("nodes", c10d rendezvous on 127.0.0.1) of 2
    processes each, replicate_degree=2 (shard inside a node, replicate across), end with the weights one agent of 4
    processes trains with the same mesh, bit for bit on every rank."""
    one = tmp_path / "one"
    code, out, err, _ = run_job(
        [*TORCHRUN, "--standalone", "--nproc_per_node=4", *fit_command(one), *HSDP], timeout=500
    )
    assert code == 0, err[-4000:]
    assert "in each of 2 replicas (HSDP)" in out + err
    reference = load_rank_weights(one / "weights", 4)
    two = tmp_path / "two"
    port = free_port()
    node_args = [
        [*TORCHRUN, "--nnodes=2", "--nproc_per_node=2", f"--node_rank={node}", "--rdzv_backend=c10d",
         f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=distlab-hsdp", *fit_command(two), *HSDP]
        for node in (0, 1)
    ]  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda a: run_job(a, timeout=500), node_args))
    for code, _, err, leftover in results:
        assert code == 0 and not leftover, err[-4000:]
    log = "".join(o + e for _, o, e, _ in results)
    assert "world size 4 (2 node(s) x 2 process(es))" in log
    assert_same_weights(load_rank_weights(two / "weights", 4), reference)
