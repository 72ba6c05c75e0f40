"""Multi-rank CPU scaling and what Lightning costs, measured side by side in one run.

    python scripts/bench_scaling.py --json runs/bench/scaling.json     # ~4 min on 2 cores
    python scripts/bench_scaling.py --tiny --json /tmp/scaling.json    # seconds: the same code paths

Every variant trains the demo model (depth 4, 16 windows of 128 bytes per rank, Muon + AdamW) with one
thread per rank, validation off:

- ``distlab fit`` (the CLI, as a user runs it) on 1, 2 and 3 ranks under ``ddp_optimizer_sync`` (spawned),
  and on 2 ranks under ``fsdp2``: tokens/s and the time in each kind of distlab collective, read from
  :class:`distlab.callbacks.SpeedMonitor`'s logged metrics (step 1 left out). Scaling = tokens/s / the
  1-rank tokens/s. On a 2-core machine, 3 ranks share 2 cores: the row shows what oversubscription costs.
- the 2-rank Lightning step / a raw ``torch.distributed`` loop with the same model, data stream, optimizer
  and LR schedule (``distlab.testing.run_distributed``). The two alternate (Lightning, raw, three times)
  so host drift hits both; the ratio is the median of the three pairs' ratios of mean step times (one run
  on a shared host moves by up to 4%).
- the model's forward + backward alone on one thread: how close the part MFU counts gets to the peak.
- reproducible mode (``ddp_optimizer_sync`` with ``reproducible: true``, 2 micro-shards) on 1 and 2 ranks: its
  tokens/s over the default's at the same batch and steps (1 rank: 2 accumulated micro-batches in both).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from distlab.perf import default_ns_dtype  # noqa: E402
from distlab.testing import TINY_GPT  # noqa: E402

DEMO = dict(
    depth=4, sequence_len=128, optimizer="muon", warmup_steps=10, schedule="linear", warmdown_ratio=0.4
)
DATA = dict(seq_len=128, batch_size=16)
TINY_DATA = dict(
    seq_len=TINY_GPT["sequence_len"], batch_size=2, paths=[str(REPO / "distlab")], val_fraction=0.2
)

REPRODUCIBLE = [
    "--trainer.strategy=distlab.strategies.OptimizerSyncDDPStrategy",
    "--trainer.strategy.reproducible=true",
]
VARIANTS = {  # name -> (preset, ranks, extra CLI args)
    "1 rank": (None, 1, []),
    "2 ranks ddp_optimizer_sync": ("ddp_optimizer_sync_spawn_cpu.yaml", 2, []),
    "3 ranks ddp_optimizer_sync": ("ddp_optimizer_sync_spawn_cpu.yaml", 3, []),
    "2 ranks fsdp2": ("fsdp2_cpu.yaml", 2, []),
    "1 rank, torch.compile": (
        None,
        1,
        ["--model.compile=true"],
    ),  # not in tiny mode: compiling takes a minute
    # Only where the default ("auto") is bf16, i.e. the CPU multiplies bf16 natively: the step with the
    # fp32 Newton-Schulz every host used before (elsewhere the "1 rank" row already is that).
    "1 rank, Newton-Schulz in float32": (None, 1, ["--model.ns_dtype=float32"]),
    # Reproducible mode's cost, each against the default at the same batch and steps (2 micro-batches per step):
    # 1 rank accumulates 2 micro-batches in both; 2 ranks take one each.
    "1 rank, 2 micro-batches per step": (None, 1, ["--trainer.accumulate_grad_batches=2"]),
    "1 rank, reproducible (2 micro-shards)": (None, 1, [*REPRODUCIBLE, "--trainer.strategy.micro_shards=2"]),
    "2 ranks, reproducible (2 micro-shards)": (
        None,
        2,
        [*REPRODUCIBLE, "--trainer.strategy.start_method=forkserver", "--trainer.strategy.micro_shards=2"],
    ),
}
# what each reproducible variant costs: (reproducible, default at the same batch and steps)
REPRODUCIBLE_PAIRS = {
    "1 rank": ("1 rank, reproducible (2 micro-shards)", "1 rank, 2 micro-batches per step"),
    "2 ranks": ("2 ranks, reproducible (2 micro-shards)", "2 ranks ddp_optimizer_sync"),
}


def _cli_overrides(model: dict, data: dict) -> list[str]:
    fmt = lambda v: f"[{','.join(v)}]" if isinstance(v, list) else v  # noqa: E731
    return [f"--model.{k}={v}" for k, v in model.items()] + [f"--data.{k}={fmt(v)}" for k, v in data.items()]


def run_cli_variant(name: str, steps: int, tiny: bool, workdir: Path) -> dict:
    """``distlab fit`` of one variant; the mean step time and per-op comm over steps 2..steps."""
    preset, ranks, extra_args = VARIANTS[name]
    every = max(2, steps // 3)
    root = workdir / name.replace(" ", "_")
    workdir.mkdir(parents=True, exist_ok=True)
    extra = workdir / "bench_trainer.yaml"
    extra.write_text(
        "trainer:\n"
        "  limit_val_batches: 0\n  enable_checkpointing: false\n  enable_progress_bar: false\n"
        "  log_every_n_steps: 1\n"
        "  callbacks:\n    - class_path: distlab.callbacks.SpeedMonitor\n"
        f"      init_args: {{every_n_steps: {every}}}\n"
    )
    args = [sys.executable, "-m", "distlab", "fit", "--config", str(REPO / "configs/demo_cpu.yaml")]
    if preset:
        args += ["--config", str(REPO / "configs/trainer" / preset)]
    args += ["--config", str(extra), f"--trainer.devices={ranks}", f"--trainer.max_steps={steps}"]
    args += [f"--trainer.default_root_dir={root}", *extra_args]
    args += _cli_overrides(TINY_GPT if tiny else {}, TINY_DATA if tiny else DATA)
    # tiny: the same command in this process (the code paths, without a second start-up of torch and Lightning)
    if tiny:
        from distlab.cli import main

        try:
            main(args[3:])
        except SystemExit as e:
            raise RuntimeError(f"{name}: distlab fit failed (exit {e.code}), as said above") from None
    else:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        out = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(f"{name}: distlab fit failed\n{out.stderr[-3000:]}")
    rows = [r for r in csv.DictReader((root / "metrics.csv").open()) if r.get("perf/step_ms")]
    # Each logged line covers the steps since the previous one (the first: steps 2..every).
    spans = [every - 1] + [every] * (len(rows) - 1)
    total = sum(spans)
    mean = lambda key: sum(float(r.get(key) or 0.0) * n for r, n in zip(rows, spans, strict=True)) / total  # noqa: E731
    ops = sorted(
        {
            k[len("perf/comm_") : -3]
            for r in rows
            for k in r
            if k.startswith("perf/comm_") and k.endswith("_ms")
        }
    )
    return {
        "ranks": ranks,
        "step_ms": mean("perf/step_ms"),
        "tokens_per_s": mean("perf/tokens_per_s"),
        "mfu": mean("perf/mfu"),
        "hfu": mean("perf/hfu"),  # model and Newton-Schulz FLOPs, each over its own dtype's peak
        "comm_ms": {op: mean(f"perf/comm_{op}_ms") for op in ops},
        "comm_mb": {op: mean(f"perf/comm_{op}_mb") for op in ops},
        "steps_measured": total,
    }


def raw_loop(rank: int, world: int, steps: int, tiny: bool) -> dict:
    """The same training step without Lightning: model, data stream, DistMuonAdamW, LR schedule."""
    from distlab.data import TextDataModule
    from distlab.data.windows import TrainWindows
    from distlab.distributed import broadcast_module_states
    from distlab.modules import GPTLightningModule
    from distlab.modules.schedule import lr_multiplier
    from distlab.optim import DistMuonAdamW

    torch.manual_seed(1337)
    module = GPTLightningModule(**(TINY_GPT if tiny else {k: v for k, v in DEMO.items()}))
    broadcast_module_states(module)
    hp = module.hparams
    opt = DistMuonAdamW(
        module.param_groups(),
        max_grad_norm=hp.max_grad_norm,
        grad_sync="reduce",
        ns_dtype=None if hp.ns_dtype == "auto" else hp.ns_dtype,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: lr_multiplier(s, steps, hp.warmup_steps, hp.schedule, hp.warmdown_ratio, hp.min_lr_ratio),
    )
    data = TINY_DATA if tiny else DATA
    dm = TextDataModule(**data)
    stream = iter(
        TrainWindows(dm.prepare_splits().train, data["seq_len"], data["batch_size"], dm.seed, rank, world, 0)
    )
    times = []
    last = time.perf_counter()
    for _ in range(steps):
        x, y = next(stream)
        loss = module.model(x, targets=y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return {"step_ms": 1e3 * statistics.fmean(times[1:])}  # step 1 left out, as SpeedMonitor does


def forward_backward_alone(steps: int, tiny: bool) -> dict:
    """The model's forward + backward on the demo batch, one thread, no optimizer and no Lightning: how close the
    part MFU counts gets to the measured matmul peak (the rest of a 1-rank step is mostly the optimizer's work)."""
    from distlab.models.gpt import GPT, GPTConfig
    from distlab.perf import measure_matmul_flops

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = GPT(GPTConfig(**(TINY_GPT if tiny else {k: DEMO[k] for k in ("depth", "sequence_len")})))
        data = TINY_DATA if tiny else DATA
        x = torch.randint(0, model.config.vocab_size, (data["batch_size"], data["seq_len"]))
        peak = measure_matmul_flops(torch.device("cpu"))
        times = []
        for _ in range(steps + 1):
            t0 = time.perf_counter()
            model(x, targets=x).backward()
            times.append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
        step_s = statistics.median(times[1:])  # the first one warms up
        flops = model.flops_per_token(data["seq_len"]) * x.numel()
        return {"step_ms": 1e3 * step_s, "mfu": flops / step_s / peak, "peak_flops": peak}
    finally:
        torch.set_num_threads(threads)


def run_raw(steps: int, tiny: bool) -> dict:
    from distlab.testing import run_distributed

    results = run_distributed(raw_loop, 2, steps, tiny, timeout=900)
    return {"step_ms": results[0]["step_ms"]}


def plot(results: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    names = list(results["variants"])
    v = results["variants"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(names, [v[n]["tokens_per_s"] for n in names], color="#4878a8", label="measured")
    base = v["1 rank"]["tokens_per_s"]
    ax.scatter(
        names, [base * v[n]["ranks"] for n in names], color="black", marker="_", s=400, label="ranks x 1-rank"
    )
    ax.set_ylabel("tokens/s (all ranks)")
    ax.set_title("CPU scaling, demo model, 1 thread per rank")
    ax.legend()
    ax.set_xticks(range(len(names)), [n.replace(" ", "\n", 2) for n in names], fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "scaling.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ops = sorted({op for n in names for op in v[n]["comm_ms"]})
    bottom = [0.0] * len(names)
    for op in ops:
        vals = [v[n]["comm_ms"].get(op, 0.0) for n in names]
        ax.bar(names, vals, bottom=bottom, label=op)
        bottom = [b + x for b, x in zip(bottom, vals, strict=True)]
    rest = [v[n]["step_ms"] - b for n, b in zip(names, bottom, strict=True)]
    ax.bar(names, rest, bottom=bottom, color="#cccccc", label="compute and the rest")
    ax.set_ylabel("ms per step (rank 0)")
    ax.set_title("Where the step time goes (distlab's collectives, blocking time)")
    ax.legend(fontsize=7)
    ax.set_xticks(range(len(names)), [n.replace(" ", "\n", 2) for n in names], fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "step_time.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def bench(steps: int, tiny: bool, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="distlab_bench_") as tmp:
        work = Path(tmp)
        auto_bf16 = default_ns_dtype(torch.device("cpu")) == torch.bfloat16
        names = [
            n
            for n in VARIANTS
            if not (tiny and "compile" in n)  # compiling alone takes a minute
            and (auto_bf16 or "float32" not in n)
        ]
        variants = {name: run_cli_variant(name, steps, tiny, work / f"v{i}") for i, name in enumerate(names)}
        lightning, raw = [], []
        for i in range(1 if tiny else 3):  # alternate, so host drift hits both
            lightning.append(
                run_cli_variant("2 ranks ddp_optimizer_sync", steps, tiny, work / f"l{i}")["step_ms"]
            )
            raw.append(run_raw(steps, tiny)["step_ms"])
        alone = forward_backward_alone(steps, tiny)
    pairs = [a / b for a, b in zip(lightning, raw, strict=True)]
    base = variants["1 rank"]["tokens_per_s"]
    for v in variants.values():
        v["scaling"] = v["tokens_per_s"] / base
    results = {
        "steps": steps,
        "tiny": tiny,
        "ns_dtype_auto": "bfloat16" if auto_bf16 else "float32",  # what "auto" chose on this CPU
        "variants": variants,
        "forward_backward_alone": alone,
        "lightning_vs_raw": {
            "lightning_step_ms": lightning,
            "raw_step_ms": raw,
            # each pair ran back to back; the median pair is robust to one disturbed run (seen: +/-4% per run)
            "pair_ratios": pairs,
            "ratio": statistics.median(pairs),
        },
    }
    results["reproducible_cost"] = {  # tokens/s in reproducible mode / the default's, same batch and steps
        ranks: variants[mode]["tokens_per_s"] / variants[default]["tokens_per_s"]
        for ranks, (mode, default) in REPRODUCIBLE_PAIRS.items()
        if mode in variants and default in variants
    }
    results["plots"] = [str(p) for p in plot(results, out_dir)]
    return results


def table(results: dict) -> str:
    lines = [
        "| variant (1 thread per rank) | tokens/s | scaling vs 1 rank | ms/step | MFU (vs measured fp32 matmul peak) | + the optimizer's matmuls (HFU) | distlab comm ms/step (blocking) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, v in results["variants"].items():
        comm = ", ".join(f"{op} {ms:.1f}" for op, ms in v["comm_ms"].items()) or "none"
        lines.append(
            f"| {name} | {v['tokens_per_s']:,.0f} | **{v['scaling']:.2f}** | {v['step_ms']:.0f} | "
            f"{100 * v['mfu']:.0f}% | {100 * v.get('hfu', 0.0):.0f}% | {comm} |"
        )
    alone = results.get("forward_backward_alone")
    if alone:
        lines.append(
            f"| the model's forward + backward alone (no optimizer, no Lightning) | | | {alone['step_ms']:.0f} | "
            f"{100 * alone['mfu']:.0f}% | | |"
        )
    cost = results.get("reproducible_cost")
    if cost:
        lines.append("")
        lines.append(
            "Reproducible mode's tokens/s / the default's at the same batch and steps: "
            + ", ".join(f"{ranks} **{ratio:.2f}**" for ranks, ratio in cost.items())
        )
    lv = results["lightning_vs_raw"]
    lines.append("")
    lines.append(
        f"2-rank step through Lightning (`ddp_optimizer_sync`) / raw torch.distributed loop: **{lv['ratio']:.3f}**, "
        f"the median of {len(lv['raw_step_ms'])} back-to-back pairs "
        f"({', '.join(f'{x:.3f}' for x in lv.get('pair_ratios', []))}; target <= 1.02; Lightning "
        f"{', '.join(f'{x:.0f}' for x in lv['lightning_step_ms'])} ms, raw {', '.join(f'{x:.0f}' for x in lv['raw_step_ms'])} ms)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30, help="training steps per variant")
    parser.add_argument("--tiny", action="store_true", help="depth-1 model, 4 steps: checks the code paths")
    parser.add_argument("--json", default="runs/bench/scaling.json")
    args = parser.parse_args(argv)
    steps = 4 if args.tiny else args.steps
    out = Path(args.json)
    results = bench(steps, args.tiny, out.parent)
    print(table(results))
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
