"""Rank jobs for test_dist_optim and test_checkpoint (run on every rank by tests.helpers.dist.run_distributed)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers.optim_cases import init_params, run_dist_case

STEPS = range(10)
CASES = {
    "muon": {"kind": "muon"},
    "muon_avg": {"kind": "muon", "grad_sync": "averaged"},
    "muon_fp32": {"kind": "muon", "ns_dtype": "float32"},
    "muon_polar": {"kind": "muon", "ns_dtype": "float32", "polar": True},  # one quintic per iteration
    # NorMuon's row normalisation: the paper's step size (match_rms_adamw), and sized like Muon's own (original)
    "muon_normuon": {
        "kind": "muon",
        "ns_dtype": "float32",
        "normuon": 0.9,
        "adjust_lr_fn": "match_rms_adamw",
    },
    "muon_normuon_original": {"kind": "muon", "ns_dtype": "float32", "normuon": 0.9},
    # batched Newton-Schulz (one chain per bucket of same-shape matrices): torch's math within a stated tolerance
    "muon_batched": {"kind": "muon", "batch_ns": True},
    "muon_fp32_batched": {"kind": "muon", "ns_dtype": "float32", "batch_ns": True},
    "mixed_batched": {"kind": "mixed", "batch_ns": True, "coalesce": False},
    "adamw": {"kind": "adamw"},
    "adamw_avg": {"kind": "adamw", "grad_sync": "averaged"},
    "mixed_sched": {"kind": "mixed", "sched": True},
    "clip": {"kind": "mixed", "huge": True, "clip": True},
    "nones": {"kind": "mixed", "nones": True},
    # gloo coalesces by default (one reduce_scatter + one all_gather per step); keep the per-piece path honest
    "mixed": {"kind": "mixed"},
    "mixed_pieces": {"kind": "mixed", "coalesce": False},
    "mixed_runs": {"kind": "mixed", "run_elements": 1},  # the coalesced reduce_scatter in several runs
    "nones_pieces": {"kind": "mixed", "nones": True, "coalesce": False},
    # Muon and Adam are nearly blind to a uniform gradient scale (sum instead of mean): look at the gradient
    "norm": {"kind": "mixed", "probe_norm": True},
    "norm_pieces": {"kind": "mixed", "probe_norm": True, "coalesce": False},
    "norm_avg": {"kind": "mixed", "probe_norm": True, "grad_sync": "averaged"},
}
SAVE_SPEC = {"kind": "mixed"}
SAVE_STEPS, RESUME_STEPS = range(5), range(5, 8)


def job_all_cases(rank: int, world: int) -> dict:
    out = {}
    for name, spec in CASES.items():
        res = run_dist_case(spec, rank, world, STEPS)
        out[name] = {k: res[k] for k in ("snaps", "comm", "norms")}
        dtype = res["opt"].flops_dtype  # a Muon update travels in Newton-Schulz's dtype
        out[name]["update_itemsize"] = torch.empty(0, dtype=dtype).element_size() if dtype else 4
    return out


def job_save(rank: int, world: int, path: str, spec: dict | None = None) -> dict:
    res = run_dist_case(spec or SAVE_SPEC, rank, world, SAVE_STEPS)
    opt = res["opt"]
    with pytest.raises(RuntimeError, match="consolidate_state_dict"):
        opt.state_dict()
    opt.consolidate_state_dict()
    if rank == 0:
        torch.save(opt.state_dict(), os.path.join(path, "opt.pt"))
        torch.save([p.detach() for p in res["params"]], os.path.join(path, "params.pt"))
    else:
        with pytest.raises(RuntimeError, match="rank 0"):
            opt.state_dict()
    # sharded: each rank only holds what it owns
    n_muon_state = sum(1 for p in res["params"][:8] if opt.state.get(p))
    return {"snaps": res["snaps"], "n_muon_state": n_muon_state}


def job_resume(rank: int, world: int, path: str, spec: dict | None = None) -> dict:
    state = torch.load(os.path.join(path, "opt.pt"), weights_only=True)
    params = torch.load(os.path.join(path, "params.pt"), weights_only=True)
    res = run_dist_case(spec or SAVE_SPEC, rank, world, RESUME_STEPS, params=params, state=state)
    return {"snaps": res["snaps"]}


__all__ = ["CASES", "STEPS", "init_params", "job_all_cases", "job_resume", "job_save"]
