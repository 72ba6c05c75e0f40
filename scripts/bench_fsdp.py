"""Per-rank memory and communication of FSDP2 + DistMuonAdamW(sharded) vs the DDP / ZeRO-1 path.

    python scripts/bench_fsdp.py                          # N=2 gloo ranks on CPU, depth-4 GPT (~30 s)
    python scripts/bench_fsdp.py --world 3 --depth 2 --json runs/bench_fsdp.json

Per rank, after one training step:
  param bytes  - FSDP2 keeps a 1/N shard of every parameter (target ~1/N); ZeRO-1 keeps full replicas.
  state bytes  - optimizer state: FSDP2 shards it like the params; ZeRO-1 shards it by ownership.
  comm / step  - logical bytes per rank, as NCCL's ring algorithms would move them (distlab.distributed.collectives):
                 ZeRO-1 (ddp_optimizer_sync): reduce_scatter grads + all_gather params, measured.
                 FSDP2: its own all_gathers (forward, and backward for resharded blocks) + reduce_scatter
                 of the grads, computed from the shard sizes (FSDP2 does not go through our counters),
                 plus what DistMuonAdamW adds on top, measured: Muon's all_to_all (each full update to
                 its owner and the orthogonalised shards back) and two tiny all_reduces. Sent per rank:
                 2 * (N-1)/N^2 * P_muon, i.e. dion's ~2 * P / N anchor for large N (0.5 * P_muon at N=2,
                 where half of each rank's data stays local).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow `python scripts/bench_fsdp.py` from a checkout
    sys.path.insert(0, str(REPO))

from distlab.distributed import comm_stats  # noqa: E402
from distlab.models.gpt import GPT, GPTConfig  # noqa: E402
from distlab.optim import DistMuonAdamW, split_params  # noqa: E402
from distlab.testing import run_distributed  # noqa: E402


def _matrices(model: GPT) -> list:
    return [p for _, p in split_params(model)["muon"]]


def _groups(model: GPT) -> list[dict]:
    roles = split_params(model)
    return [
        {
            "params": [p for r in ("embedding", "head", "adamw") for _, p in roles[r]],
            "kind": "adamw",
            "lr": 1e-3,
        },
        {"params": _matrices(model), "kind": "muon", "lr": 0.02},
    ]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(
        _local(v).nbytes for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)
    )


def _step(model: GPT, opt, cfg: GPTConfig, rank: int, batch: int) -> None:
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.sequence_len + 1), generator=g)
    model(x[:, :-1], targets=x[:, 1:]).backward()
    opt.step()
    opt.zero_grad()


def job(rank: int, world: int, depth: int, seq: int, batch: int, folder: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from distlab.parallel import apply_fsdp2

    cfg = GPTConfig(depth=depth, sequence_len=seq)
    out = {}

    torch.manual_seed(0)  # ZeRO-1: replicated params, DistMuonAdamW reduces the grads itself
    model = GPT(cfg)
    opt = DistMuonAdamW(_groups(model), grad_sync="reduce", ns_dtype="float32")
    _step(model, opt, cfg, rank, batch)  # state exists after the first step
    comm_stats.reset()
    _step(model, opt, cfg, rank, batch)
    out["zero1"] = {
        "param_bytes": sum(p.nbytes for p in model.parameters()),
        "state_bytes": _state_bytes(opt),
        "comm_by_op": dict(comm_stats.by_op),
        "comm_bytes": comm_stats.bytes,
    }

    torch.manual_seed(0)  # FSDP2 + DistMuonAdamW(sharded)
    model = apply_fsdp2(GPT(cfg), init_device_mesh("cpu", (world,)))
    opt = DistMuonAdamW(_groups(model), grad_sync="sharded", ns_dtype="float32")
    _step(model, opt, cfg, rank, batch)
    comm_stats.reset()
    _step(model, opt, cfg, rank, batch)
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    block_bytes = sum(p.numel() * p.element_size() for b in model.blocks for p in b.parameters())
    f = (world - 1) / world
    fsdp_own = {  # ring-logical bytes of FSDP2's own collectives, per rank
        "all_gather_forward": f * full_bytes,
        "all_gather_backward": f * block_bytes,  # blocks reshard after forward; the root stays gathered
        "reduce_scatter_grads": f * full_bytes,
    }
    muon_bytes = sum(p.numel() * p.element_size() for p in _matrices(model))
    out["fsdp2"] = {
        "param_bytes": sum(_local(p).nbytes for p in model.parameters()),
        "state_bytes": _state_bytes(opt),
        "fsdp2_comm_by_op": fsdp_own,
        "optimizer_comm_by_op": dict(comm_stats.by_op),
        "optimizer_comm_bytes": comm_stats.bytes,
        "comm_bytes": sum(fsdp_own.values()) + comm_stats.bytes,
    }
    out["full_param_bytes"] = full_bytes
    out["muon_param_bytes"] = muon_bytes
    out["async_save"] = _save_stall(model, opt, rank, folder)
    return out


def _save_stall(model: GPT, opt, rank: int, folder: str, repeats: int = 3) -> dict:
    """The training stall of one checkpoint of the FSDP2 model and optimizer: a synchronous DCP save (what Lightning
    does) against distlab's async save (the step waits for the staging copy only), medians of ``repeats``; and the
    async save's time until its folder is complete."""
    import statistics
    import time
    from pathlib import Path

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    from distlab.checkpoint.async_save import AsyncCheckpointWriter

    def state() -> dict:
        return {
            "state_dict": get_model_state_dict(model),
            "optimizer_0": get_optimizer_state_dict(model, opt),
        }

    writer, sync, stall, total = AsyncCheckpointWriter(), [], [], []
    writer.save(state(), {}, Path(folder) / "warm.ckpt", rank == 0)  # its process group is made once
    writer.wait()
    for i in range(repeats):
        sd = state()
        dist.barrier()
        t0 = time.perf_counter()
        dcp.save(sd, checkpoint_id=str(Path(folder) / f"sync{i}.ckpt"))
        sync.append(time.perf_counter() - t0)
        sd = state()
        dist.barrier()
        t0 = time.perf_counter()
        writer.save(sd, {}, Path(folder) / f"async{i}.ckpt", rank == 0)
        stall.append(time.perf_counter() - t0)
        writer.wait()
        total.append(time.perf_counter() - t0)
    sync_s, stall_s = statistics.median(sync), statistics.median(stall)
    return {"sync_stall_s": sync_s, "async_stall_s": stall_s, "async_complete_s": statistics.median(total),
            "stall_ratio": stall_s / sync_s}  # fmt: skip


# ---- FSDP2 vs HSDP at 4 ranks ("2 nodes x 2"): every collective's bytes by mesh dimension, measured ------------
def job_mesh_bytes(rank: int, world: int, shape: tuple[int, ...], depth: int, seq: int, batch: int) -> dict:
    """Train 2 steps of the GPT on ``shape`` (FSDP2's (world,) or HSDP's (R, S)); every torch.distributed collective
    of the second step, FSDP2's own and DistMuonAdamW's, counted per rank by the mesh dimension of its group."""
    from torch.distributed.device_mesh import init_device_mesh

    from distlab.distributed.mesh_traffic import MeshTraffic
    from distlab.parallel import apply_fsdp2
    from distlab.parallel.parallelize import hsdp_mesh

    mesh = init_device_mesh("cpu", shape) if len(shape) == 1 else hsdp_mesh("cpu", world, shape[0])
    cfg = GPTConfig(depth=depth, sequence_len=seq)
    torch.manual_seed(0)
    model = apply_fsdp2(GPT(cfg), mesh)
    opt = DistMuonAdamW(_groups(model), ns_dtype="float32")
    _step(model, opt, cfg, rank, batch)
    with MeshTraffic(mesh) as traffic:  # what SpeedMonitor reports as comm_mesh_<dim>_mb
        _step(model, opt, cfg, rank, batch)
    counted = traffic.bytes
    return {"by_dim": counted, "param_bytes": sum(_local(p).nbytes for p in model.parameters())}


def bench_mesh_bytes(depth: int = 4, seq: int = 64, batch: int = 2) -> dict:
    """Bytes per step per rank by mesh dimension, FSDP2 (1x4) vs HSDP (2x2), on 4 gloo ranks."""
    out = {}
    for label, shape in (("FSDP2 1x4", (4,)), ("HSDP 2x2", (2, 2))):
        res = run_distributed(job_mesh_bytes, 4, shape, depth, seq, batch, timeout=600)
        out[label] = res[0]
    return out


def mesh_table(m: dict) -> str:
    mib = 2**20
    lines = [
        "| 4 ranks ('2 nodes x 2') | shard dim (inside a node) MiB/step/rank | replicate dim (across nodes) | params MiB/rank |",
        "|---|---|---|---|",
    ]
    for label, r in m.items():
        d = r["by_dim"]
        lines.append(
            f"| {label} | {d.get('shard', 0) / mib:.2f} | {d.get('replicate', 0) / mib:.2f} | {r['param_bytes'] / mib:.2f} |"
        )
    return "\n".join(lines)


def bench(world: int = 2, depth: int = 4, seq: int = 64, batch: int = 2) -> dict:
    """Run the measurement on ``world`` gloo ranks; return the JSON-able summary (rank 0's numbers)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        res = run_distributed(job, world, depth, seq, batch, folder, timeout=600)
    r0 = res[0]
    P, Pm = r0["full_param_bytes"], r0["muon_param_bytes"]
    a2a = r0["fsdp2"]["optimizer_comm_by_op"].get("all_to_all", {}).get("bytes", 0.0)
    summary = {
        "world": world,
        "model": {"depth": depth, "params": P // 4, "muon_params": Pm // 4},
        "per_rank": {k: res[0][k] for k in ("zero1", "fsdp2")},
        "ratios": {
            "fsdp2_param_bytes_over_full": r0["fsdp2"]["param_bytes"] / P,
            "target": 1 / world,
            "fsdp2_state_over_zero1_state": r0["fsdp2"]["state_bytes"] / r0["zero1"]["state_bytes"],
            "muon_all_to_all_bytes": a2a,
            "muon_all_to_all_over_P_muon": a2a / Pm,
            "expected_2(N-1)/N^2": 2 * (world - 1) / world**2,
            "dion_anchor_large_N_2/N": 2 / world,
        },
        "async_save": r0["async_save"],
        "state_bytes_by_rank": {
            "zero1": [r["zero1"]["state_bytes"] for r in res],
            "fsdp2": [r["fsdp2"]["state_bytes"] for r in res],
        },
    }
    return summary


def table(s: dict) -> str:
    z, f, ratio = s["per_rank"]["zero1"], s["per_rank"]["fsdp2"], s["ratios"]
    mib = 2**20
    rows = [
        ("param bytes / rank", z["param_bytes"], f["param_bytes"]),
        ("optimizer state bytes / rank", z["state_bytes"], f["state_bytes"]),
        ("comm bytes / rank / step", z["comm_bytes"], f["comm_bytes"]),
        ("  of which Muon all_to_all", 0.0, ratio["muon_all_to_all_bytes"]),
    ]
    lines = [
        f"N={s['world']} ranks, GPT depth {s['model']['depth']}: {s['model']['params']:,} params "
        f"({s['model']['muon_params']:,} Muon)",
        f"{'per rank':<32}{'DDP/ZeRO-1':>14}{'FSDP2':>14}{'FSDP2/ZeRO-1':>14}",
    ]
    for name, a, b in rows:
        rel = f"{b / a:.3f}" if a else "-"
        lines.append(f"{name:<32}{a / mib:>11.3f}MiB{b / mib:>11.3f}MiB{rel:>14}")
    lines.append(
        f"FSDP2 params / full = {ratio['fsdp2_param_bytes_over_full']:.3f} (target 1/N = {ratio['target']:.3f}); "
        f"Muon all_to_all / P_muon = {ratio['muon_all_to_all_over_P_muon']:.3f} "
        f"(expected 2(N-1)/N^2 = {ratio['expected_2(N-1)/N^2']:.3f}, -> dion's 2/N for large N)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    summary = bench(args.world, args.depth, args.seq, args.batch)
    print(table(summary))
    print(json.dumps(summary, indent=1))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
