"""Byte-level tokenizer: ids 0..255 are raw UTF-8 bytes, 256 is the document separator <|bos|>.

Nothing to download or train; every byte string round-trips exactly.

    tok = ByteTokenizer()
    ids = tok.encode("def f(): pass", bos=True)   # [256, 100, 101, ...]
    text = tok.decode(ids)                          # specials are dropped
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from distlab.errors import shown_briefly


class ByteTokenizer:
    """UTF-8 bytes plus one special token that separates documents."""

    bos_id: int = 256
    vocab_size: int = 257

    def encode(self, text: str | bytes, bos: bool = False) -> list[int]:
        """Text (a str, as UTF-8; or bytes as they are) -> ids, with the separator first if ``bos``."""
        if not isinstance(text, (str, bytes, bytearray)):
            hint = "; to turn ids back into text, call decode(ids)" if _ids_like(text) else ""
            raise TypeError(f"ByteTokenizer.encode takes text (a str, or bytes), got {_seen(text)}{hint}")
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return ([self.bos_id] if bos else []) + list(data)

    def encode_array(self, data: bytes, bos: bool = True) -> np.ndarray:
        """Fast path for corpora: bytes -> uint16 array (optionally BOS-prefixed)."""
        arr = np.frombuffer(data, dtype=np.uint8).astype(np.uint16)
        return np.concatenate([np.array([self.bos_id], dtype=np.uint16), arr]) if bos else arr

    def decode(self, ids, drop_unknown: bool = False) -> str:
        """Bytes back to text; the document separator is dropped. An id outside the vocabulary (another
        tokenizer's) is a ValueError, or dropped with ``drop_unknown`` (a model with a larger vocabulary than the
        tokenizer's can sample ids no byte has)."""
        ids = _token_ids(ids)
        if not drop_unknown:
            unknown = [i for i in ids if not 0 <= i < self.vocab_size]
            if unknown:
                raise ValueError(
                    f"token id {unknown[0]} is not a byte-tokenizer id (0..{self.vocab_size - 1}): ids of another "
                    "tokenizer? (decode(ids, drop_unknown=True) drops them)"
                )
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


_TAKES = "token ids (a list of ints, or a 1-D integer tensor or array)"


def _kind(value: Any) -> str:
    name = type(value).__name__
    return "None" if value is None else f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"


def _seen(value: Any) -> str:
    """What was given: its kind, and its value when that says more."""
    return _kind(value) if value is None else f"{_kind(value)}: {shown_briefly(value)}"


def _integral(item: Any) -> bool:
    return isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_))


def _ids_like(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(_integral(i) for i in value)


def _token_ids(ids: Any) -> list[int]:
    """``ids`` as a list of ints, or a one-line TypeError for what decode does not take (text, a float tensor, a
    batch of rows, None): ``int()`` would read 104.7 as 104 and give the wrong text without a word."""
    if hasattr(ids, "tolist") and hasattr(ids, "dtype") and hasattr(ids, "ndim"):  # a tensor or an array
        if ids.ndim != 1:
            fix = "decode one row at a time, e.g. ids[0]" if ids.ndim == 2 else "give one row of ids"
            raise TypeError(
                f"ByteTokenizer.decode takes {_TAKES}, got {_kind(ids)} of shape {tuple(ids.shape)}; {fix}"
            )
        values = ids.tolist()
        if not all(_integral(i) for i in values):
            raise TypeError(
                f"ByteTokenizer.decode takes {_TAKES}, got {_kind(ids)} of {ids.dtype}; convert ids with "
                ".long() (torch) or .astype(int) (numpy)"
            )
        return values
    if isinstance(ids, str) or not isinstance(ids, Iterable):
        hint = "; to turn text into ids, call encode(text)" if isinstance(ids, str) else ""
        raise TypeError(f"ByteTokenizer.decode takes {_TAKES}, got {_seen(ids)}{hint}")
    values = [i.tolist() if getattr(i, "ndim", None) == 0 and hasattr(i, "tolist") else i for i in ids]
    for position, item in enumerate(values):
        if not _integral(item):
            fix = (
                "decode one row at a time, e.g. ids[0]"
                if isinstance(item, (list, tuple)) or getattr(item, "ndim", 0)
                else "give whole token ids"
            )
            raise TypeError(
                f"ByteTokenizer.decode takes {_TAKES}, got {_kind(ids)} holding {shown_briefly(item)} "
                f"({_kind(item)}) at position {position}; {fix}"
            )
    return [int(i) for i in values]
