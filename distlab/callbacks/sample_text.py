"""Print a generated sample at the end of fit, from a language model with ``.model.generate``: on rank 0 alone,
or on every rank when the parameters are sharded (:func:`distlab.distributed.on_rank_zero`). Only rank 0 prints.
"""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from distlab.data.tokenizer import ByteTokenizer
from distlab.distributed import on_rank_zero
from distlab.domains import NewTokens, NonNegative, PositiveInt, Seed, Text, check_domains
from distlab.errors import ConfigError


class SampleText(L.Callback):
    """After ``fit``, continue ``prompt`` with the trained model and log the text.

    Needs a module whose ``model`` has ``generate(idx, max_new_tokens, temperature, top_k, generator=)``
    (distlab's GPT).

    Args:
        prompt: text to continue. max_new_tokens: bytes to sample.
        temperature: sampling temperature (0 = greedy). top_k: restrict to the k likeliest bytes.
        seed: sampling seed (the same on every rank, so sharded ranks sample the same tokens).
    """

    def __init__(
        self,
        prompt: Text = "def ",
        max_new_tokens: NewTokens = 200,
        temperature: NonNegative = 0.8,
        top_k: PositiveInt | None = 50,
        seed: Seed = 0,
    ) -> None:
        check_domains(SampleText.__init__, locals())
        self.prompt, self.max_new_tokens = prompt, max_new_tokens
        self.temperature, self.top_k, self.seed = temperature, top_k, seed
        self.last_sample: str | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not callable(getattr(getattr(pl_module, "model", None), "generate", None)):
            raise ConfigError(
                f"SampleText samples from a language model at .model.generate(...), and {type(pl_module).__name__} "
                "has none; remove SampleText from the callbacks"
            )

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # fast_dev_run is a quick check that everything runs: a few bytes show that sampling works.
        n_new = min(self.max_new_tokens, 16) if trainer.fast_dev_run else self.max_new_tokens
        text = on_rank_zero(pl_module, "SampleText on rank 0", lambda: self._sample(pl_module, n_new))
        if text is None:
            return
        self.last_sample = text
        bar = "-" * 72
        rank_zero_info(
            f"\nSample after {trainer.global_step} steps (prompt {self.prompt!r}):\n{bar}\n{text}\n{bar}"
        )

    @torch.no_grad()
    def _sample(self, pl_module: L.LightningModule, n_new: int) -> str:
        tok = ByteTokenizer()
        model = pl_module.model
        was_training = model.training
        model.eval()
        idx = torch.tensor([tok.encode(self.prompt, bos=True)], dtype=torch.long, device=pl_module.device)
        gen = torch.Generator(device=pl_module.device).manual_seed(self.seed)
        try:
            out = model.generate(idx, n_new, self.temperature, self.top_k, generator=gen)
        finally:
            model.train(was_training)
        return tok.decode(out[0].tolist(), drop_unknown=True)  # a larger vocabulary samples ids no byte has
