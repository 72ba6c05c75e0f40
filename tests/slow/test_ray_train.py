"""distlab's strategies on Ray Train: ``ray.train.torch.TorchTrainer`` with two CPU workers on gloo (Ray starts the
processes and the process group; ``ray.init(num_cpus=2)`` on this machine).

- ``ddp_optimizer_sync``, ``fsdp2`` and HSDP (:mod:`distlab.ray_train`) each train the very weights distlab's own
  2-rank spawned run trains, and Ray's ``prepare_trainer`` accepts them; on a map-style dataset too (each worker's
  share is Ray's rank of Ray's world, not 1 of the Trainer's ``devices x num_nodes``);
- with ``FailureConfig(max_failures=1)``, a worker SIGKILLed mid-run: Ray restarts the worker group, the fit resumes
  from distlab's newest checkpoint (``ckpt_path="last"``) and ends with the uninterrupted run's weights.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import lightning as L
import pytest
import ray
import torch

from tests.helpers.cli import REPO
from tests.helpers.ray_jobs import RUNS, STEPS, full_state, module_and_data, train, trainer_arguments

KILLED = "ddp_optimizer_sync"  # the run whose worker dies


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}},
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    """Each run on distlab's own 2 spawned ranks: rank 0's whole weights."""
    from distlab.strategies import FSDP2Strategy, OptimizerSyncDDPStrategy

    out = {}
    for tag, (name, kwargs) in RUNS.items():
        cls = OptimizerSyncDDPStrategy if name == "ddp_optimizer_sync" else FSDP2Strategy
        strategy = cls(start_method="forkserver", timeout=timedelta(seconds=60), **kwargs)
        arguments = trainer_arguments(tmp_path_factory.mktemp(tag))
        trainer = L.Trainer(strategy=strategy, devices=2, **arguments)
        module, data = module_and_data(tag)
        trainer.fit(module, data)
        out[tag] = full_state(module)
    return out


@pytest.fixture(scope="module")
def on_ray(ray_cluster, tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    """One Ray job of every run in turn, rank 1 SIGKILLed at step 3 of the first (``FailureConfig(max_failures=1)``:
    Ray restarts the worker group, which runs them all again with ``ckpt_path="last"``)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out = tmp_path_factory.mktemp("ray")
    TorchTrainer(
        train,
        train_loop_config={"out": str(out), "runs": list(RUNS), "kill": (KILLED, 3)},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        torch_config=TorchConfig(backend="gloo", timeout_s=60),
        run_config=RunConfig(
            storage_path=str(out / "ray_results"), failure_config=FailureConfig(max_failures=1)
        ),
    ).fit()
    return out, {tag: torch.load(out / f"{tag}.pt", weights_only=True) for tag in RUNS}


def assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], tag: str) -> None:
    assert got.keys() == want.keys(), tag
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=f"{tag}: {name}")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_distlab_strategies_on_ray_workers_train_the_spawned_runs_weights(on_ray, spawned):
    _, results = on_ray
    for tag, result in results.items():
        assert result["step"] == STEPS and result["world"] == 2, (tag, result["step"], result["world"])
        assert_same_weights(result["state"], spawned[tag], tag)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_killed_worker_resumes_from_the_newest_checkpoint_and_ends_as_uninterrupted(on_ray, spawned):
    out, results = on_ray
    assert (out / KILLED / "killed").exists()  # the first attempt did die at step 3
    # the second attempt started from the step-2 checkpoint (from scratch it would end with the same weights)
    assert (out / f"{KILLED}-starts.txt").read_text().split() == ["0", "2"]
    assert results[KILLED]["step"] == STEPS
    assert_same_weights(results[KILLED]["state"], spawned[KILLED], "resumed")
