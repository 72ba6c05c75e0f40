"""The update math every DistMuonAdamW path shares (Muon, Newton-Schulz, AdamW, clipping), as keyword-only functions
in torch.optim's op order.

Pure functions: no collective, no optimizer, no hardware probing. The element-wise ones work the same on a whole
tensor, a ZeRO-1 flat slice or an FSDP2 local shard. With ``dtype=torch.bfloat16``, :func:`newton_schulz` is
bit-identical to ``torch.optim._muon._zeropower_via_newtonschulz``.

Example::

    [update] = muon_momentum_foreach_([grad], [buf], momentum=0.95, nesterov=True)   # (m, n)
    ortho = newton_schulz(update)                                                    # (m, n), roughly U V^T
    muon_apply_foreach_([param], [ortho], lr=0.02, weight_decay=0.1, scaled_lr=shape_scaled_lr(0.02, None, param.shape))
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from distlab.compat import foreach
from distlab.domains import Finite, NonNegative, NSSteps, Positive, PositiveInt, check_domains, refusal
from distlab.dtypes import DtypeName, parse_dtype
from distlab.errors import ConfigError

DEFAULT_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
# Polar Express (Amsel, Persson, Musco, Gower 2025, arXiv:2505.16932): one odd quintic per iteration, each the
# minimax-optimal step for the singular values the previous ones left (5 iterations, safety factor 2e-2, cushion 2;
# the values nanochat and modded-nanogpt train with). Pass as ns_coefficients, with ns_steps=5.
POLAR_EXPRESS_COEFFICIENTS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
Triple = tuple[Finite, Finite, Finite]
# one (a, b, c) for every iteration (Newton-Schulz), or one per iteration (Polar Express; as many as ns_steps)
NSCoefficients = Triple | tuple[Triple, ...]
ADJUST_LR_FNS = (None, "original", "match_rms_adamw")
AdjustLrFn = Literal["original", "match_rms_adamw"]  # Muon's lr scaling by shape (None: "original")


def torch_scalar(x: float | Tensor) -> float | Tensor:
    """A hyperparameter as torch.optim's update math uses it (``torch.optim.optimizer._to_scalar``): a float as
    is, a 1-element tensor as a 0-d tensor. A tensor lr must stay a tensor: torch then computes
    ``1 - lr * weight_decay`` and the step size in float32 tensor arithmetic, a float in double (last-bit
    differences, found by tests/optim/test_properties.py)."""
    return x.squeeze() if isinstance(x, Tensor) and x.dim() != 0 else x


def scalar_dtype() -> torch.dtype:
    """The dtype torch.optim keeps AdamW's "step" in."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def matrix_shape(p: Tensor) -> tuple[int, int]:
    """The 2-D shape Muon treats ``p`` as: (out, in) for a matrix, (out, in*kh*kw) for a conv kernel."""
    if not isinstance(p, Tensor) or p.ndim < 2:  # cheap: it is asked of every matrix at every step
        raise ConfigError(
            f"matrix_shape: {refusal('p', p, Tensor, python=True)}"
            if not isinstance(p, Tensor)
            else f"matrix_shape: p of shape {tuple(p.shape)} is not a matrix; give a 2-D or larger tensor"
        )
    return (p.shape[0], p.numel() // max(p.shape[0], 1))


# ---- Muon ------------------------------------------------------------------------------------------


def per_iteration(coefficients: NSCoefficients, steps: int) -> list[tuple[float, float, float]]:
    """The (a, b, c) of each of ``steps`` iterations: one triple repeated, or one per iteration (as many as steps;
    a one-line ValueError otherwise)."""
    if not isinstance(coefficients[0], (tuple, list)):
        return [tuple(coefficients)] * steps  # type: ignore[list-item]
    if len(coefficients) != steps:
        raise ValueError(
            f"ns_coefficients holds {len(coefficients)} per-iteration triples but ns_steps={steps}; set ns_steps="
            f"{len(coefficients)}"
        )
    return [tuple(t) for t in coefficients]  # type: ignore[misc]


def newton_schulz(
    G: Tensor,
    coefficients: NSCoefficients = DEFAULT_NS_COEFFICIENTS,
    steps: NSSteps = 5,
    eps: Positive = 1e-7,
    dtype: torch.dtype | DtypeName = torch.bfloat16,
) -> Tensor:
    """Quintic Newton-Schulz iteration: (m, n) -> (m, n) in ``dtype``, approximately U V^T of G = U S V^T.
    ``coefficients``: one (a, b, c) for every iteration, or one per iteration (:data:`POLAR_EXPRESS_COEFFICIENTS`).

    Never modifies ``G`` (torch's version divides in place, which would clobber the input when it is
    already in ``dtype``; the result is the same either way). Each argument is checked against its declared
    domain (one-line ConfigError); DistMuonAdamW, whose groups are checked once, calls
    :func:`quintic_newton_schulz` directly.
    """
    check_domains(newton_schulz, locals())
    return quintic_newton_schulz(G, coefficients, steps, eps, parse_dtype(dtype, "dtype"))


def quintic_newton_schulz(
    G: Tensor, coefficients: NSCoefficients, steps: int, eps: float, dtype: torch.dtype
) -> Tensor:
    """:func:`newton_schulz` on arguments already checked (the optimizer's hot path)."""
    if G.ndim != 2:
        raise ValueError(f"newton_schulz needs a 2-D matrix, got shape {tuple(G.shape)}")
    X = G.to(dtype)
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.T  # (n, m): iterate on the wide orientation so the gram matrix is the small one
    X = X / X.norm().clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    for a, b, c in per_iteration(coefficients, steps):
        A = X @ X.T  # (k, k), k = min(m, n)
        B = torch.addmm(A, A, A, beta=b, alpha=c)  # b*A + c*A@A
        X = torch.addmm(X, B, X, beta=a)  # a*X + B@X
    if tall:
        X = X.T
    return X


def newton_schulz_stack(
    G: Tensor, coefficients: NSCoefficients, steps: int, eps: float, dtype: torch.dtype
) -> Tensor:
    """:func:`quintic_newton_schulz` on a stack (B, m, n) of same-shape matrices at once: one batched matmul chain
    (``torch.baddbmm``), each matrix normalised by its own norm. Each result equals the one-matrix iteration up to
    the last bits batched matmul kernels may round otherwise (bit-equal on CPU in bf16; in fp32 within a few ulp)."""
    X = G.to(dtype)  # (B, m, n)
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT  # (B, n, m): the wide orientation, so the gram matrices are the small ones
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for a, b, c in per_iteration(coefficients, steps):
        A = X @ X.mT  # (B, k, k)
        X = torch.baddbmm(X, torch.baddbmm(A, A, A, beta=b, alpha=c), X, beta=a)
    return X.mT if tall else X


def newton_schulz_flops(shape: tuple[int, int], steps: int = 5) -> int:
    """Matmul FLOPs of :func:`newton_schulz` on an (m, n) matrix: per iteration, with k = min(m, n) and
    w = max(m, n), ``X @ X.T`` 2k²w + ``A @ A`` 2k³ + ``B @ X`` 2k²w (the scalings and additions are left out,
    as MFU counts leave out a model's element-wise work)."""
    k, w = sorted(shape[:2])
    return steps * (4 * k * k * w + 2 * k**3)


def adjust_lr(
    lr: NonNegative | Tensor, adjust_lr_fn: AdjustLrFn | None, shape: tuple[PositiveInt, ...]
) -> float | Tensor:
    """Muon's per-shape learning rate: "original" (default) -> lr*sqrt(max(1, A/B)); "match_rms_adamw" ->
    0.2*lr*sqrt(max(A, B)), for a matrix ``shape`` (A, B) (a torch.Size too). Arguments are checked (one line)."""
    check_domains(adjust_lr, locals())
    if len(shape) < 2:
        raise ConfigError(f"adjust_lr: shape={tuple(shape)} is not a matrix's; give its 2-D shape (out, in)")
    return shape_scaled_lr(lr, adjust_lr_fn, shape)


def shape_scaled_lr(lr: float | Tensor, adjust_lr_fn: str | None, shape: tuple[int, ...]) -> float | Tensor:
    """:func:`adjust_lr` on arguments already checked (the optimizer's hot path)."""
    A, B = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, A / B))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * (0.2 * math.sqrt(max(A, B)))
    raise ValueError(f"adjust_lr_fn={adjust_lr_fn!r} is not supported; set one of {ADJUST_LR_FNS}")


def muon_momentum_foreach_(
    grads: list[Tensor], bufs: list[Tensor], *, momentum: float, nesterov: bool
) -> list[Tensor]:
    """Muon's momentum buffers updated in place with the gradients; returns what Newton-Schulz orthogonalises
    (Nesterov's blend, or the buffers). torch.optim.Muon's element-wise math, in foreach kernels over the lists."""
    foreach.lerp_(bufs, grads, 1 - momentum)
    return foreach.lerp(grads, bufs, momentum) if nesterov else bufs


def muon_apply_foreach_(
    params: list[Tensor], orthos: list[Tensor], *, lr: float, weight_decay: float, scaled_lr: float
) -> None:
    """Decoupled weight decay, then the orthogonalised step (``scaled_lr``: :func:`shape_scaled_lr` of the whole
    matrix), in place on same-shape parts (whole tensors, ZeRO-1 slices or FSDP2 shards; ``orthos`` hold the same
    elements). ``lr`` may be a 0-d tensor, computed in torch's tensor arithmetic as torch.optim.Muon does."""
    foreach.mul_(params, 1 - lr * weight_decay)
    foreach.add_(params, orthos, alpha=-scaled_lr)


# NorMuon (Li, Liu, Liang, Chen, Zhao 2025, arXiv:2510.05491): after orthogonalisation, each row (output neuron) of
# the update is divided by the root of its running second moment; the update is then rescaled to the Frobenius norm
# of an orthogonal matrix, sqrt(min(m, n)), so that Muon's learning-rate rule sizes it: with "match_rms_adamw" that
# is the paper's 0.2 * sqrt(m * n) / ||O||_F (RMS 0.2); with "original", the RMS Muon's own step has.
NORMUON_EPS = 1e-8


def normuon_rows_(orthos: list[Tensor], row_moments: list[Tensor], *, beta2: float) -> list[Tensor]:
    """NorMuon's neuron-wise normalisation: each (rows, cols) update's row second moments ``row_moments`` (rows, 1)
    updated in place with the mean over the row of its squares; returns the updates divided by their root (+ eps).
    Rows are whole on every path (a whole matrix, or the rows of an FSDP2 Shard(0) shard)."""
    foreach.lerp_(row_moments, [o.square().mean(dim=1, keepdim=True) for o in orthos], 1 - beta2)
    return [o / (v.sqrt() + NORMUON_EPS) for o, v in zip(orthos, row_moments, strict=True)]


def normuon_scales(square_norms: Tensor, shape: tuple[int, int]) -> Tensor:
    """NorMuon's rescaling per matrix of ``shape`` (m, n), from the squared Frobenius norms of its normalised
    updates: to an orthogonal matrix's norm, sqrt(min(m, n)) / ||O||_F (0 for an all-zero update: a matrix whose
    gradient is zero, such as a zero-initialised projection's first step, stays as it is)."""
    norms = square_norms.sqrt()
    return torch.where(norms > 0, math.sqrt(min(shape)) / norms, torch.zeros_like(norms))


# ---- AdamW -----------------------------------------------------------------------------------------


def adamw_state(like: Tensor) -> dict[str, Tensor]:
    """Fresh AdamW state for ``like`` (a tensor, flat slice or DTensor), laid out like it."""
    return {
        "step": torch.tensor(0.0, dtype=scalar_dtype()),
        "exp_avg": torch.zeros_like(like),
        "exp_avg_sq": torch.zeros_like(like),
    }


def adamw_step(saved: float | Tensor) -> Tensor:
    """A saved AdamW "step" as torch keeps it: a scalar tensor of :func:`scalar_dtype` (a copy, where it was)."""
    if isinstance(saved, Tensor):
        return saved.detach().clone().to(scalar_dtype())
    return torch.tensor(float(saved), dtype=scalar_dtype())


def adamw_foreach_(
    params: list[Tensor],
    grads: list[Tensor],
    *,
    steps: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> None:
    """torch.optim.AdamW(foreach=False)'s single-tensor math on lists of tensors whose ``steps`` are equal, in
    foreach kernels: the same operations in the same order, so the same bits."""
    beta1, beta2 = (b.item() if isinstance(b, Tensor) else b for b in betas)  # torch allows 1-element tensors
    foreach.add_(steps, 1)
    if weight_decay != 0:
        foreach.mul_(params, 1 - lr * weight_decay)
    foreach.lerp_(exp_avgs, grads, 1 - beta1)
    foreach.mul_(exp_avg_sqs, beta2)
    foreach.addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    n = steps[0].item()
    step_size = lr / (1 - beta1**n)
    denom = foreach.sqrt(exp_avg_sqs)
    foreach.div_(denom, (1 - beta2**n) ** 0.5)
    foreach.add_(denom, eps)
    foreach.addcdiv_(params, exp_avgs, denom, value=-step_size)


def clip_coefficient(total_norm: Tensor, max_norm: float) -> Tensor:
    """clip_grad_norm_'s scale: min(1, max_norm / (norm + 1e-6))."""
    return (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
