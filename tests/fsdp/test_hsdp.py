"""HSDP ("2 nodes x 2 GPUs" as 4 CPU gloo ranks): FSDP2 with a (replicate, shard) mesh, Muon on the shard group.

Oracles: torch's Muon/AdamW bit for bit on hand-made (Replicate, Shard(0)) params fed averaged gradients; the GPT
trained by one process on the whole global batch (fp32 Newton-Schulz), within the FSDP2 tolerances of
tests/fsdp/test_fsdp2_optim.py (gradients summed in another order); a 2x2 checkpoint resumed on 1x4 (FSDP2 over 4),
4x1 (replication only) and 2 ranks ends where the uninterrupted 2x2 run does, to the same tolerances.
"""

from __future__ import annotations

import pytest
import torch

from tests.fsdp import _jobs_fsdp2_optim as fsdp_jobs
from tests.fsdp import _jobs_hsdp as jobs
from tests.helpers.dist import run_distributed

MATRIX_TOL = dict(rtol=1e-4, atol=2e-5)
ADAMW_TOL = dict(rtol=1e-3, atol=2e-4)


def assert_close_state(got: dict, want: dict, what: str) -> None:
    for k, v in want.items():
        tol = ADAMW_TOL if k in ("wte.weight", "lm_head.weight") else MATRIX_TOL
        torch.testing.assert_close(got[k], v, **tol, msg=lambda m, k=k: f"{what}: {k}: {m}")


@pytest.fixture(scope="module")
def hsdp_run(tmp_path_factory) -> tuple[list[dict], str]:
    ckpt = tmp_path_factory.mktemp("hsdp_dcp")
    return run_distributed(jobs.job_train, 4, (2, 2), str(ckpt), None, timeout=300), str(ckpt / "saved")


@pytest.mark.timeout(300)
def test_the_sharded_step_on_an_hsdp_mesh_is_bit_exact_torch():
    want = fsdp_jobs.exact_oracle(4, clip=False)
    for rank, got in enumerate(run_distributed(jobs.job_exact, 4, (2, 2), timeout=200)):
        for step, (g_step, r_step) in enumerate(zip(got, want, strict=True)):
            for j, (g, r) in enumerate(zip(g_step, r_step, strict=True)):
                assert torch.equal(g, r), f"rank {rank} step {step} param {j}: {(g - r).abs().max().item()}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shape", [(2, 2), (1, 4), 3], ids=["2x2", "1x4", "1-D of 3"])
def test_optimizer_state_loaded_onto_shards_lands_on_the_rows_torch_puts_there(shape):
    """A full-tensor (or other-layout) optimizer state put onto HSDP/FSDP2 shards holds, on every rank, the rows
    torch's distribute_tensor gives that rank (the shard coordinate, not the replica's)."""
    world = shape if isinstance(shape, int) else shape[0] * shape[1]
    for wrong in run_distributed(jobs.job_shard_like, world, shape, timeout=100):
        assert not wrong, "\n".join(wrong)


@pytest.mark.timeout(400)
def test_hsdp_on_2x2_ranks_trains_what_one_process_does(hsdp_run):
    results, _ = hsdp_run
    assert results[0]["placements"] == "(Replicate(), Shard(dim=0))"
    assert [r["local_rows"] for r in results] == [
        129,
        128,
        129,
        128,
    ]  # 257 rows sharded in 2, replicated twice
    want = jobs.oracle()
    for rank, res in enumerate(results):
        assert_close_state(res["state"], want, f"rank {rank}")
    # Newton-Schulz work scales with the shard group: each matrix once per replica, split over its 2 ranks
    assert results[0]["ns_flops"] + results[1]["ns_flops"] == results[2]["ns_flops"] + results[3]["ns_flops"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("shape", [4, (4, 1), 2], ids=["1x4", "4x1", "2-ranks"])
def test_a_2x2_checkpoint_resumes_on_other_mesh_shapes(hsdp_run, shape):
    results, saved = hsdp_run
    world = shape if isinstance(shape, int) else shape[0] * shape[1]
    resumed = run_distributed(jobs.job_train, world, shape, None, saved, timeout=300)
    for rank, res in enumerate(resumed):
        assert_close_state(res["state"], results[0]["state"], f"{shape} rank {rank}")


@pytest.mark.timeout(600)
def test_the_cli_trains_hsdp_with_replicate_degree_like_one_process(tmp_path):
    """`--trainer.strategy.replicate_degree=2` on 4 spawned ranks (the fsdp2 preset) == one process at the same
    global batch (4 windows), within the FSDP2 fit tolerances; a degree that does not divide the ranks: one line."""
    from tests.fsdp.test_fsdp2_fit import assert_matches, fit

    oracle = fit(tmp_path, "one", 1, "--data.batch_size=4", preset=None)[0]
    speed = {"class_path": "distlab.callbacks.SpeedMonitor", "init_args": {"every_n_steps": 2}}
    ranks = fit(
        tmp_path,
        "hsdp",
        4,
        "--trainer.strategy.replicate_degree=2",
        "--data.batch_size=1",
        callbacks=(speed,),
    )
    assert {r["strategy"] for r in ranks} == {"FSDP2Strategy"}
    assert_matches(ranks, oracle)  # (measuring the bytes changes nothing)
    # SpeedMonitor's bytes by mesh dimension: across the replicas (nodes) travels only HSDP's all-reduce of each
    # gradient shard, 2(R-1)/R of a rank's shards (FSDP2 pads a param's rows to a multiple of S: rank 0 holds
    # ceil(rows/S) of them in fp32); inside the shard group the all-gathers of whole params move more.
    shard_bytes = sum(-(-v.shape[0] // 2) * v[0].numel() * 4 for v in oracle["state"].values())
    for rank, r in enumerate(ranks):
        assert len(r["speed"]) >= 2, f"rank {rank}: {r['speed']}"
        for line in r["speed"]:
            assert line["comm_mesh_replicate_mb"] == pytest.approx(shard_bytes / 1e6, rel=1e-9), (rank, line)
            assert line["comm_mesh_shard_mb"] > 2 * line["comm_mesh_replicate_mb"], (rank, line)


def test_a_replicate_degree_that_does_not_divide_the_ranks_is_one_line(tmp_path, capsys):
    from distlab.cli import main
    from tests.helpers.cli import CONFIGS

    args = [
        "fit",
        "--config",
        str(CONFIGS / "debug.yaml"),
        "--config",
        str(CONFIGS / "trainer" / "fsdp2_cpu.yaml"),
    ]
    with pytest.raises(SystemExit) as info:
        main(
            [
                *args,
                "--trainer.devices=4",
                "--trainer.strategy.replicate_degree=3",
                f"--trainer.default_root_dir={tmp_path / 'r'}",
            ]
        )
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("distlab: error:")]
    assert info.value.code == 2 and len(lines) == 1, lines
    assert "replicate_degree=3 does not divide the 4 ranks" in lines[0]
    assert not (tmp_path / "r").exists()


@pytest.mark.timeout(900)
def test_a_2x2_hsdp_checkpoint_resumes_under_ddp_optimizer_sync_and_on_one_process(tmp_path):
    """The sharded folder an HSDP fit saved, resumed under ddp_optimizer_sync (2 ranks) and on one process: the CLI
    gathers its weights and optimizer state into one file, and the resumed runs end where the uninterrupted HSDP
    run does (FSDP2 fit tolerances: the sums differ in order only)."""
    from tests.fsdp.test_fsdp2_fit import CKPT, WEIGHT_TOL, fit

    hsdp = fit(tmp_path, "hsdp", 4, "--trainer.strategy.replicate_degree=2", "--data.batch_size=1", *CKPT,
               f"--trainer.callbacks.dirpath={tmp_path / 'ckpt'}")  # fmt: skip
    step3 = tmp_path / "ckpt" / "step=3.ckpt"
    assert step3.is_dir()
    for name, world, preset in (("sync2", 2, "ddp_optimizer_sync_spawn_cpu.yaml"), ("one", 1, None)):
        resumed = fit(
            tmp_path, name, world, f"--ckpt_path={step3}", f"--data.batch_size={4 // world}", preset=preset
        )
        for k, v in hsdp[0]["state"].items():
            torch.testing.assert_close(
                resumed[0]["state"][k], v, **WEIGHT_TOL, msg=lambda m, k=k, n=name: f"{n} {k}: {m}"
            )
