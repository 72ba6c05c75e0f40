"""Language-model metrics as one torchmetrics Metric: loss (nats/token), perplexity, bits per byte.

States are float64 sums (summed across ranks by torchmetrics' sync), so the result is exact for
any split of the data across ranks, up to float64 summation order.
"""

from __future__ import annotations

import math

import torch
from torchmetrics import Metric

from distlab.domains import PositiveInt, check_domains


class LanguageModelMetrics(Metric):
    """Accumulates per-token cross-entropy; ``compute()`` returns {"loss", "ppl", "bpb"}.

    Bits per byte counts only targets that are bytes (ids < 256); the document separator is
    predicted (it is part of the loss) but is not a byte of the text.
    """

    full_state_update = False
    higher_is_better = False

    def __init__(self, n_byte_ids: PositiveInt = 256, **kwargs) -> None:
        check_domains(LanguageModelMetrics.__init__, locals())
        super().__init__(**kwargs)
        self.n_byte_ids = n_byte_ids
        for name in ("nats", "tokens", "byte_nats", "bytes"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, token_nats: torch.Tensor, targets: torch.Tensor) -> None:
        """token_nats: per-token cross-entropy (N,) in nats; targets: (N,) token ids."""
        token_nats = token_nats.detach().reshape(-1).double()
        is_byte = targets.reshape(-1) < self.n_byte_ids
        self.nats += token_nats.sum()
        self.tokens += token_nats.numel()
        self.byte_nats += token_nats[is_byte].sum()
        self.bytes += is_byte.sum()

    def compute(self) -> dict[str, torch.Tensor]:
        loss = self.nats / self.tokens.clamp(min=1)
        return {
            "loss": loss.float(),
            "ppl": loss.exp().float(),
            "bpb": (self.byte_nats / self.bytes.clamp(min=1) / math.log(2)).float(),
        }
