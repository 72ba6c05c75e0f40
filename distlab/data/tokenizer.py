"""Byte-level tokenizer: ids 0..255 are raw UTF-8 bytes, 256 is the document separator <|bos|>.

Nothing to download or train; every byte string round-trips exactly.

    tok = ByteTokenizer()
    ids = tok.encode("def f(): pass", bos=True)   # [256, 100, 101, ...]
    text = tok.decode(ids)                          # specials are dropped
"""

from __future__ import annotations

import operator

import numpy as np


class ByteTokenizer:
    """UTF-8 bytes plus one special token that separates documents."""

    bos_id: int = 256
    vocab_size: int = 257

    def encode(self, text: str | bytes, bos: bool = False) -> list[int]:
        """Text (a str, as UTF-8; or bytes as they are) -> ids, with the separator first if ``bos``."""
        data = text.encode("utf-8") if isinstance(text, str) else memoryview(text).tobytes()
        return ([self.bos_id] if bos else []) + list(data)

    def encode_array(self, data: bytes, bos: bool = True) -> np.ndarray:
        """Fast path for corpora: bytes -> uint16 array (optionally BOS-prefixed)."""
        arr = np.frombuffer(data, dtype=np.uint8).astype(np.uint16)
        return np.concatenate([np.array([self.bos_id], dtype=np.uint16), arr]) if bos else arr

    def decode(self, ids, drop_unknown: bool = False) -> str:
        """Token ids (a list of ints, or a 1-D integer tensor or array) back to text; the document separator is
        dropped. An id outside the vocabulary (another tokenizer's) is a ValueError, or dropped with
        ``drop_unknown`` (a model with a larger vocabulary than the tokenizer's can sample ids no byte has)."""
        # operator.index: a float id or a row of ids is a TypeError, never truncated to another byte
        ids = [operator.index(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        if not drop_unknown:
            unknown = [i for i in ids if not 0 <= i < self.vocab_size]
            if unknown:
                raise ValueError(
                    f"token id {unknown[0]} is not a byte-tokenizer id (0..{self.vocab_size - 1}): ids of another "
                    "tokenizer? (decode(ids, drop_unknown=True) drops them)"
                )
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
