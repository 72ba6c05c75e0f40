"""A user's LightningModule with a bug in its own ``__init__`` (a KeyError on line 13)."""

from __future__ import annotations

import lightning as L


class Broken(L.LightningModule):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        table: dict[str, int] = {}
        # the bug: a key that was never put there
        self.width = table["width"]
