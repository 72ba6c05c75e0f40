"""What only a GPU can run: the CPU suite's oracles and fits on CUDA with nccl. Skipped where torch sees no GPU;
``make test-gpu`` runs them (and nothing else). The code paths are the CPU tests' (tests/helpers/optim_cases.py,
the recipes and presets), so the CPU run proves all but the device.

- DistMuonAdamW / DistMuon / DistAdamW == torch.optim.Muon / AdamW on the averaged gradient, on 1..4 GPUs (nccl,
  its native reduce-scatter and the per-piece path), bit for bit: the oracle runs on cuda:0 with the same kernels.
- FSDP2 with bf16 compute and fp32 reduction (configs/trainer/fsdp2_gpu.yaml), HSDP (hsdp_gpu.yaml, 4+ GPUs),
  torch.compile, and SpeedMonitor's MFU against the GPU's datasheet peak, each through ``distlab fit``.
- Reproducible mode: 1 and 2 GPUs train the same bits.
"""

from __future__ import annotations

import csv
import sys
import warnings

import pytest
import torch

from tests.helpers.cli import CONFIGS, run_subprocess

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="no CUDA GPU: make test-gpu runs these on one"),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [w for w in (1, 2, 4) if w <= max(GPUS, 1)])
def test_dist_optimizers_equal_torchs_on_nccl(world):
    from tests.gpu import _jobs_gpu as jobs
    from tests.helpers.dist import run_distributed
    from tests.helpers.optim_cases import ADAMW_LR, MUON_LR, MUON_SHAPES, avg_grads, init_params

    got = run_distributed(jobs.job_cases_on_gpu, world, backend="nccl", timeout=500)
    for (
        name,
        spec,
    ) in jobs.SPECS.items():  # the oracle: torch's optimizers on cuda:0, fed the averaged gradient
        params = [p.cuda().requires_grad_() for p in init_params(spec)]
        n = len(MUON_SHAPES) if spec["kind"] != "adamw" else 0
        opts = []
        if spec["kind"] in ("muon", "mixed"):
            opts.append(torch.optim.Muon(params[:n], lr=MUON_LR))
        if spec["kind"] in ("adamw", "mixed"):
            # torch's single-tensor AdamW, the formula DistAdamW follows: on CUDA torch defaults to its foreach
            # implementation, whose fused ops round differently (1.5e-8 after 2 steps on an H200, 2026-11-27).
            opts.append(torch.optim.AdamW(params[n:], lr=ADAMW_LR, foreach=False))
        for s in jobs.STEPS:
            for p, g in zip(params, avg_grads(spec, s, world), strict=True):
                p.grad = None if g is None else g.cuda()
            for o in opts:
                o.step()
            want = [p.detach().cpu() for p in params]
            for rank, res in enumerate(got):
                for j, (a, b) in enumerate(zip(res[name]["snaps"][s], want, strict=True)):
                    assert torch.equal(a, b), (
                        f"{name} rank {rank} step {s} param {j}: {(a - b).abs().max().item()}"
                    )


def _fit(tmp_path, *args: str, timeout: int = 900):
    run = tmp_path / "run"
    out = run_subprocess(
        [sys.executable, "-m", "distlab", "fit", "--config", str(CONFIGS / "debug.yaml"),
         f"--trainer.default_root_dir={run}", *args],
        timeout=timeout,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    return run, out


@pytest.mark.timeout(900)
def test_fsdp2_bf16_compute_fp32_reduce_trains_on_gpus(tmp_path):
    run, out = _fit(tmp_path, "--config", str(CONFIGS / "trainer" / "fsdp2_gpu.yaml"), f"--trainer.devices={min(GPUS, 2)}",
                    "--trainer.max_steps=8")  # fmt: skip
    rows = [r for r in csv.DictReader((run / "metrics.csv").open()) if r.get("val_loss")]
    assert rows and all(float(r["val_loss"]) == float(r["val_loss"]) for r in rows), rows  # finite (not NaN)


@pytest.mark.timeout(900)
@pytest.mark.skipif(GPUS < 4, reason="HSDP 2x2 needs 4 GPUs")
def test_hsdp_trains_on_four_gpus(tmp_path):
    _, out = _fit(tmp_path, "--config", str(CONFIGS / "trainer" / "hsdp_gpu.yaml"), "--trainer.devices=4",
                  "--trainer.max_steps=8")  # fmt: skip
    assert "in each of 2 replicas (HSDP)" in out.stdout + out.stderr


@pytest.mark.timeout(900)
def test_torch_compile_trains_on_a_gpu(tmp_path):
    _fit(tmp_path, "--config", str(CONFIGS / "trainer" / "gpu.yaml"), "--trainer.devices=1", "--model.compile=true",
         "--trainer.max_steps=8")  # fmt: skip


@pytest.mark.timeout(900)
def test_speed_monitor_mfu_is_against_the_datasheet_peak(tmp_path):
    run, out = _fit(tmp_path, "--config", str(CONFIGS / "trainer" / "gpu.yaml"), "--trainer.devices=1",
                    "--trainer.max_steps=12", "--trainer.callbacks+=distlab.callbacks.SpeedMonitor",
                    "--trainer.callbacks.every_n_steps=4")  # fmt: skip
    said = out.stdout + out.stderr
    # The peak's source follows Lightning's table of GPUs (the oracle): its datasheet value where the table lists
    # this chip, else a measured bf16 matmul, said as such (Lightning 2.6 has no H200 row, say).
    from lightning.fabric.utilities.throughput import get_available_flops

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        listed = get_available_flops(torch.device("cuda", 0), torch.bfloat16)
    want = (
        f"of {listed / 1e12:.3g} ({torch.cuda.get_device_name(0)} datasheet)"
        if listed
        else "(measured bfloat16 matmul)"
    )
    assert want in said, (want, said[-2000:])
    rows = [r for r in csv.DictReader((run / "metrics.csv").open()) if r.get("perf/mfu")]
    assert rows and all(0 < float(r["perf/mfu"]) < 1 for r in rows), rows


@pytest.mark.timeout(900)
@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
def test_reproducible_mode_trains_the_same_bits_on_one_and_two_gpus(tmp_path):
    mode = ["--config", str(CONFIGS / "trainer" / "gpu_ddp.yaml"), "--trainer.strategy=distlab.strategies.OptimizerSyncDDPStrategy",
            "--trainer.strategy.reproducible=true", "--trainer.precision=32-true", "--trainer.max_steps=8"]  # fmt: skip
    states = []
    for world in (1, 2):
        run, _ = _fit(tmp_path / f"w{world}", *mode, f"--trainer.devices={world}")
        ckpt = sorted((run / "checkpoints").glob("*.ckpt"))[-1]
        states.append(torch.load(ckpt, weights_only=True, map_location="cpu")["state_dict"])
    for k, v in states[0].items():
        assert torch.equal(v, states[1][k]), k
