"""A small modern GPT in the nanochat style — pure torch (no lightning, no torch.distributed). Its features are
listed in docs/internals.md ("The pieces"); one size knob, ``depth`` (see :class:`GPTConfig`).

Usage::

    cfg = GPTConfig(depth=4, sequence_len=256)
    model = GPT(cfg)
    logits = model(idx)                      # idx: (B, T) int64 -> (B, T, vocab)
    loss = model(idx, targets=targets)       # scalar mean cross-entropy
    out = model.generate(prompt_ids, max_new_tokens=64, temperature=0.8, top_k=50)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from distlab.domains import (
    AtLeastTwo,
    NewTokens,
    NonNegative,
    Positive,
    PositiveInt,
    check_domains,
)
from distlab.errors import ConfigError


@dataclass
class GPTConfig:
    """Model hyperparameters. ``depth`` derives the rest; set a field to override it."""

    depth: PositiveInt = 4
    sequence_len: PositiveInt = 256
    vocab_size: AtLeastTwo = 257
    aspect_ratio: PositiveInt = 64
    head_dim: PositiveInt = 64
    n_embd: PositiveInt | None = None  # default: depth * aspect_ratio rounded up to head_dim
    n_head: PositiveInt | None = None  # default: n_embd // head_dim
    n_kv_head: PositiveInt | None = None  # default: n_head (set lower for grouped-query attention)
    mlp_ratio: PositiveInt = 4
    logit_softcap: NonNegative = 15.0  # 0: no capping
    rope_base: Positive = 10000.0

    def __post_init__(self) -> None:
        check_domains(GPTConfig.__init__, vars(self), owner="GPTConfig")
        if self.n_embd is None:
            self.n_embd = -(-self.depth * self.aspect_ratio // self.head_dim) * self.head_dim
        if self.n_head is None:
            self.n_head = max(1, self.n_embd // self.head_dim)
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.n_embd % self.n_head != 0:
            raise ConfigError(
                f"model width n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                f"set model.n_embd to a multiple of 2 x n_head (heads of an even size, for rotary embeddings; e.g. "
                f"{2 * self.n_head * (self.n_embd // (2 * self.n_head) + 1)})"
            )
        if (self.n_embd // self.n_head) % 2 != 0:
            raise ConfigError(
                f"head dimension n_embd/n_head={self.n_embd // self.n_head} must be even for rotary embeddings; "
                "change model.head_dim, model.n_embd or model.n_head"
            )
        if self.n_head % self.n_kv_head != 0:
            raise ConfigError(
                f"n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}; "
                "set model.n_kv_head to a divisor of n_head"
            )

    @property
    def n_layer(self) -> int:
        return self.depth


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """Parameter-free RMSNorm over the last dimension."""
    return F.rms_norm(x, (x.size(-1),))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (first half, second half) of the head dimension. x: (B, H, T, D)."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head = cfg.n_head, cfg.n_kv_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.c_q = nn.Linear(cfg.n_embd, cfg.n_head * self.head_dim, bias=False)
        self.c_k = nn.Linear(cfg.n_embd, cfg.n_kv_head * self.head_dim, bias=False)
        self.c_v = nn.Linear(cfg.n_embd, cfg.n_kv_head * self.head_dim, bias=False)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.c_k(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.c_v(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q, k = rms_norm(q), rms_norm(k)  # QK-norm keeps attention logits bounded
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.n_kv_head != self.n_head
        )  # (B, H, T, D)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, cfg.mlp_ratio * cfg.n_embd, bias=False)
        self.c_proj = nn.Linear(cfg.mlp_ratio * cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.relu(self.c_fc(x)).square())  # ReLU²


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.attn = CausalSelfAttention(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(rms_norm(x), cos, sin)
        x = x + self.mlp(rms_norm(x))
        return x


class GPT(nn.Module):
    """Decoder-only transformer. See the module docstring for usage."""

    def __init__(self, cfg: GPTConfig) -> None:
        check_domains(GPT.__init__, locals())
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        cos, sin = self._rotary_tables(cfg.sequence_len)
        # Not trainable and derivable: keep them out of the state dict.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def _rotary_tables(self, seq_len: int, device: torch.device | None = None):
        half = (self.config.n_embd // self.config.n_head) // 2
        inv_freq = self.config.rope_base ** (-torch.arange(half, dtype=torch.float32, device=device) / half)
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv_freq)  # (T, D/2)
        return freqs.cos()[None, None], freqs.sin()[None, None]  # (1, 1, T, D/2)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """nanochat-style init: unit-variance embeddings, fan-in scaled matrices, zeroed output projections."""
        nn.init.normal_(self.wte.weight, mean=0.0, std=1.0)
        nn.init.normal_(self.lm_head.weight, mean=0.0, std=0.001)
        for block in self.blocks:
            for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_fc):
                bound = math.sqrt(3.0) / math.sqrt(lin.in_features)  # uniform with std 1/sqrt(fan_in)
                nn.init.uniform_(lin.weight, -bound, bound)
            nn.init.zeros_(block.attn.c_proj.weight)  # each block starts as the identity
            nn.init.zeros_(block.mlp.c_proj.weight)
        cos, sin = self._rotary_tables(self.config.sequence_len, self.wte.weight.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, reduction: str = "mean"):
        """idx: (B, T) token ids. Returns logits (B, T, V) or, with targets (B, T), the loss (nothing here reads a
        batch's values: :meth:`GPTLightningModule.check_data` checks the data once, before training)."""
        B, T = idx.shape
        assert T <= self.config.sequence_len, (
            f"input length {T} exceeds the context {self.config.sequence_len}"
        )
        assert targets is None or targets.shape == idx.shape, (
            f"targets {tuple(targets.shape)} vs idx {(B, T)}"
        )
        cos, sin = self.rope_cos[:, :, :T], self.rope_sin[:, :, :T]
        x = rms_norm(self.wte(idx))  # (B, T, C)
        for block in self.blocks:
            x = block(x, cos, sin)
        x = rms_norm(x)
        logits = self.lm_head(x).float()  # (B, T, V)
        cap = self.config.logit_softcap
        if cap > 0:
            logits = cap * torch.tanh(logits / cap)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), reduction=reduction)

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Analytic training FLOPs per token (forward + backward = 3x forward).

        6 * N for every matmul weight except the embedding lookup (which is a gather), plus the
        attention score/value matmuls: 12 * L * H * D * T per token with full causal length T
        (the PaLM convention; counts the masked half as nanoGPT does). ``seq_len``: the length T of
        the sequences trained on (default: the model's context, ``sequence_len``).
        """
        cfg = self.config
        T = cfg.sequence_len if seq_len is None else seq_len
        matmul_params = sum(p.numel() for p in self.parameters()) - self.wte.weight.numel()
        return 6 * matmul_params + 12 * cfg.n_layer * cfg.n_embd * T  # n_head * head_dim = n_embd

    def check_sampling(self, idx: torch.Tensor, **settings: Any) -> None:
        """Every check :meth:`generate` makes on ``idx`` and its settings (one-line ConfigError): a caller that
        writes as it samples (``distlab generate``) calls it first, so that a refusal leaves nothing half-written."""
        check_domains(GPT.generate, {"idx": idx, **settings}, owner="GPT.generate")
        vocab, top_k = self.config.vocab_size, settings.get("top_k")
        for bad in (int(idx.min()), int(idx.max())) if idx.numel() and idx.device.type == "cpu" else ():
            if not 0 <= bad < vocab:  # (on a GPU the check would wait for the device)
                raise ConfigError(
                    f"token id {bad} is outside the model's vocabulary (0..{vocab - 1}): another tokenizer's?"
                )
        if top_k is not None and top_k > vocab:
            raise ConfigError(
                f"GPT.generate: top_k={top_k} is more than the model's vocabulary ({vocab} tokens), so it would sample "
                f"from all of them; set top_k to at most {vocab}, or None to sample from the whole vocabulary"
            )

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: NewTokens,
        temperature: NonNegative = 1.0,
        top_k: PositiveInt | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Sample continuation tokens. idx: (B, T0) -> (B, T0 + max_new_tokens).

        temperature 0 means greedy. ``top_k``: sample from the k likeliest tokens (at most the vocabulary's size;
        None: from all). The context is cropped to the last ``sequence_len`` tokens.
        """
        self.check_sampling(
            idx, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, generator=generator
        )
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.config.sequence_len :]
            logits = self(ctx)[:, -1, :]  # (B, V)
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                raw, logits = logits, logits / temperature
                if not bool(torch.isfinite(logits).all()):  # a temperature so small the division overflows:
                    logits = (raw - raw.amax(dim=-1, keepdim=True)) / temperature  # measured from the top
                if top_k is not None:
                    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = F.softmax(logits, dim=-1)
                nxt = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
