"""What distlab's LightningModules share: a checked ``load_from_checkpoint``, and a look at the data at fit start."""

from __future__ import annotations

from typing import Any

from distlab.compat import restricted_classmethod


class CheckedModule:
    """Mixin, before ``L.LightningModule`` in the bases, of a module with a ``check_data(datamodule)`` method."""

    @restricted_classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        """Lightning's, after a look at what it is given: a distlab export or another module's checkpoint is
        named in one line (:func:`distlab.checkpoint.check_loadable_by`)."""
        from distlab.checkpoint import check_loadable_by

        check_loadable_by(cls, checkpoint_path)
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def on_fit_start(self) -> None:
        self.check_data(getattr(self.trainer, "datamodule", None))
