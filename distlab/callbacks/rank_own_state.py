"""Every rank of a spawned job updates its own metric states, whatever the strategy.

A ``*_spawn`` launcher's pickler moves the module's CPU tensors to shared memory, and Lightning gives each rank its
own copy of the parameters and buffers only, not of torchmetrics' states: under Lightning's ``ddp_spawn`` two ranks'
``self.nats += ...`` land in one tensor (each rank's sum holds the other's, and racing read-modify-writes lose
updates: a bits-per-byte ratio came out 3.07 for 6.12). See docs/internals.md, "Strategies". The ``distlab``
command adds this callback to every fit, validate, test and predict so that a plain ``ddp_spawn`` run is covered.
"""

from __future__ import annotations

import lightning as L

from distlab.distributed import unshare_tensors


class RankOwnTensors(L.Callback):
    """At ``setup`` (in each rank, before anything is updated): clone every shared-memory tensor attribute of the module
    that is not a parameter or buffer (:func:`distlab.distributed.unshare_tensors`)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        unshare_tensors(pl_module)
