"""Print a generated sample at the end of fit (rank 0 only; no collectives involved)."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from distlab.data.tokenizer import ByteTokenizer


class SampleText(L.Callback):
    """After ``fit``, continue ``prompt`` with the trained model and log the text.

    Args:
        prompt: text to continue. max_new_tokens: bytes to sample.
        temperature: sampling temperature (0 = greedy). top_k: restrict to the k likeliest bytes.
    """

    def __init__(
        self,
        prompt: str = "def ",
        max_new_tokens: int = 200,
        temperature: float = 0.8,
        top_k: int = 50,
        seed: int = 0,
    ) -> None:
        self.prompt, self.max_new_tokens = prompt, max_new_tokens
        self.temperature, self.top_k, self.seed = temperature, top_k, seed
        self.last_sample: str | None = None

    @rank_zero_only
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        tok = ByteTokenizer()
        model = pl_module.model
        was_training = model.training
        model.eval()
        idx = torch.tensor([tok.encode(self.prompt, bos=True)], dtype=torch.long, device=pl_module.device)
        gen = torch.Generator(device=pl_module.device).manual_seed(self.seed)
        # fast_dev_run is a quick check that everything runs: a few bytes show that sampling works.
        n_new = min(self.max_new_tokens, 16) if trainer.fast_dev_run else self.max_new_tokens
        out = model.generate(idx, n_new, self.temperature, self.top_k, generator=gen)
        model.train(was_training)
        self.last_sample = tok.decode(out[0].tolist())
        bar = "-" * 72
        rank_zero_info(
            f"\nSample after {trainer.global_step} steps (prompt {self.prompt!r}):\n{bar}\n{self.last_sample}\n{bar}"
        )
