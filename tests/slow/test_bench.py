"""`make bench` cannot rot: scripts/bench.py runs end to end in its tiny mode (every part, every plot).

No number is asserted against a target here (speed belongs in the benchmark's printed table, not in a
test); what is checked is that each part measured something and wrote what the README shows."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from distlab.perf import default_ns_dtype
from tests.helpers.cli import run_subprocess

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(900)
def test_bench_runs_in_tiny_mode_and_writes_json_table_and_plots(tmp_path):
    out = run_subprocess([sys.executable, "scripts/bench.py", "--tiny", "--out", str(tmp_path)], timeout=850)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "bench.json").read_text())
    assert results["tiny"] is True and "cores" in results["machine"]
    # each part measured: positive, finite numbers where the table reads them
    comm = results["comm"]
    assert comm["bytes_ratio_vs_ring_allreduce"]["distlab"] == pytest.approx(1.0, abs=0.02)
    assert 0 < comm["step_time_ratio_vs_replicated"]["distlab"] < math.inf
    assert results["fsdp"]["ratios"]["fsdp2_param_bytes_over_full"] == pytest.approx(0.5, abs=0.01)
    assert 0 < results["fsdp"]["async_save"]["stall_ratio"] < math.inf  # async ÷ sync checkpoint stall
    # Where Newton-Schulz defaults to bf16 (a CPU that multiplies bf16 natively), the fp32 step and the
    # DistMuon ratio in bf16 are measured as well.
    auto_bf16 = default_ns_dtype(torch.device("cpu")) == torch.bfloat16
    assert results["scaling"]["ns_dtype_auto"] == ("bfloat16" if auto_bf16 else "float32")
    variants = results["scaling"]["variants"]
    assert set(variants) == {
        "1 rank",
        "2 ranks ddp_optimizer_sync",
        "3 ranks ddp_optimizer_sync",
        "2 ranks fsdp2",
        "1 rank, 2 micro-batches per step",  # the default's batch, the reproducible rows' reference
        "1 rank, reproducible (2 micro-shards)",
        "2 ranks, reproducible (2 micro-shards)",
        *(["1 rank, Newton-Schulz in float32"] if auto_bf16 else []),
    }
    cost = results["scaling"]["reproducible_cost"]
    assert set(cost) == {"1 rank", "2 ranks"} and all(0 < c < math.inf for c in cost.values())
    assert ("comm_bf16" in results) == auto_bf16
    if auto_bf16:
        assert results["comm_bf16"]["ns_dtype"] == "bfloat16"
        assert 0 < results["comm_bf16"]["step_time_ratio_vs_replicated"]["distlab"] < math.inf
    for name, v in variants.items():
        assert v["tokens_per_s"] > 0 and v["step_ms"] > 0 and v["steps_measured"] > 0, (name, v)
    assert variants["2 ranks ddp_optimizer_sync"]["comm_mb"]["reduce_scatter"] > 0
    assert 0 < results["scaling"]["lightning_vs_raw"]["ratio"] < math.inf
    for opt in ("muon", "adamw"):
        assert len(results["steps"]["runs"][opt]["curve"]) == 2  # evaluations at steps 2 and 4
    table = (tmp_path / "bench.md").read_text()
    assert "| measured | value | target |" in table and "Lightning" in table and "tiny mode" in table
    for name in ("loss_curves.png", "scaling.png", "step_time.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == PNG and len(data) > 5000, name
