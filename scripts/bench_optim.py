"""Benchmark DistMuonAdamW: communication, optimizer memory, step time, and Muon's sample efficiency.

    python scripts/bench_optim.py                   # everything (~15 min on 2 CPU cores)
    python scripts/bench_optim.py --part comm       # communication / memory / step time only (~1 min)
    python scripts/bench_optim.py --part overhead   # one process: the step's cost per tensor vs batched torch
    python scripts/bench_optim.py --part steps      # Muon+AdamW vs AdamW steps-to-target (~13 min)
    python scripts/bench_optim.py --part steps --sweep adamw   # tune the AdamW baseline first (~26 min)
    python scripts/bench_optim.py --json runs/bench_optim.json

Every number is a ratio measured side by side in the same run (absolute times on a shared machine
drift). Communication is counted in *logical* bytes requested of the collectives per rank, as NCCL's
ring algorithms would move them (gloo's own wire traffic differs).

Variants at N=2 ranks (gloo, CPU), on the demo model (depth 4, 3.3M params, batch 16 x 128 per rank):
  distlab      - DistMuonAdamW, grad_sync="reduce": reduce_scatter -> owner updates -> all_gather
  ddp+distmuon - a DDP-style all_reduce of all gradients, then DistMuonAdamW(grad_sync="averaged")
  replicated   - a DDP-style all_reduce, then torch.optim.Muon + AdamW on every rank (all Newton-Schulz work)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow `python scripts/bench_optim.py` from a checkout
    sys.path.insert(0, str(REPO))

from distlab.distributed import all_reduce_sum, comm_stats  # noqa: E402
from distlab.dtypes import dtype_name  # noqa: E402
from distlab.models.gpt import GPT, GPTConfig  # noqa: E402
from distlab.optim import DistMuonAdamW, split_params  # noqa: E402
from distlab.testing import TINY_GPT, run_distributed  # noqa: E402

DEMO = dict(depth=4, sequence_len=128)
BATCH = 16
MUON_LR, ADAMW_LR = 0.02, 0.005


def _groups(model: GPT) -> tuple[list, list]:
    roles = split_params(model)
    return [p for _, p in roles["muon"]], [p for r in ("embedding", "head", "adamw") for _, p in roles[r]]


def _ring_allreduce_bytes(n_params: int, world: int, elem: int = 4) -> float:
    return 2 * (world - 1) / world * n_params * elem


def _state_bytes(*optimizers: torch.optim.Optimizer) -> int:
    return sum(
        t.numel() * t.element_size()
        for opt in optimizers
        for st in opt.state.values()
        for t in st.values()
        if isinstance(t, torch.Tensor) and t.ndim > 0
    )


def _all_reduce_grads(params: list[torch.Tensor], world: int) -> None:
    """What DDP does in backward: average every gradient (one flat bucket)."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    all_reduce_sum(flat).div_(world)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p))
        offset += n


def job_comm(
    rank: int, world: int, steps: int, ns_dtype: torch.dtype = torch.float32, tiny: bool = False
) -> dict:
    torch.manual_seed(0)
    cfg = GPTConfig(**DEMO)  # the demo model in tiny mode too: its bytes are what the table compares
    batch = 2 if tiny else BATCH
    models = {name: GPT(cfg) for name in ("distlab", "ddp+distmuon", "replicated")}
    for m in models.values():
        m.load_state_dict(models["distlab"].state_dict())
    # A 1-process group per rank: DistMuonAdamW then runs as world size 1 = every rank does all the
    # Newton-Schulz work (the replicated baseline), with the same math and ``ns_dtype`` as the sharded variants.
    # (torch.optim.Muon hard-codes bf16 Newton-Schulz, many times slower on a CPU without native bf16: it would
    # flatter us there.)
    solo = [dist.new_group([r]) for r in range(world)][rank]
    opts: dict[str, DistMuonAdamW] = {}
    for name, m in models.items():
        mats, rest = _groups(m)
        groups = [
            {"params": mats, "kind": "muon", "lr": MUON_LR, "weight_decay": 0.0},
            {"params": rest, "kind": "adamw", "lr": ADAMW_LR, "weight_decay": 0.0},
        ]
        mode = "reduce" if name == "distlab" else "averaged"
        group = solo if name == "replicated" else None
        opts[name] = DistMuonAdamW(groups, grad_sync=mode, process_group=group, ns_dtype=ns_dtype)
    gen = torch.Generator().manual_seed(1000 + rank)
    times: dict[str, list[float]] = {n: [] for n in models}
    comm: dict[str, list[float]] = {n: [] for n in models}
    comm_s: dict[str, list[float]] = {n: [] for n in models}  # seconds blocked in collectives
    for step in range(steps + 2):
        x = torch.randint(0, 257, (batch, cfg.sequence_len), generator=gen)
        for name, m in models.items():  # alternate variants every step so drift hits all equally
            loss = m(x, targets=x)
            loss.backward()
            dist.barrier()
            comm_stats.reset()
            t0 = time.perf_counter()
            if name != "distlab":
                _all_reduce_grads(list(m.parameters()), world)
            opts[name].step()
            elapsed = time.perf_counter() - t0
            if step >= 2:  # skip warm-up (state allocation, first-step checks)
                times[name].append(elapsed)
                comm[name].append(comm_stats.bytes)
                comm_s[name].append(comm_stats.seconds)
            opts[name].zero_grad(set_to_none=True)
    n_params = sum(p.numel() for p in models["distlab"].parameters())
    return {
        "n_params": n_params,
        "time": {n: statistics.median(t) for n, t in times.items()},
        "times": times,
        "comm_time": {n: statistics.median(t) for n, t in comm_s.items()},
        "bytes": {n: statistics.mean(b) for n, b in comm.items()},
        "state": {n: _state_bytes(o) for n, o in opts.items()},
        "params_equal": all(
            torch.allclose(a, b, rtol=1e-3, atol=1e-3)
            for a, b in zip(models["distlab"].parameters(), models["ddp+distmuon"].parameters(), strict=True)
        ),
    }


def bench_comm(
    world: int = 2, steps: int = 24, ns_dtype: torch.dtype = torch.float32, tiny: bool = False
) -> dict:
    res = run_distributed(job_comm, world, steps, ns_dtype, tiny, timeout=600)[0]
    ring = _ring_allreduce_bytes(res["n_params"], world)
    replicated_state = res["state"]["replicated"]
    return {
        "world": world,
        "ns_dtype": dtype_name(ns_dtype),
        "n_params": res["n_params"],
        "bytes_per_step": res["bytes"],
        "bytes_ratio_vs_ring_allreduce": {n: b / ring for n, b in res["bytes"].items()},
        "state_bytes_per_rank": res["state"],
        "state_ratio_x_world_vs_replicated": {
            n: s * world / replicated_state for n, s in res["state"].items() if n != "replicated"
        },
        "step_time_s": res["time"],
        # Paired: the variants run back to back within each step, so the per-step ratio cancels host drift.
        "step_time_ratio_vs_replicated": {
            n: statistics.median(a / b for a, b in zip(t, res["times"]["replicated"], strict=True))
            for n, t in res["times"].items()
        },
        # The floor: the ratio if every collective were free (each variant's step less its blocking comm time).
        "comm_time_s": res["comm_time"],
        "step_time_ratio_if_comm_were_free": (res["time"]["distlab"] - res["comm_time"]["distlab"])
        / (res["time"]["replicated"] - res["comm_time"]["replicated"]),
        "timed_steps": steps,
        "distlab_equals_ddp_distmuon": res["params_equal"],
    }


# ---- sample efficiency: steps for Muon+AdamW to reach AdamW's final validation loss ----------------


TINY_CURVE = dict(model=TINY_GPT, seq=TINY_GPT["sequence_len"], batch=2, windows=8)


def _train_curve(
    optimizer: str,
    steps: int,
    eval_every: int,
    matrix_lr: float | None,
    model: dict | None = None,
    seq: int = 128,
    batch: int = BATCH,
    windows: int = 128,
) -> list[tuple[int, float]]:
    import lightning as L

    from distlab.data import TextDataModule
    from distlab.modules import GPTLightningModule

    class ValCurve(L.Callback):
        def __init__(self) -> None:
            self.points: list[tuple[int, float]] = []

        def on_validation_end(self, trainer, pl_module) -> None:
            self.points.append((trainer.global_step, float(trainer.callback_metrics["val_loss"])))

    L.seed_everything(1337, verbose=False)
    curve = ValCurve()
    module = GPTLightningModule(**(model or DEMO), optimizer=optimizer, matrix_lr=matrix_lr, warmup_steps=10)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        val_check_interval=eval_every,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[curve],
    )
    trainer.fit(module, TextDataModule(seq_len=seq, batch_size=batch, max_val_windows=windows))
    return curve.points


def _first_step_reaching(curve: list[tuple[int, float]], target: float) -> float:
    """Linear interpolation between evaluations of the first step whose val loss <= target."""
    prev = (0, math.inf)
    for step, loss in curve:
        if loss <= target:
            if prev[1] == math.inf:
                return float(step)
            return prev[0] + (prev[1] - target) / (prev[1] - loss) * (step - prev[0])
        prev = (step, loss)
    return math.inf


def bench_steps(steps: int = 500, eval_every: int = 25, sweep: str = "none", tiny: bool = False) -> dict:
    """sweep: "none" (module defaults), "adamw" (tune only the baseline: the conservative comparison), "both".
    tiny: a depth-1 model on short windows (checks the code path; the numbers mean nothing)."""
    lrs: dict[str, list[float | None]] = {"adamw": [None], "muon": [None]}
    if sweep in ("adamw", "both"):  # hidden-matrix learning rate; None = the module default (0.004 / 0.02)
        lrs["adamw"] = [0.002, None, 0.008]
    if sweep == "both":
        lrs["muon"] = [0.01, None, 0.04]
    best = {}
    for opt, candidates in lrs.items():
        runs = {
            lr: _train_curve(opt, steps, eval_every, lr, **(TINY_CURVE if tiny else {})) for lr in candidates
        }
        lr, curve = min(runs.items(), key=lambda kv: kv[1][-1][1])
        best[opt] = {"matrix_lr": lr, "curve": curve, "sweep": {str(k): v[-1][1] for k, v in runs.items()}}
    target = best["adamw"]["curve"][-1][1]
    muon_steps = _first_step_reaching(best["muon"]["curve"], target)
    return {
        "budget_steps": steps,
        "adamw_final_val_loss": target,
        "muon_final_val_loss": best["muon"]["curve"][-1][1],
        "muon_steps_to_adamw_final": muon_steps,
        "steps_ratio": muon_steps / steps,
        "runs": best,
    }


def bench_budgets(
    budget: int = 500,
    adamw_lrs: tuple[float, ...] = (0.00025, 0.0005, 0.001, 0.002, 0.004),
    muon_budgets: tuple[int, ...] = (150, 200, 250, 300),
    muon_lrs: tuple[float, ...] = (0.02,),
    muon_tune_at: int = 250,
) -> dict:
    """The literature's way: every run has its own full schedule (warmup, warmdown to its own end).

    AdamW's hidden-matrix lr is tuned at ``budget``; its best final val loss is the target. Muon's lr is tuned at
    ``muon_tune_at``, then Muon runs at each of ``muon_budgets`` with that lr. The ratio is the smallest Muon
    budget reaching the target (linear between measured budgets) over ``budget``.
    """
    final = lambda opt, steps, lr: _train_curve(opt, steps, steps, lr)[-1][1]  # noqa: E731
    adamw = {lr: final("adamw", budget, lr) for lr in adamw_lrs}
    adamw_lr = min(adamw, key=adamw.get)
    target = adamw[adamw_lr]
    muon_sweep = {lr: final("muon", muon_tune_at, lr) for lr in muon_lrs}
    muon_lr = min(muon_sweep, key=muon_sweep.get)
    muon = {n: muon_sweep[muon_lr] if n == muon_tune_at else final("muon", n, muon_lr) for n in muon_budgets}
    reach = math.inf
    prev = None
    for n in sorted(muon):
        if muon[n] <= target:
            if prev is None:
                reach = float(n)
            else:  # linear between the last budget above the target and the first at or below it
                reach = prev[0] + (prev[1] - target) / (prev[1] - muon[n]) * (n - prev[0])
            break
        prev = (n, muon[n])
    return {
        "budget_steps": budget,
        "adamw_sweep": {str(k): v for k, v in adamw.items()},
        "adamw_best_matrix_lr": adamw_lr,
        "target_val_loss": target,
        "muon_sweep_at": muon_tune_at,
        "muon_sweep": {str(k): v for k, v in muon_sweep.items()},
        "muon_best_matrix_lr": muon_lr,
        "muon_final_by_budget": {str(k): v for k, v in muon.items()},
        "muon_steps_to_target": reach,
        "steps_ratio": reach / budget,
    }


def print_table(comm: dict | None, steps: dict | None) -> None:
    rows = []
    if comm:
        r = comm["bytes_ratio_vs_ring_allreduce"]
        rows.append(
            (
                "logical comm bytes/step/rank / ring all-reduce of grads",
                f"{r['distlab']:.3f}",
                "<= 1.02",
                f"ddp+distmuon {r['ddp+distmuon']:.3f}, replicated {r['replicated']:.3f}",
            )
        )
        s = comm["state_ratio_x_world_vs_replicated"]
        rows.append(("optimizer state bytes/rank x N / replicated", f"{s['distlab']:.3f}", "<= 1.05", ""))
        t = comm["step_time_ratio_vs_replicated"]
        rows.append(
            (
                "sync+step time, N=2 / every-rank-all-NS Muon",
                f"{t['distlab']:.3f}",
                "<= 0.6",
                f"ddp+distmuon {t['ddp+distmuon']:.3f}",
            )
        )
    if steps:
        rows.append(
            (
                "steps to AdamW's final val loss / AdamW steps",
                f"{steps['steps_ratio']:.3f}",
                "<= 0.65",
                f"AdamW {steps['adamw_final_val_loss']:.3f} vs Muon {steps['muon_final_val_loss']:.3f} nats "
                f"after {steps['budget_steps']} steps",
            )
        )
    width = max(len(r[0]) for r in rows)
    print(f"| {'metric'.ljust(width)} | measured | target | side by side |")
    print(f"|{'-' * (width + 2)}|----------|--------|--------------|")
    for name, value, target, note in rows:
        print(f"| {name.ljust(width)} | {value:>8} | {target:>6} | {note} |")


# ---- the optimizer's own cost per tensor, one process ----------------------------------------------------------
SMALL = dict(muon=(96, (16, 16)), adamw=(98, (16,)))  # many small tensors: where per-tensor overhead shows


def _batched_reference(muon: list, adamw: list, ns_dtype: torch.dtype):
    """The same math as DistMuonAdamW on one process, in plain torch and batched (no distlab): Muon's momentum and
    apply as foreach ops, one Newton-Schulz chain per stack of same-shape matrices (torch.baddbmm), and
    torch.optim.AdamW(foreach=True). Returns a step function."""
    bufs = [torch.zeros_like(p) for p in muon]
    adam = torch.optim.AdamW(adamw, lr=ADAMW_LR, weight_decay=0.0, foreach=True) if adamw else None
    a, b, c = (3.4445, -4.7750, 2.0315)
    by_shape: dict[tuple, list[int]] = {}
    for i, p in enumerate(muon):
        by_shape.setdefault(tuple(p.shape), []).append(i)

    @torch.no_grad()
    def step() -> None:
        grads = [p.grad for p in muon]
        torch._foreach_lerp_(bufs, grads, 0.05)
        updates = torch._foreach_lerp(grads, bufs, 0.95)  # Nesterov
        for shape, idx in by_shape.items():
            X = torch.stack([updates[i] for i in idx]).to(ns_dtype)  # (B, m, n)
            tall = shape[0] > shape[1]
            X = X.mT if tall else X
            X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=1e-7)
            for _ in range(5):
                A = X @ X.mT
                X = torch.baddbmm(X, torch.baddbmm(A, A, A, beta=b, alpha=c), X, beta=a)
            X = X.mT if tall else X
            scale = MUON_LR * max(1, shape[0] / shape[1]) ** 0.5
            torch._foreach_add_(
                [muon[i] for i in idx], list(X.to(muon[idx[0]].dtype).unbind(0)), alpha=-scale
            )
        if adam is not None:
            adam.step()

    return step


def _time_interleaved(steps: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each step function, run alternately so that drift hits all equally."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(repeats + 2):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            if r >= 2:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def bench_overhead(repeats: int = 30, ns_dtype: torch.dtype = torch.float32) -> dict:
    """One process: DistMuonAdamW's step ÷ the batched plain-torch reference, on many small tensors (96 16x16 Muon
    matrices, 98 16-element AdamW tensors) and on the demo GPT's parameters (real sizes), with the CPU default
    (Newton-Schulz one matrix at a time, bit-equal to torch) and with ``batch_ns=True`` (CUDA's default)."""
    torch.manual_seed(0)
    out = {}
    model = GPT(GPTConfig(**DEMO))
    mats, rest = _groups(model)
    cases = {
        "small tensors": (
            [torch.randn(*SMALL["muon"][1], requires_grad=True) for _ in range(SMALL["muon"][0])],
            [torch.randn(*SMALL["adamw"][1], requires_grad=True) for _ in range(SMALL["adamw"][0])],
        ),
        "demo GPT": (mats, rest),
    }
    variants = {  # batch_ns: one batched chain per bucket (CUDA's default); None on CPU: one matrix at a time
        f"{case}{suffix}": (case, batch)
        for case in cases
        for suffix, batch in (("", None), (", batch_ns", True))
    }
    for name, (case, batch_ns) in variants.items():
        muon, adamw = cases[case]
        ours = [t.detach().clone().requires_grad_() for t in (*muon, *adamw)]
        theirs = [t.detach().clone().requires_grad_() for t in (*muon, *adamw)]
        for a, b in zip(ours, theirs, strict=True):
            a.grad = torch.randn_like(a) * 1e-2
            b.grad = a.grad.clone()
        n = len(muon)
        opt = DistMuonAdamW(
            [
                {"params": ours[:n], "kind": "muon", "lr": MUON_LR, "weight_decay": 0.0},
                {"params": ours[n:], "kind": "adamw", "lr": ADAMW_LR, "weight_decay": 0.0},
            ],
            ns_dtype=ns_dtype,
            batch_ns=batch_ns,
        )
        median = _time_interleaved(
            {"distlab": opt.step, "reference": _batched_reference(theirs[:n], theirs[n:], ns_dtype)}, repeats
        )
        out[name] = {
            "tensors": len(ours),
            "distlab_ms": median["distlab"] * 1e3,
            "reference_ms": median["reference"] * 1e3,
            "ratio": median["distlab"] / median["reference"],
            "max_difference": max(
                float((a - b).detach().abs().max()) for a, b in zip(ours, theirs, strict=True)
            ),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=["all", "comm", "overhead", "steps", "budgets"], default="all")
    parser.add_argument(
        "--steps", type=int, default=500, help="training budget for the sample-efficiency part"
    )
    parser.add_argument(
        "--timed-steps", type=int, default=24, help="optimizer steps timed per variant in the comm part"
    )
    parser.add_argument(
        "--sweep",
        choices=["none", "adamw", "both"],
        default="none",
        help="tune the hidden-matrix lr of AdamW only, or of both optimizers (3 runs each)",
    )
    floats = lambda text: tuple(float(x) for x in text.split(","))  # noqa: E731
    ints = lambda text: tuple(int(x) for x in text.split(","))  # noqa: E731
    # budgets part: the README's run (AdamW tuned over 5 lrs; Muon at its default lr, 4 budgets; ~20 min)
    parser.add_argument("--adamw-lrs", type=floats, default=(0.00025, 0.0005, 0.001, 0.002, 0.004))
    parser.add_argument("--muon-lrs", type=floats, default=(0.02,), help="e.g. 0.01,0.02,0.04 tunes Muon too")
    parser.add_argument("--muon-budgets", type=ints, default=(150, 200, 250, 300))
    parser.add_argument("--muon-tune-at", type=int, default=250, help="the budget Muon's lr is tuned at")
    parser.add_argument("--json", default="runs/bench_optim.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    if args.part == "overhead":
        print(json.dumps(bench_overhead(), indent=2))
        return 0
    comm = bench_comm(steps=args.timed_steps) if args.part in ("all", "comm") else None
    steps = bench_steps(args.steps, sweep=args.sweep) if args.part in ("all", "steps") else None
    if args.part == "budgets":
        budgets = bench_budgets(
            args.steps, args.adamw_lrs, args.muon_budgets, args.muon_lrs, args.muon_tune_at
        )
        print(json.dumps(budgets, indent=2))
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"budgets": budgets}, indent=2))
        print(f"wrote {out}")
        return 0
    print_table(comm, steps)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"comm": comm, "steps": steps}, indent=2, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
