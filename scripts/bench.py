"""`make bench`: every benchmark in one run; a JSON file, a markdown table and PNG plots.

    python scripts/bench.py --out runs/bench            # ~12 min on 2 cores
    python scripts/bench.py --tiny --out /tmp/bench     # a minute: the same code paths, meaningless numbers

Parts (each a script of its own too):
1. ``bench_optim.py --part comm``: DistMuonAdamW's bytes, state and step time at N=2 against the replicated
   baseline, side by side within each step (fp32 Newton-Schulz; again in bf16 where that is the CPU's default);
2. ``bench_fsdp.py``: FSDP2's per-rank parameter / state / comm bytes against ZeRO-1, and FSDP2 against HSDP at 4
   ranks ("2 nodes x 2"): every collective's bytes per step and rank by mesh dimension, measured;
3. ``bench_scaling.py``: tokens/s on 1, 2, 3 ranks and under FSDP2 through ``distlab fit``, where the step
   time goes, and the Lightning step against a raw torch.distributed loop;
4. ``bench_optim.py --part steps``: validation-loss curves of Muon + AdamW and AdamW alone (default lrs,
   500 steps), and the steps Muon needs to reach AdamW's final loss.

Writes ``bench.json``, ``bench.md`` (the table docs/benchmarks.md shows) and ``loss_curves.png``, ``scaling.png``,
``step_time.png`` into ``--out``. No assertion on any number: the table says what was measured, on which
machine, with its target beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from distlab.perf import default_ns_dtype  # noqa: E402
from scripts import bench_fsdp, bench_optim, bench_scaling  # noqa: E402


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {datetime.date.today().isoformat()}"


def plot_curves(steps: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, label in (("muon", "Muon + AdamW"), ("adamw", "AdamW")):
        curve = steps["runs"][name]["curve"]
        ax.plot([s for s, _ in curve], [v for _, v in curve], marker=".", label=label)
    ax.axhline(steps["adamw_final_val_loss"], color="gray", lw=0.8, ls="--", label="AdamW's final loss")
    ax.set_xlabel("step")
    ax.set_ylabel("val loss (nats/byte)")
    ax.set_title(f"demo model, {steps['budget_steps']} steps, same data and schedule")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "loss_curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def table(results: dict) -> str:
    comm, fsdp, steps, scaling = (results[k] for k in ("comm", "fsdp", "steps", "scaling"))
    t = comm["step_time_ratio_vs_replicated"]
    rows = [
        (
            "logical comm bytes / step / rank ÷ one ring all-reduce of the gradients",
            comm["bytes_ratio_vs_ring_allreduce"]["distlab"],
            "≤ 1.02",
        ),
        (
            "optimizer state bytes / rank × N ÷ a replicated optimizer's",
            comm["state_ratio_x_world_vs_replicated"]["distlab"],
            "≤ 1.05",
        ),
        (
            "DistMuon sync + step time at N=2 ÷ every rank doing all of Newton–Schulz (fp32 Newton–Schulz)",
            t["distlab"],
            "≤ 0.60",
        ),
        (
            "the same if every collective were free (each step less its blocking comm time): the floor",
            comm["step_time_ratio_if_comm_were_free"],
            "0.5 ideal",
        ),
    ]
    for name, row in results.get("overhead", {}).items():  # one process: the optimizer's cost per tensor
        target = "≤ 1.5" if name.startswith("small") else "≤ 1.1"
        rows.append(
            (
                f"one optimizer step ({name}: {row['tensors']} tensors) ÷ plain torch batched",
                row["ratio"],
                target,
            )
        )
    if "comm_bf16" in results:  # this CPU multiplies bf16 natively: Newton-Schulz's default dtype here
        bf16 = results["comm_bf16"]
        rows += [
            (
                "the same step ratio with bf16 Newton–Schulz (this CPU's default)",
                bf16["step_time_ratio_vs_replicated"]["distlab"],
                "≤ 0.60",
            ),
            ("its floor (every collective free)", bf16["step_time_ratio_if_comm_were_free"], "0.5 ideal"),
        ]
    rows += [
        (
            "FSDP2 parameter bytes / rank ÷ the full model's",
            fsdp["ratios"]["fsdp2_param_bytes_over_full"],
            "0.5 (1/N)",
        ),
        (
            "training stall per FSDP2 checkpoint, async_save ÷ synchronous save (2 ranks)",
            fsdp["async_save"]["stall_ratio"],
            "< 1 (torchtitan at 7B: 0.04)",
        ),
        (
            "steps for Muon + AdamW to reach AdamW's final val loss ÷ AdamW's (default lrs)",
            steps["steps_ratio"],
            "≤ 0.65",
        ),
        (
            "tokens/s on 2 ranks ÷ 1 rank (1 thread each, `ddp_optimizer_sync`)",
            scaling["variants"]["2 ranks ddp_optimizer_sync"]["scaling"],
            "≈ 2",
        ),
        (
            "tokens/s on 3 ranks ÷ 1 rank (3 ranks on this machine's cores)",
            scaling["variants"]["3 ranks ddp_optimizer_sync"]["scaling"],
            "cores / 1",
        ),
        ("tokens/s on 2 ranks under `fsdp2` ÷ 1 rank", scaling["variants"]["2 ranks fsdp2"]["scaling"], "—"),
        (
            "2-rank step through Lightning ÷ a raw torch.distributed loop",
            scaling["lightning_vs_raw"]["ratio"],
            "≤ 1.02",
        ),
        (
            "CPU training FLOP/s ÷ measured fp32 matmul peak (1 rank, 1 thread, Newton–Schulz in "
            f"{scaling.get('ns_dtype_auto', 'float32')}; MFU: the model's FLOPs)",
            scaling["variants"]["1 rank"]["mfu"],
            "≥ 0.60",
        ),
        (
            "the same counting the optimizer's Newton–Schulz matmuls too, each dtype against its own peak (HFU)",
            scaling["variants"]["1 rank"].get("hfu", float("nan")),
            "—",
        ),
    ]
    fp32_ns = scaling["variants"].get("1 rank, Newton-Schulz in float32")
    if fp32_ns:
        rows.append(
            (
                "the same MFU with Newton–Schulz in fp32 (the default on CPUs without bf16)",
                fp32_ns["mfu"],
                "—",
            )
        )
    if "forward_backward_alone" in scaling:
        rows.append(
            (
                "the model's forward + backward alone ÷ the peak (no optimizer, no Lightning)",
                scaling["forward_backward_alone"]["mfu"],
                "≥ 0.60",
            )
        )
    mesh = results.get("mesh_bytes")
    if mesh:
        f1x4, h2x2 = mesh["FSDP2 1x4"]["by_dim"], mesh["HSDP 2x2"]["by_dim"]
        rows.append(
            (
                "4 ranks as 2 nodes x 2: bytes / step / rank that cross nodes, HSDP 2x2 ÷ FSDP2 over all 4 (whose "
                "every collective spans the nodes)",
                h2x2.get("replicate", 0.0) / sum(f1x4.values()),
                "< 1",
            )
        )
    cost = scaling.get("reproducible_cost", {})
    for ranks, ratio in cost.items():
        rows.append(
            (f"tokens/s in reproducible mode ÷ the default, {ranks} (same batch and steps)", ratio, "—")
        )
    if "1 rank, torch.compile" in scaling["variants"]:
        compiled = scaling["variants"]["1 rank, torch.compile"]
        rows.append(
            (
                "step time with `torch.compile` ÷ without (1 rank, CPU inductor)",
                compiled["step_ms"] / scaling["variants"]["1 rank"]["step_ms"],
                "< 1",
            )
        )
        rows.append(("the same MFU with `torch.compile`", compiled["mfu"], "≥ 0.60"))
    lines = [
        f"Machine: {results['machine']}{' (tiny mode: numbers meaningless)' if results['tiny'] else ''}",
        "",
        "| measured | value | target |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | **{value:.3f}** | {target} |" for name, value, target in rows]
    lines += ["", bench_scaling.table(scaling)]
    if mesh:
        lines += ["", bench_fsdp.mesh_table(mesh)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="runs/bench")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--render", action="store_true", help="only re-write bench.md from --out/bench.json")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.render:
        results = json.loads((out / "bench.json").read_text())
        bench_scaling.plot(results["scaling"], out)
        plot_curves(results["steps"], out)
        md = table(results)
        (out / "bench.md").write_text(md + "\n")
        print(md)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    tiny = args.tiny
    results = {"machine": machine(), "tiny": tiny}
    print("1/4 optimizer: bytes, state, step time", flush=True)
    results["comm"] = bench_optim.bench_comm(steps=2 if tiny else 24, tiny=tiny)
    if default_ns_dtype(torch.device("cpu")) == torch.bfloat16:
        results["comm_bf16"] = bench_optim.bench_comm(
            steps=2 if tiny else 24, ns_dtype=torch.bfloat16, tiny=tiny
        )
    results["overhead"] = bench_optim.bench_overhead(repeats=3 if tiny else 30)
    print("2/4 FSDP2 memory and bytes; FSDP2 vs HSDP bytes by mesh dimension at 4 ranks", flush=True)
    fsdp = bench_fsdp.bench(world=2, depth=1 if tiny else 4)
    results["fsdp"] = fsdp
    results["mesh_bytes"] = bench_fsdp.bench_mesh_bytes(depth=1 if tiny else 4)
    print("3/4 scaling and Lightning vs raw", flush=True)
    results["scaling"] = bench_scaling.bench(4 if tiny else 30, tiny, out)
    print("4/4 Muon + AdamW vs AdamW loss curves", flush=True)
    results["steps"] = bench_optim.bench_steps(
        steps=4 if tiny else 500, eval_every=2 if tiny else 25, tiny=tiny
    )
    plots = [*results["scaling"]["plots"], str(plot_curves(results["steps"], out))]
    results["plots"] = plots
    md = table(results)
    (out / "bench.md").write_text(md + "\n")
    (out / "bench.json").write_text(json.dumps(results, indent=2, default=str))
    print(md)
    print(f"wrote {out / 'bench.json'}, {out / 'bench.md'}, " + ", ".join(plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
