"""Test-only LightningModules."""

from __future__ import annotations

import torch

from distlab.modules import GPTLightningModule


class PlainAdamWModule(GPTLightningModule):
    """Returns a plain torch.optim.AdamW, which does not synchronise gradients itself."""

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
