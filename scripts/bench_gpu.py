"""`make bench-gpu`: the depth-12 GPT on one GPU, bf16-mixed + torch.compile, through ``distlab fit``.

    python scripts/bench_gpu.py --out runs/bench_gpu            # a few minutes on one GPU
    python scripts/bench_gpu.py --steps 20 --depth 4            # quicker

Prints one table row (and writes bench_gpu.json): tokens/s, ms/step, MFU against the GPU's datasheet peak (Lightning's
table) and with the optimizer's Newton-Schulz matmuls (HFU), peak memory, read from SpeedMonitor's logged metrics
(the first steps, compilation included, left out). Exits 0 with a line saying so where there is no CUDA GPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(steps: int, depth: int, out_dir: Path) -> dict:
    every = max(2, steps // 4)
    with tempfile.TemporaryDirectory(prefix="distlab_bench_gpu_") as tmp:
        root = Path(tmp) / "run"
        args = [
            sys.executable, "-m", "distlab", "fit", "--config", str(REPO / "configs/demo_cpu.yaml"),
            "--config", str(REPO / "configs/trainer/gpu.yaml"), "--trainer.devices=1",
            f"--model.depth={depth}", "--model.sequence_len=1024", "--data.seq_len=1024", "--data.batch_size=16",
            "--model.compile=true", "--trainer.precision=bf16-mixed", f"--trainer.max_steps={steps}",
            "--trainer.limit_val_batches=0", "--trainer.enable_checkpointing=false",
            "--trainer.callbacks=distlab.callbacks.SpeedMonitor", f"--trainer.callbacks.every_n_steps={every}",
            f"--trainer.default_root_dir={root}",
        ]  # fmt: skip
        out = subprocess.run(args, cwd=REPO, env=os.environ, capture_output=True, text=True, timeout=3600)
        if out.returncode != 0:
            raise RuntimeError(f"distlab fit failed\n{out.stderr[-3000:]}")
        rows = [r for r in csv.DictReader((root / "metrics.csv").open()) if r.get("perf/step_ms")][1:]
        # SpeedMonitor's line says the peak and where it came from: Lightning's table, or measured here
        peaks = re.findall(r"MFU [\d.]+% of ([\d.]+) \(([^)]*)\)", out.stdout + out.stderr)
    mean = lambda k: sum(float(r.get(k) or 0.0) for r in rows) / len(rows)  # noqa: E731
    result = {
        "depth": depth,
        "steps": steps,
        "tokens_per_s": mean("perf/tokens_per_s"),
        "step_ms": mean("perf/step_ms"),
        "mfu": mean("perf/mfu"),
        "hfu": mean("perf/hfu"),
        "peak_mem_gb": mean("perf/peak_mem_gb"),
        "peak_tflops": float(peaks[-1][0]) if peaks else None,
        "peak_source": peaks[-1][1] if peaks else "not said",
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_gpu.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--out", default="runs/bench_gpu")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA GPU here; nothing measured (run it on a GPU machine)")
        return 0
    r = run(args.steps, args.depth, Path(args.out))
    print("| GPU | depth | tokens/s | ms/step | MFU | HFU | peak TFLOP/s (source) | peak mem GB |")
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {torch.cuda.get_device_name(0)} | {r['depth']} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.0f} | "
        f"{100 * r['mfu']:.1f}% | {100 * r['hfu']:.1f}% | {r['peak_tflops']} ({r['peak_source']}) | "
        f"{r['peak_mem_gb']:.2f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
