"""Muon math: Newton-Schulz orthogonalisation and the shape-dependent learning-rate adjustment.

Both functions follow ``torch.optim._muon`` op for op, so that with ``dtype=torch.bfloat16``
:func:`newton_schulz` is bit-identical to ``torch.optim._muon._zeropower_via_newtonschulz``.

Example::

    O = newton_schulz(G)                      # G: (m, n) -> O: (m, n) bf16, roughly U V^T
    lr_eff = adjust_lr(0.02, None, G.shape)   # 0.02 * sqrt(max(1, m / n))
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

DEFAULT_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
ADJUST_LR_FNS = (None, "original", "match_rms_adamw")


def newton_schulz(
    G: Tensor,
    coefficients: tuple[float, float, float] = DEFAULT_NS_COEFFICIENTS,
    steps: int = 5,
    eps: float = 1e-7,
    dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    """Quintic Newton-Schulz iteration: (m, n) -> (m, n) in ``dtype``, approximately U V^T of G = U S V^T.

    Never modifies ``G`` (torch's version divides in place, which would clobber the input when it is
    already in ``dtype``; the result is the same either way).
    """
    if steps >= 100:
        raise ValueError(f"ns_steps must be < 100, got {steps}; set ns_steps to a small number like 5")
    if G.ndim != 2:
        raise ValueError(f"newton_schulz needs a 2-D matrix, got shape {tuple(G.shape)}")
    if len(coefficients) != 3:
        raise ValueError(f"ns_coefficients must have exactly 3 values, got {coefficients!r}")
    a, b, c = coefficients
    X = G.to(dtype)
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.T  # (n, m): iterate on the wide orientation so the gram matrix is the small one
    X = X / X.norm().clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        A = X @ X.T  # (k, k), k = min(m, n)
        B = torch.addmm(A, A, A, beta=b, alpha=c)  # b*A + c*A@A
        X = torch.addmm(X, B, X, beta=a)  # a*X + B@X
    if tall:
        X = X.T
    return X


def adjust_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size | tuple[int, ...]) -> float:
    """Muon's per-shape learning rate: "original" (default) -> lr*sqrt(max(1, A/B)); "match_rms_adamw" -> 0.2*lr*sqrt(max(A, B))."""
    A, B = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        ratio = math.sqrt(max(1, A / B))
    elif adjust_lr_fn == "match_rms_adamw":
        ratio = 0.2 * math.sqrt(max(A, B))
    else:
        ratio = 1.0
    return lr * ratio
