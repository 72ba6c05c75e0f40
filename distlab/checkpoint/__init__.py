"""Checkpoints are data from strangers: every load here runs no pickled code, and fails in one line.

:mod:`.reading` (``torch.load(weights_only=True)``; a DCP folder's ``.metadata`` through an allow-list; the checks a
resume or an evaluation makes), :mod:`.writing` (whole files or a stopped run, never NaN/Inf over a good checkpoint),
:mod:`.export` (:func:`load_gpt`, ``.safetensors``, an FSDP2 folder gathered into one file; written atomically).

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
    check_lightning_checkpoint,
    check_loadable_by,
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
    "check_lightning_checkpoint",
    "check_loadable_by",
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
