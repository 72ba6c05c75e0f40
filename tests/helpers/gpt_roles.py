"""The GPT's parameters by role, read off its structure (an oracle independent of distlab.optim.split_params).

Every tensor inside a transformer block is a hidden matrix (Muon); the token embedding and the LM head are
AdamW's; the GPT has no 0-/1-D parameters today (its norms have no weights), so "scalar" is empty.
"""

from __future__ import annotations

from torch import nn

from distlab.models.gpt import GPT


def gpt_roles(model: GPT) -> dict[str, list[nn.Parameter]]:
    """{"matrix", "embedding", "head", "scalar"} -> params, every parameter exactly once (asserted)."""
    roles = {
        "matrix": [p for block in model.blocks for p in block.parameters() if p.ndim >= 2],
        "embedding": [model.wte.weight],
        "head": [model.lm_head.weight],
        "scalar": [p for p in model.parameters() if p.ndim < 2],
    }
    placed = [id(p) for ps in roles.values() for p in ps]
    assert sorted(placed) == sorted(id(p) for p in model.parameters()) and len(placed) == len(set(placed))
    return roles
