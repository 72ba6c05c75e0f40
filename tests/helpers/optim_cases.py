"""Shared, deterministic test cases: per-rank gradients, distributed runs and single-process torch oracles.

Gradients are integers / 64 (|g| <= 1, or * 1024 for the "huge" rank), so the sum over ranks is exact in fp32
in any order and "SUM then divide by W" gives the same averaged gradient on both sides. That makes the
distributed optimizer comparable to torch.optim.Muon / AdamW with torch.equal even for W = 3.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from distlab.distributed import comm_stats
from distlab.optim import POLAR_EXPRESS_COEFFICIENTS, DistAdamW, DistMuon, DistMuonAdamW
from distlab.optim.zero1_comm import Zero1Comm

# The Polar Express paper's 5 quintics (arXiv:2505.16932; num_iters=5, safety factor 2e-2, cushion 2), typed here
# from the paper's numbers: the oracle does not read distlab's constant.
POLAR_EXPRESS = [
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]
MUON_SHAPES = [(8, 4)] * 5 + [(4, 8)] * 2 + [(6, 6)]  # tall x5 (not divisible by 2 or 3), wide x2, square
ADAMW_SHAPES = [(), (7,), (3, 5), (4,)]  # scalar, 1-D with odd numel, 2-D, small
MUON_LR, ADAMW_LR, MAX_NORM = 0.02, 0.01, 1.0


def lr_lambda(step: int) -> float:
    return 1.0 / (1.0 + 0.5 * step)


def shapes(spec: dict[str, Any]) -> list[tuple[int, ...]]:
    return {"muon": MUON_SHAPES, "adamw": ADAMW_SHAPES, "mixed": MUON_SHAPES + ADAMW_SHAPES}[spec["kind"]]


def init_params(spec: dict[str, Any]) -> list[Tensor]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randn(s, generator=g) for s in shapes(spec)]


def rank_grads(spec: dict[str, Any], step: int, rank: int) -> list[Tensor | None]:
    """Gradients rank ``rank`` computes at ``step`` (None = this rank has no grad for that param)."""
    out: list[Tensor | None] = []
    for j, s in enumerate(shapes(spec)):
        g = torch.Generator().manual_seed(100_000 * step + 1000 * rank + j)
        grad = torch.randint(-64, 65, s, generator=g).float() / 64
        if spec.get("huge") and rank == 1:
            grad = grad * 1024
        if spec.get("nones"):
            if j == 1 and rank == 1:  # missing on one rank only -> counts as zeros
                grad = None
            if (
                j in (7, len(shapes(spec)) - 1) and step % 3 == 2
            ):  # missing on every rank -> skipped like torch
                grad = None
        out.append(grad)
    return out


def avg_grads(spec: dict[str, Any], step: int, world: int) -> list[Tensor | None]:
    per_rank = [rank_grads(spec, step, r) for r in range(world)]
    out: list[Tensor | None] = []
    for j in range(len(shapes(spec))):
        gs = [g[j] for g in per_rank if g[j] is not None]
        out.append(None if not gs else torch.stack(gs).sum(0) / world)
    return out


def make_dist_opt(spec: dict[str, Any], params: list[Tensor]) -> DistMuonAdamW:
    kw = dict(
        grad_sync=spec.get("grad_sync", "reduce"),
        # probe_norm: clipping that never clips (coefficient exactly 1) but reports the synced gradient's norm
        max_grad_norm=MAX_NORM if spec.get("clip") else (1e30 if spec.get("probe_norm") else None),
        coalesce=spec.get("coalesce"),
    )
    if spec["kind"] == "muon":
        polar = dict(ns_coefficients=POLAR_EXPRESS_COEFFICIENTS, ns_steps=5) if spec.get("polar") else {}
        if spec.get("normuon"):
            polar.update(normuon_beta2=spec["normuon"], adjust_lr_fn=spec.get("adjust_lr_fn"))
        return DistMuon(
            params,
            lr=MUON_LR,
            ns_dtype=spec.get("ns_dtype", "bfloat16"),
            batch_ns=spec.get("batch_ns"),
            **kw,
            **polar,
        )
    if spec["kind"] == "adamw":
        return DistAdamW(params, lr=ADAMW_LR, **kw)
    n = len(MUON_SHAPES)
    groups = [
        {"params": params[:n], "kind": "muon", "lr": MUON_LR},
        {"params": params[n:], "kind": "adamw", "lr": ADAMW_LR},
    ]
    return DistMuonAdamW(
        groups, ns_dtype=spec.get("ns_dtype", "bfloat16"), batch_ns=spec.get("batch_ns"), **kw
    )


def run_dist_case(
    spec: dict[str, Any], rank: int, world: int, steps: range, params: list[Tensor] | None = None, state=None
) -> dict[str, Any]:
    """Run the distributed optimizer on this rank; return per-step param snapshots, comm bytes, grad norms."""
    params = [
        p.detach().clone().requires_grad_() for p in (params if params is not None else init_params(spec))
    ]
    opt = make_dist_opt(spec, params)
    if state is not None:
        opt.load_state_dict(state)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda) if spec.get("sched") else None
    snaps, comm, norms = [], [], []
    # run_elements: split the coalesced reduce_scatter into runs even for these small params
    default_run = Zero1Comm.run_elements
    Zero1Comm.run_elements = spec.get("run_elements", default_run)
    for s in steps:
        if spec.get("grad_sync") == "averaged":
            grads = avg_grads(spec, s, world)
        else:
            grads = rank_grads(spec, s, rank)
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        comm_stats.reset()
        opt.step()
        comm.append(copy.deepcopy(comm_stats.by_op))
        if sched is not None:
            sched.step()
        snaps.append([p.detach().clone() for p in params])
        norms.append(opt.last_grad_norm)
    Zero1Comm.run_elements = default_run
    return {"snaps": snaps, "comm": comm, "norms": norms, "opt": opt, "params": params}


class Oracle:
    """torch.optim.Muon (+ torch.optim.AdamW) on one process, fed the averaged gradient (``ns_dtype`` "float32":
    :class:`ReferenceMuon`, torch's algorithm with fp32 Newton-Schulz)."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.params = [p.clone().requires_grad_() for p in init_params(spec)]
        n = len(MUON_SHAPES) if spec["kind"] != "adamw" else 0
        self.opts: list[torch.optim.Optimizer] = []
        if spec["kind"] in ("muon", "mixed"):
            if spec.get("polar"):  # torch.optim.Muon takes one triple for every iteration
                polar = dict(ns_coefficients=POLAR_EXPRESS, ns_steps=len(POLAR_EXPRESS))
                self.opts.append(ReferenceMuon(self.params[:n], ns_dtype=torch.float32, lr=MUON_LR, **polar))
            elif spec.get("normuon"):  # torch.optim.Muon has no NorMuon
                beta2 = spec["normuon"]
                fn = spec.get("adjust_lr_fn")
                self.opts.append(
                    ReferenceMuon(self.params[:n], normuon_beta2=beta2, lr=MUON_LR, adjust_lr_fn=fn)
                )
            elif spec.get("ns_dtype", "bfloat16") == "float32":  # torch's Muon: bf16 Newton-Schulz only
                self.opts.append(ReferenceMuon(self.params[:n], ns_dtype=torch.float32, lr=MUON_LR))
            else:
                self.opts.append(torch.optim.Muon(self.params[:n], lr=MUON_LR))
        if spec["kind"] in ("adamw", "mixed"):
            self.opts.append(torch.optim.AdamW(self.params[n:], lr=ADAMW_LR, foreach=False))
        self.scheds = (
            [torch.optim.lr_scheduler.LambdaLR(o, lr_lambda) for o in self.opts] if spec.get("sched") else []
        )
        self.snaps: list[list[Tensor]] = []
        self.norms: list[Tensor] = []

    def step(self, s: int, world: int) -> None:
        for p, g in zip(self.params, avg_grads(self.spec, s, world), strict=True):
            p.grad = g
        if self.spec.get("clip"):
            self.norms.append(
                torch.nn.utils.clip_grad_norm_([p for p in self.params if p.grad is not None], MAX_NORM)
            )
        for o in self.opts:
            o.step()
        for sc in self.scheds:
            sc.step()
        self.snaps.append([p.detach().clone() for p in self.params])

    def run(self, steps: range, world: int) -> Oracle:
        for s in steps:
            self.step(s, world)
        return self


def averaged_grad_norm(spec: dict[str, Any], step: int, world: int) -> Tensor:
    """The oracle for what the optimizer reduced: the global norm of the averaged gradient, by hand."""
    grads = [g for g in avg_grads(spec, step, world) if g is not None]
    return torch.stack([g.double().square().sum() for g in grads]).sum().sqrt().float()


# ---- torch's Muon with the Newton-Schulz dtype as a parameter (the fp32 oracle) ------------------------


def host_has_native_bf16() -> bool:
    """The CPU flags (Linux), read here rather than through distlab: AVX512-BF16 or AMX-BF16."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        flags = {
            f for line in cpuinfo.read_text().splitlines() if line.startswith("flags") for f in line.split()
        }
        return bool(flags & {"avx512_bf16", "amx_bf16"})
    caps = torch.cpu.get_capabilities()
    return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))


def newton_schulz_reference(G: Tensor, coefficients, steps: int, eps: float, dtype: torch.dtype) -> Tensor:
    """torch.optim._muon._zeropower_via_newtonschulz (torch 2.13) with ``dtype`` instead of bf16; ``coefficients``
    may also hold one (a, b, c) per iteration, which the Polar Express paper (arXiv:2505.16932, Algorithm 1) runs in
    the same iteration, the k-th triple at the k-th step."""
    per_step = coefficients if isinstance(coefficients[0], (tuple, list)) else [coefficients] * steps
    assert len(per_step) == steps
    X = G.to(dtype, copy=True)
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.T
    X.div_(X.norm().clamp(min=eps))
    for a, b, c in per_step:
        A = X @ X.T
        B = torch.addmm(A, A, A, beta=b, alpha=c)
        X = torch.addmm(X, B, X, beta=a)
    return X.T if tall else X


class ReferenceMuon(torch.optim.Muon):
    """torch.optim.Muon's update rule (torch 2.13's _single_tensor_muon) with Newton-Schulz in ``ns_dtype``;
    torch.optim.Muon's constructor (defaults, checks). In bf16 it equals torch.optim.Muon bit for bit."""

    def __init__(self, params, ns_dtype=torch.float32, normuon_beta2: float | None = None, **kw) -> None:
        super().__init__(params, **kw)
        self.ns_dtype, self.normuon_beta2 = ns_dtype, normuon_beta2

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            if isinstance(lr, Tensor):  # as torch: a 1-element tensor lr stays a tensor (float32 arithmetic)
                lr = lr.squeeze()
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                ortho = newton_schulz_reference(
                    update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype
                )
                A, B = p.shape
                fn = group["adjust_lr_fn"]
                ratio = 0.2 * math.sqrt(max(A, B)) if fn == "match_rms_adamw" else math.sqrt(max(1, A / B))
                if (
                    self.normuon_beta2 is not None
                ):  # NorMuon (arXiv:2510.05491, Algorithm 1) after orthogonalising
                    beta2 = self.normuon_beta2
                    v = state.setdefault("normuon_v", torch.zeros(A, 1))  # one second moment per row (neuron)
                    v.mul_(beta2).add_((1 - beta2) * (ortho * ortho).mean(dim=1, keepdim=True))
                    ortho = ortho / (v.sqrt() + 1e-8)
                    # the paper's step size is "match_rms_adamw"; "original" keeps an orthogonal update's norm
                    ratio = (
                        0.2 * math.sqrt(A * B) if fn == "match_rms_adamw" else ratio * math.sqrt(min(A, B))
                    )
                    norm = ortho.norm().item()
                    ratio = ratio / norm if norm > 0 else 0.0  # a zero update stays zero
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(ortho, alpha=-(lr * ratio))
