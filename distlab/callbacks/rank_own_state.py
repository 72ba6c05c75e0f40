"""Every rank of a spawned job updates its own metric states, whatever the strategy.

A ``*_spawn`` launcher pickles the LightningModule to each rank, and torch's multiprocessing pickler moves its CPU
tensors to shared memory: every rank (and the launching process) then holds the *same* storage. Lightning gives each
rank its own copy of the parameters and buffers, not of torchmetrics' states (plain tensor attributes), so under
Lightning's ``ddp_spawn`` two ranks' ``self.nats += ...`` land in one tensor. Each rank's sum then holds the other's
too (a sync doubles every state, which a ratio hides), and two processes' read-modify-writes of one number race: an
update is lost now and then, and a ratio of two states (bits per byte) comes out wrong (seen: 3.07 for 6.12).
distlab's own strategies and RankZeroValidation unshare on their own; the ``distlab`` command adds this callback to
every fit, validate, test and predict so that a plain ``ddp_spawn`` run is covered too.
"""

from __future__ import annotations

import lightning as L

from distlab.distributed import unshare_tensors


class RankOwnTensors(L.Callback):
    """At ``setup`` (in each rank, before anything is updated): clone every shared-memory tensor attribute of the module
    that is not a parameter or buffer (:func:`distlab.distributed.unshare_tensors`)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        unshare_tensors(pl_module)
