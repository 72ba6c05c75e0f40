"""Rank jobs for test_fsdp2_optim (run on every gloo rank by tests.helpers.dist.run_distributed).

- exact: DistMuonAdamW(grad_sync="sharded") on DTensor params fed the exact averaged gradients of
  tests/helpers/optim_cases.py (integers / 64) -> compared bit-for-bit with torch.optim.Muon + AdamW.
- gpt: a GPT sharded by apply_fsdp2 trained for STEPS steps on rank r's rows of a global batch ->
  compared with single-process DistMuonAdamW (fp32 tolerance; FSDP2's reduce-scatter sums in another order).
- guard: torch.optim.Muon stepped on FSDP2's local shards (Newton-Schulz per shard) vs on full matrices.
- save / resume: torch.distributed.checkpoint at step SAVE_AT on one world size, resumed on another.
"""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from distlab.distributed import comm_stats
from distlab.models.gpt import GPT, GPTConfig
from distlab.optim import DistMuonAdamW
from distlab.parallel import apply_fsdp2, full_state_dict
from tests.helpers import optim_cases as _cases
from tests.helpers.gpt_roles import gpt_roles
from tests.helpers.shards import local_shards

# ---- exact optimizer check on hand-made DTensor params ------------------------------------------------

EXACT_SPEC = {"kind": "mixed"}
# the 0-d AdamW param cannot be Shard(0); FSDP2 never produces one for the GPT either
EXACT_IDX = [j for j, s in enumerate(_cases.shapes(EXACT_SPEC)) if len(s) > 0]
N_MUON = len(_cases.MUON_SHAPES)
EXACT_STEPS = range(6)


def exact_groups(params: list) -> list[dict]:
    muon = [p for j, p in zip(EXACT_IDX, params, strict=True) if j < N_MUON]
    adamw = [p for j, p in zip(EXACT_IDX, params, strict=True) if j >= N_MUON]
    return [
        {"params": muon, "kind": "muon", "lr": _cases.MUON_LR},
        {"params": adamw, "kind": "adamw", "lr": _cases.ADAMW_LR},
    ]


NORMUON_BETA2 = 0.9


def exact_oracle(world: int, clip: bool, normuon: bool = False) -> list[list[torch.Tensor]]:
    """torch.optim.Muon + torch.optim.AdamW on one process, fed the averaged gradients (``normuon``: NorMuon from
    its paper, tests/helpers/optim_cases.ReferenceMuon, with fp32 Newton-Schulz)."""
    init = _cases.init_params(EXACT_SPEC)
    params = [init[j].clone().requires_grad_() for j in EXACT_IDX]
    groups = exact_groups(params)
    opts = [
        _cases.ReferenceMuon(groups[0]["params"], normuon_beta2=NORMUON_BETA2, lr=_cases.MUON_LR)
        if normuon
        else torch.optim.Muon(groups[0]["params"], lr=_cases.MUON_LR),
        torch.optim.AdamW(groups[1]["params"], lr=_cases.ADAMW_LR),
    ]
    snaps = []
    for s in EXACT_STEPS:
        grads = _cases.avg_grads(EXACT_SPEC, s, world)
        for p, j in zip(params, EXACT_IDX, strict=True):
            p.grad = grads[j] * (64 if clip else 1)
        if clip:
            torch.nn.utils.clip_grad_norm_(params, _cases.MAX_NORM)
        for o in opts:
            o.step()
        snaps.append([p.detach().clone() for p in params])
    return snaps


def run_exact(mesh, world: int, clip: bool, normuon: bool = False) -> list[list[torch.Tensor]]:
    """``normuon``: NorMuon, and at step 3 its state goes through state_dict() as full tensors into a new optimizer
    over new shards (each rank keeps its rows of the per-row moments)."""
    init = _cases.init_params(EXACT_SPEC)

    def build(values):
        params = [
            torch.nn.Parameter(distribute_tensor(v, mesh, [Shard(0)], src_data_rank=None)) for v in values
        ]
        groups = exact_groups(params)
        if normuon:
            groups[0]["normuon_beta2"] = NORMUON_BETA2
        opt = DistMuonAdamW(
            groups,
            grad_sync="sharded",
            ns_dtype="float32" if normuon else "bfloat16",
            max_grad_norm=_cases.MAX_NORM if clip else None,
        )
        return params, opt

    params, opt = build([init[j] for j in EXACT_IDX])
    snaps = []
    for s in EXACT_STEPS:
        if normuon and s == 3:
            sd = opt.state_dict()
            full = {i: {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in st.items()}
                    for i, st in sd["state"].items()}  # fmt: skip
            assert all(full[i]["normuon_v"].shape == (params[i].shape[0], 1) for i in range(N_MUON))
            params, opt = build([p.detach().full_tensor() for p in params])
            opt.load_state_dict({"state": full, "param_groups": sd["param_groups"]})
        grads = _cases.avg_grads(EXACT_SPEC, s, world)
        for p, j in zip(params, EXACT_IDX, strict=True):
            p.grad = distribute_tensor(grads[j] * (64 if clip else 1), mesh, [Shard(0)], src_data_rank=None)
        opt.step()
        snaps.append([p.detach().full_tensor() for p in params])
    return snaps


# ---- GPT under FSDP2 -----------------------------------------------------------------------------------

CFG = dict(depth=2, aspect_ratio=32, head_dim=16, sequence_len=16)  # n_embd 64: 64 and 257 rows, uneven for 3
GLOBAL_BATCH, STEPS, SAVE_AT = 6, 10, 5


def make_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**CFG))


def gpt_groups(model: GPT) -> list[dict]:
    """The LightningModule's groups (muon matrices, AdamW embedding/head), with weight decay on."""
    g = gpt_roles(model)
    adamw = dict(kind="adamw", betas=(0.8, 0.95), eps=1e-8, weight_decay=0.01)
    return [
        dict(adamw, params=g["embedding"], lr=0.1),
        dict(adamw, params=g["head"], lr=0.004),
        dict(kind="muon", params=g["matrix"], lr=0.02, momentum=0.95, weight_decay=0.01),
    ]


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 + step)
    seq = torch.randint(0, 257, (GLOBAL_BATCH, CFG["sequence_len"] + 1), generator=g)
    return seq[:, :-1], seq[:, 1:]


def gpt_oracle(steps: range = range(STEPS)) -> dict:
    """Single-process DistMuonAdamW (== torch Muon/AdamW, tests/optim) on the whole global batch."""
    model = make_gpt()
    opt = DistMuonAdamW(gpt_groups(model), max_grad_norm=1.0, ns_dtype="float32")
    losses = []
    for s in steps:
        x, y = batch(s)
        loss = model(x, targets=y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "state": {k: v.clone() for k, v in model.state_dict().items()}}


def sharded_gpt(mesh):
    model = apply_fsdp2(make_gpt(), mesh)
    opt = DistMuonAdamW(gpt_groups(model), grad_sync="sharded", max_grad_norm=1.0, ns_dtype="float32")
    return model, opt


def train(model, opt, rank: int, world: int, steps: range) -> list[float]:
    B = GLOBAL_BATCH // world
    losses = []
    for s in steps:
        x, y = batch(s)
        loss = model(x[rank * B : (rank + 1) * B], targets=y[rank * B : (rank + 1) * B])
        loss.backward()
        opt.step()
        opt.zero_grad()
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item() / world)  # equal rank batches: mean of rank means = global mean
    return losses


def state_bytes(opt) -> int:
    return sum(
        v.to_local().nbytes for st in opt.state.values() for v in st.values() if hasattr(v, "to_local")
    )


def guard(mesh, rank: int, world: int) -> dict:
    """One Muon step from the same FSDP2 gradients: on whole matrices vs naively on each rank's shard.

    Two training steps first: at init the zeroed output projections give c_q/c_k/c_v zero gradients.
    """
    model, opt = sharded_gpt(mesh)
    train(model, opt, rank, world, range(2))
    x, y = batch(2)
    B = GLOBAL_BATCH // world
    model(x[rank * B : (rank + 1) * B], targets=y[rank * B : (rank + 1) * B]).backward()
    mats = gpt_roles(model)["matrix"]
    before = [p.detach().full_tensor() for p in mats]
    full = [torch.nn.Parameter(b.clone()) for b in before]
    for f, p in zip(full, mats, strict=True):
        f.grad = p.grad.full_tensor()
    shards = [torch.nn.Parameter(p.detach().to_local().clone()) for p in mats]
    for s, p in zip(shards, mats, strict=True):
        s.grad = p.grad.to_local().clone()
    torch.optim.Muon(full, lr=0.02).step()
    torch.optim.Muon(shards, lr=0.02).step()  # what "just use torch.optim.Muon on the local shards" does
    ours = DistMuonAdamW(
        [{"params": mats, "kind": "muon", "lr": 0.02}], grad_sync="sharded", ns_dtype="bfloat16"
    )
    ours.step()
    naive = []
    for s, p in zip(shards, mats, strict=True):
        padded = torch.zeros(-(-p.shape[0] // world), p.shape[1])
        padded[: s.shape[0]] = s.detach()
        parts = [torch.zeros_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        naive.append(torch.cat(parts)[: p.shape[0]])
    return {
        "before": before,
        "full": [f.detach() for f in full],
        "naive": naive,
        "ours": [p.detach().full_tensor() for p in mats],
    }


def job_world(rank: int, world: int, ckpt_dir: str, resume_from: str | None) -> dict:
    mesh = init_device_mesh("cpu", (world,))
    out: dict = {"exact": run_exact(mesh, world, clip=False), "exact_clip": run_exact(mesh, world, clip=True)}
    out["exact_normuon"] = run_exact(mesh, world, clip=False, normuon=True)

    model, opt = sharded_gpt(mesh)
    comm_stats.reset()
    out["losses"] = train(model, opt, rank, world, range(SAVE_AT))
    out["bytes_per_step"] = copy.deepcopy(comm_stats.by_op)
    out["ns_flops"] = opt.flops  # this rank's Newton-Schulz work: the matrices it owns
    out["local_param_bytes"] = sum(p.to_local().nbytes for p in model.parameters())
    out["local_state_bytes"] = state_bytes(opt)
    dcp.save(
        {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
        checkpoint_id=os.path.join(ckpt_dir, f"world{world}"),
    )
    out["losses"] += train(model, opt, rank, world, range(SAVE_AT, STEPS))
    out["state"] = full_state_dict(model)
    out["shards"] = local_shards(model.state_dict())  # this rank's own rows, not a gather

    if resume_from is not None:  # a fresh model + optimizer on this world size, loaded from another one's DCP
        model, opt = sharded_gpt(mesh)
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
        dcp.load(state, checkpoint_id=resume_from)
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, opt, state["optim"])
        out["resumed_losses"] = train(model, opt, rank, world, range(SAVE_AT, STEPS))
        out["resumed_state"] = full_state_dict(model)

    out["guard"] = guard(mesh, rank, world)
    return out
