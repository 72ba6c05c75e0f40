"""Every notebook in notebooks/ executes top to bottom (nbclient, fresh kernel)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers.cli import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path: Path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    ).execute()
    text = "\n".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    # Both optimizers trained: far below the 8.0 bits/byte of a uniform guess over 256 bytes.
    found = re.search(r"final val bits/byte\s+muon\+adamw: ([\d.]+)\s+adamw: ([\d.]+)", text)
    assert found, text[-2000:]
    muon, adamw = float(found.group(1)), float(found.group(2))
    assert 0 < muon < 5 and 0 < adamw < 6, (muon, adamw)
    # The sample continues the prompt with 120 bytes of its own.
    sample = next(line for line in text.splitlines() if line.startswith("def "))
    assert len(text.split("def ", 1)[1]) >= 100, sample
