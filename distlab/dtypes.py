"""The one table of dtype names a config may use, and its parser.

Example::

    parse_dtype("bf16", "param_dtype")      # torch.bfloat16
    parse_dtype(None, "param_dtype")        # None (keep the default)
"""

from __future__ import annotations

from typing import Literal

import torch

from distlab.errors import ConfigError

DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}

# The names a config may give (a Literal, so the parser refuses any other before anything is built).
DtypeName = Literal[tuple(DTYPES)]  # type: ignore[valid-type]


def parse_dtype(
    value: torch.dtype | str | None, what: str, allowed: tuple[torch.dtype, ...] | None = None
) -> torch.dtype | None:
    """None, a torch.dtype, or a name like "bfloat16" / "fp32" -> torch.dtype (one-line error otherwise).

    ``allowed`` restricts the result (e.g. Newton-Schulz runs in bf16 or fp32 only)."""
    if value is None:
        return None
    dtype = DTYPES.get(value.lower()) if isinstance(value, str) else value
    ok = isinstance(dtype, torch.dtype) and (dtype in allowed if allowed else dtype.is_floating_point)
    if not ok:
        names = sorted(k for k, v in DTYPES.items() if not allowed or v in allowed)
        raise ConfigError(
            f"{what}={value!r} is not a dtype distlab supports here; set one of {names} or null"
        )
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


NSDtypeName = Literal["auto", "bfloat16", "float32"]  # what a LightningModule's ns_dtype setting accepts
