"""Checkpoints are data from strangers: every load here runs no pickled code, and fails in one line.

- :mod:`.reading`: what a checkpoint (a file, or an FSDP2 folder of DCP shards) holds, read with
  ``torch.load(weights_only=True)``; a DCP folder's ``.metadata`` pickle is read first by an unpickler that builds
  DCP's own classes only (torch.distributed.checkpoint would run a payload); and the checks a resume or an
  evaluation makes of it (a Lightning checkpoint, the module's weights, finite values).
- :mod:`.writing`: Lightning's checkpoint writer, except that a save writes the whole file or stops the run in one
  line (Lightning's ``_atomic_save`` drops a ``PermissionError``: a run could train for hours, save nothing and exit
  0), and never writes NaN/Inf weights over a good checkpoint.
- :mod:`.export`: a trained GPT from a checkpoint or an export (:func:`load_gpt`); ``distlab export``'s
  ``.safetensors`` for sharing without pickle; an FSDP2 folder gathered into one file. Written atomically.

Example::

    export_consolidated("runs/x/checkpoints/step=100.ckpt", "gpt.ckpt")   # DCP folder -> single file
    model = load_gpt("gpt.ckpt")
"""

from distlab.checkpoint.export import (
    consolidate_training_checkpoint,
    consolidated_state,
    export_consolidated,
    export_safetensors,
    load_gpt,
)
from distlab.checkpoint.reading import (
    METADATA_FILENAME,
    check_dcp_metadata,
    check_holds_optimizer_state,
    check_lightning_checkpoint,
    check_loadable_by,
    check_same_optimizer,
    check_weights_fit,
    checkpoint_hparams,
    checkpoint_step,
    is_safetensors,
    load_checkpoint_file,
    newest_checkpoint,
    plain_value,
    refuse_non_finite_checkpoint,
)
from distlab.checkpoint.writing import (
    VerifiedCheckpointIO,
    guard_checkpoint_names,
    install_verified_checkpoint_io,
)

__all__ = [
    "METADATA_FILENAME",
    "VerifiedCheckpointIO",
    "check_dcp_metadata",
    "check_holds_optimizer_state",
    "check_lightning_checkpoint",
    "check_loadable_by",
    "check_same_optimizer",
    "check_weights_fit",
    "checkpoint_hparams",
    "checkpoint_step",
    "consolidate_training_checkpoint",
    "consolidated_state",
    "export_consolidated",
    "export_safetensors",
    "guard_checkpoint_names",
    "install_verified_checkpoint_io",
    "is_safetensors",
    "load_checkpoint_file",
    "load_gpt",
    "newest_checkpoint",
    "plain_value",
    "refuse_non_finite_checkpoint",
]
