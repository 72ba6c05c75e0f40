"""Importing this module leaves a file behind (path in $DISTLAB_IMPORT_MARKER): the proof that something
imported a class only a checkpoint named (tests/cli/test_bad_inputs.py)."""

import os
from pathlib import Path

import lightning as L

if os.environ.get("DISTLAB_IMPORT_MARKER"):
    Path(os.environ["DISTLAB_IMPORT_MARKER"]).touch()


class Marker(L.LightningModule):
    pass
