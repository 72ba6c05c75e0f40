"""SpeedMonitor's numbers against hand arithmetic: a fake clock makes the optimizer step that ends at global
step s take exactly s * 0.25 s and every validation batch 10 s, so tokens/s, step time, TFLOP/s and MFU
have exact expected values per line, and validation time leaking into training time, or a line covering
other steps than its own, would show. On 2 gloo ranks, the communication it reports
equals the optimizer's logical bytes computed from the parameter sizes."""

from __future__ import annotations

import csv
import math
import time
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from distlab.callbacks import RankZeroValidation, SpeedMonitor
from distlab.optim import DistMuonAdamW, muon_param_groups
from tests.helpers.cli import CONFIGS, distlab_exe, run_subprocess

B, T, VOCAB = 4, 8, 16
STEP_S, VAL_S = 0.25, 10.0
FLOPS = 3e9  # what the module says one micro-batch costs
PEAK = 2e12  # given peak FLOP/s of one device
# Newton-Schulz on one 32x32 hidden matrix (h1, h2), 5 iterations of X@X.T, A@A and B@X, each 2*32^3 FLOPs
NS_FLOPS_PER_MATRIX = 5 * 3 * 2 * 32**3


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.h1, self.h2 = nn.Linear(32, 32), nn.Linear(32, 32)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, x):  # (B, T) -> (B, T, VOCAB)
        return self.head(torch.relu(self.h2(torch.relu(self.h1(self.emb(x))))))


class ClockedModule(L.LightningModule):
    """A user-style module: each training step costs ``STEP_S`` on the clock, each validation batch ``VAL_S``."""

    def __init__(
        self,
        clock: FakeClock | None = None,
        flops: float | None = FLOPS,
        tokens: bool = True,
        ns_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.net, self.clock, self.tokens, self.ns_dtype = TinyLM(), clock, tokens, ns_dtype
        if flops is not None:
            self.flops_per_batch = flops  # Lightning's convention: a number per (micro-)batch

    def _loss(self, batch):
        x, y = batch
        if not self.tokens:  # features (B, 32) -> one value per sample
            net = self.net
            return F.mse_loss(net.head(torch.relu(net.h2(torch.relu(net.h1(x))))).sum(-1), y)
        return F.cross_entropy(self.net(x).flatten(0, 1), y.flatten())

    def training_step(self, batch, batch_idx):
        if self.clock:  # the step that ends at global step s costs s * STEP_S, spread over its micro-batches
            self.clock.now += (self.global_step + 1) * STEP_S / self.trainer.accumulate_grad_batches
        return self._loss(batch)

    def validation_step(self, batch, batch_idx):
        if self.clock:
            self.clock.now += VAL_S
        self.log("val_loss", self._loss(batch))

    def configure_optimizers(self):
        return DistMuonAdamW(muon_param_groups(self.net, lr=0.02, adamw_lr=1e-3), ns_dtype=self.ns_dtype)


def loaders(tokens: bool = True):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (64, T), generator=g)
    y = torch.roll(x, -1, dims=1)
    if not tokens:  # float features: samples, no tokens
        x, y = torch.randn(64, 32, generator=g), torch.randn(64, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=B, shuffle=False), DataLoader(
        TensorDataset(x[:8], y[:8]), batch_size=B
    )


def _peak_rss_gb() -> float:
    """This process's peak resident set size (VmHWM, kB) from /proc/self/status, in GB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e9
    pytest.skip("no /proc/self/status here")


def fit_single(tmp_path, monkeypatch, validation: str, accumulate: int, **module_kwargs) -> SpeedMonitor:
    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    speed = SpeedMonitor(every_n_steps=4, peak_flops=PEAK)
    callbacks = [speed]
    extra = dict(val_check_interval=4 * accumulate, check_val_every_n_epoch=None)
    if validation == "rank_zero":
        callbacks.insert(0, RankZeroValidation(every_n_steps=4))  # before SpeedMonitor: its time lands inside
        extra = {}
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=12,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        callbacks=callbacks,
        **extra,
    )
    trainer.fit(ClockedModule(clock, **module_kwargs), *loaders(module_kwargs.get("tokens", True)))
    return speed


@pytest.mark.timeout(120)
@pytest.mark.parametrize("validation", ["lightning", "rank_zero"])
@pytest.mark.parametrize("accumulate", [1, 2])
def test_numbers_equal_hand_arithmetic(tmp_path, monkeypatch, validation, accumulate):
    speed = fit_single(tmp_path, monkeypatch, validation, accumulate)
    # Validations ran (20 s of fake time each) and are in no line. The first line covers steps 2-4 (step 1 is
    # warm-up), the others the four steps since the previous line.
    assert [h["step"] for h in speed.history] == [4, 8, 12]
    for h, steps in zip(speed.history, [range(2, 5), range(5, 9), range(9, 13)], strict=True):
        seconds = sum(s * STEP_S for s in steps)
        assert h["step_ms"] == pytest.approx(1e3 * seconds / len(steps), rel=1e-9), h
        assert h["tokens_per_s"] == pytest.approx(len(steps) * accumulate * B * T / seconds, rel=1e-9), h
        # per rank = this rank's tokens over the same time (one rank here; the 2-rank test checks the division)
        assert h["tokens_per_s_per_rank"] == pytest.approx(
            len(steps) * accumulate * B * T / seconds, rel=1e-9
        ), h
        assert h["samples_per_s"] == pytest.approx(len(steps) * accumulate * B / seconds, rel=1e-9), h
        flops_per_s = len(steps) * accumulate * FLOPS / seconds
        assert h["tflops_per_rank"] == pytest.approx(flops_per_s / 1e12, rel=1e-9), h
        assert h["mfu"] == pytest.approx(flops_per_s / PEAK, rel=1e-9), h
        # one optimizer step per global step, whatever the accumulation: both matrices on one rank
        optimizer_flops_per_s = len(steps) * 2 * NS_FLOPS_PER_MATRIX / seconds
        assert h["optimizer_tflops_per_rank"] == pytest.approx(optimizer_flops_per_s / 1e12, rel=1e-9), h
        assert h["hfu"] == pytest.approx((flops_per_s + optimizer_flops_per_s) / PEAK, rel=1e-9), h
        # The process's peak resident set, read here from /proc (not distlab's reading): never above it, and
        # not far below it (nothing large is allocated after the fit): a unit slip (KiB vs bytes) is 1024x off.
        assert 0.5 * _peak_rss_gb() <= h["peak_mem_gb"] <= _peak_rss_gb() * 1.001, (
            h["peak_mem_gb"],
            _peak_rss_gb(),
        )
    line = speed.line(speed.history[-1], {})
    assert f"{100 * speed.history[-1]['hfu']:.1f}% with the optimizer's matmuls |" in line, line


@pytest.mark.timeout(120)
def test_optimizer_matmuls_in_another_dtype_count_against_their_own_peak(tmp_path, monkeypatch):
    """Newton-Schulz in bf16 next to an fp32 model: its FLOP/s count against the bf16 peak (looked up once,
    here a given number), so a fast bf16 unit cannot inflate HFU past what the hardware did."""
    bf16_peak = 8 * PEAK
    looked_up = []

    def fake_peak(device, dtype):
        looked_up.append(dtype)
        return (bf16_peak, "given bf16") if dtype == torch.bfloat16 else (None, "none")

    monkeypatch.setattr("distlab.callbacks.speed.device_peak_flops", fake_peak)
    speed = fit_single(tmp_path, monkeypatch, "lightning", 1, ns_dtype=torch.bfloat16)
    assert looked_up == [torch.bfloat16]  # the model's peak was given; the optimizer's dtype looked up once
    h, steps = speed.history[-1], range(9, 13)
    seconds = sum(s * STEP_S for s in steps)
    model_flops_per_s = len(steps) * FLOPS / seconds
    optimizer_flops_per_s = len(steps) * 2 * NS_FLOPS_PER_MATRIX / seconds
    assert h["mfu"] == pytest.approx(model_flops_per_s / PEAK, rel=1e-9), h
    assert h["hfu"] == pytest.approx(
        model_flops_per_s / PEAK + optimizer_flops_per_s / bf16_peak, rel=1e-9
    ), h
    line = speed.line(h, {})
    assert (
        f"{100 * h['hfu']:.1f}% with the optimizer's matmuls, bfloat16 ones vs 16 (given bf16) |" in line
    ), line


@pytest.mark.timeout(120)
def test_no_flops_means_no_mfu_and_samples_without_tokens(tmp_path, monkeypatch):
    speed = fit_single(tmp_path, monkeypatch, "lightning", 1, flops=None, tokens=False)
    h = speed.history[-1]
    assert "mfu" not in h and "tflops_per_rank" not in h and "tokens_per_s" not in h
    assert h["samples_per_s"] == pytest.approx(4 * B / sum(s * STEP_S for s in range(9, 13)), rel=1e-9)
    line = speed.line(h, {})
    assert "no MFU" in line and "samples/s" in line and "tok/s" not in line


@pytest.mark.timeout(30)
def test_cpu_peak_is_measured_when_not_given():
    speed = SpeedMonitor(every_n_steps=2)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    speed.setup(trainer, ClockedModule(), "fit")
    assert speed.peak_source.startswith("measured float32 matmul")
    # A 2-core CPU does 1e9..1e13 FLOP/s in fp32; a unit mix-up (ms vs s, n^2 vs n^3) lands outside.
    assert 1e9 < speed.peak_flops < 1e13


def read_perf_rows(folder: Path) -> list[dict[str, float]]:
    (path,) = folder.rglob("metrics.csv")
    rows = list(csv.DictReader(path.open()))
    return [{k: float(v) for k, v in r.items() if v != ""} for r in rows if r.get("perf/step_ms", "") != ""]


@pytest.mark.timeout(300)
def test_two_ranks_report_the_optimizers_bytes(tmp_path):
    world = 2
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp_optimizer_sync_spawn",
        max_steps=6,
        logger=CSVLogger(tmp_path, name="speed"),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[SpeedMonitor(every_n_steps=3, peak_flops=PEAK)],
    )
    module = ClockedModule()
    trainer.fit(module, loaders()[0])
    rows = read_perf_rows(tmp_path)
    assert [int(r["step"]) for r in rows] == [3, 6]  # logged at the global step each line ends
    # ZeRO-1: every gradient is reduce-scattered once and every updated parameter all-gathered once, each
    # moving (W-1)/W of the parameters' fp32 bytes per rank. (Every tensor here splits evenly: no padding.)
    param_bytes = sum(p.numel() * 4 for p in module.net.parameters())
    expected_mb = (world - 1) / world * param_bytes / 1e6
    for r in rows:
        assert r["perf/comm_reduce_scatter_mb"] == pytest.approx(expected_mb, rel=1e-9), r
        assert r["perf/comm_all_gather_mb"] == pytest.approx(expected_mb, rel=1e-9), r
        assert 0 < r["perf/comm_fraction"] < 1, r
        assert r["perf/tokens_per_s"] == pytest.approx(world * r["perf/tokens_per_s_per_rank"]), r
        assert r["perf/samples_per_s"] == pytest.approx(r["perf/tokens_per_s"] / T), r  # both global
        assert math.isfinite(r["perf/mfu"]) and r["perf/mfu"] > 0
        # ZeRO-1: rank 0 orthogonalises one of the two same-shape matrices per step
        per_step = r["perf/optimizer_tflops_per_rank"] * 1e12 * r["perf/step_ms"] / 1e3
        assert per_step == pytest.approx(NS_FLOPS_PER_MATRIX, rel=1e-6), r


@pytest.mark.timeout(60)
def test_every_n_steps_below_two_is_one_line(tmp_path):
    args = ["fit", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={tmp_path / 'run'}"]
    args += ["--trainer.callbacks+=distlab.callbacks.SpeedMonitor", "--trainer.callbacks.every_n_steps=1"]
    out = run_subprocess([*distlab_exe(), *args], timeout=50)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    (line,) = [ln for ln in out.stderr.splitlines() if ln.startswith("distlab: error:")]
    assert (
        "trainer.callbacks.every_n_steps=1 is not accepted; set trainer.callbacks.every_n_steps to an integer >= 2"
        in line
    ), line
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(120)
def test_communication_per_step_and_its_share_of_the_step_equal_hand_arithmetic(tmp_path, monkeypatch):
    """A fake collective of COMM_S seconds and COMM_BYTES bytes per optimizer step: the line's per-step figures are
    those, and comm_fraction is COMM_S over the step's own time - not over the report window's (every_n_steps x)."""
    from distlab.callbacks import speed as speed_module

    COMM_S, COMM_BYTES = 0.05, 3e6
    done = {"steps": 0}

    class CountSteps(L.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            done["steps"] = trainer.global_step

    monkeypatch.setattr(
        speed_module.comm_stats,
        "snapshot",
        lambda: {"all_reduce": {"bytes": COMM_BYTES * done["steps"], "seconds": COMM_S * done["steps"]}},
    )
    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    speed = SpeedMonitor(every_n_steps=4, peak_flops=PEAK)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=12, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, default_root_dir=tmp_path,
        callbacks=[CountSteps(), speed],
    )  # fmt: skip
    trainer.fit(ClockedModule(clock), loaders(True)[0])
    assert [h["step"] for h in speed.history] == [4, 8, 12]
    for h, steps in zip(speed.history, [range(2, 5), range(5, 9), range(9, 13)], strict=True):
        step_s = sum(s * STEP_S for s in steps) / len(steps)
        assert h["comm_all_reduce_ms"] == pytest.approx(1e3 * COMM_S, rel=1e-9), h
        assert h["comm_all_reduce_mb"] == pytest.approx(COMM_BYTES / 1e6, rel=1e-9), h
        assert h["comm_fraction"] == pytest.approx(COMM_S / step_s, rel=1e-9), h
