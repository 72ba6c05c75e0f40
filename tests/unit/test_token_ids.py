"""The data's token ids must each have a row in the model's embedding: refused exactly when the largest id is
>= model.vocab_size, at the boundary and around it, for several vocabulary sizes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from distlab.data.datamodule import TextDataModule
from distlab.errors import ConfigError
from distlab.modules.gpt_module import GPTLightningModule


class _Tokens(TextDataModule):
    """A data module whose splits hold the given ids (the rule reads prepare_splits only)."""

    def __init__(self, top: int) -> None:  # noqa: D107 - no corpus to read
        self._top, self.seq_len = top, 8

    def prepare_splits(self):
        ids = np.array([0, self._top // 2, self._top], dtype=np.int64)
        return SimpleNamespace(train=[ids], val=[ids[:1]], description="test ids")


@pytest.mark.parametrize("vocab", [257, 300, 1024])
@pytest.mark.parametrize("offset", [-2, -1, 0, 1, 7])
def test_token_ids_are_refused_exactly_when_the_embedding_has_no_row(vocab, offset):
    model = GPTLightningModule(depth=1, vocab_size=vocab, sequence_len=8, head_dim=16, aspect_ratio=32)
    top = vocab + offset
    if top < vocab:
        model.check_data(_Tokens(top))
    else:
        with pytest.raises(ConfigError, match=f"holds token id {top}, but model.vocab_size={vocab}"):
            model.check_data(_Tokens(top))
