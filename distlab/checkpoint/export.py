"""A trained GPT from a checkpoint, and checkpoints in the forms that travel: ``.safetensors`` (no pickle), or an
FSDP2 folder gathered into one file; every write atomic (the file appears whole or not at all)."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import torch

from distlab.checkpoint.reading import (
    METADATA_FILENAME,
    _key_mismatch,
    check_dcp_metadata,
    checkpoint_entries,
    is_safetensors,
    load_checkpoint_file,
    refuse_non_finite_checkpoint,
)
from distlab.checkpoint.writing import _atomic_target
from distlab.domains import ExistingPath, TorchDevice, check_domains
from distlab.errors import ConfigError
from distlab.models.gpt import GPT, GPTConfig


def load_gpt(ckpt_path: ExistingPath, map_location: TorchDevice | torch.device = "cpu") -> GPT:
    """Rebuild the GPT from a checkpoint's (a file, an FSDP2 folder, or an exported .safetensors file's)
    hyperparameters and weights (the architecture is the checkpoint's own; sampling settings are ``GPT.generate``'s)."""
    check_domains(load_gpt, locals())
    path = Path(ckpt_path).expanduser()
    if path.is_file() and is_safetensors(path):  # read by its content: a renamed file is what its bytes are
        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(str(path), framework="pt") as f:  # what export_safetensors wrote: no pickle involved
            hparams = json.loads((f.metadata() or {}).get("distlab_hyper_parameters", "{}"))
        ckpt = {"hyper_parameters": hparams, "state_dict": load_file(str(path))}
    elif path.is_dir():
        hparams, tensors = consolidated_state(path)  # an FSDP2 run's sharded folder, read in this one process
        ckpt = {"hyper_parameters": hparams, "state_dict": tensors}
    else:
        ckpt = load_checkpoint_file(ckpt_path, map_location)
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    model = GPT(GPTConfig(**{k: v for k, v in ckpt.get("hyper_parameters", {}).items() if k in fields}))
    state = {
        k.removeprefix("model."): v for k, v in ckpt.get("state_dict", {}).items() if k.startswith("model.")
    }
    # saved from a compiled model (_orig_mod.) or a DDP-wrapped one (module.)
    state = {k.replace("_orig_mod.", "").removeprefix("module."): v for k, v in state.items()}
    refuse_non_finite_checkpoint(state, ckpt_path)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise ConfigError(
            f"{str(ckpt_path)!r} does not hold a distlab GPT's weights: {_key_mismatch(model, state) or str(e).strip().splitlines()[0]}"
        ) from None
    return model.eval()


def _read_dcp_keys(folder: Path, keys: set[str]) -> dict[str, Any]:
    """Full tensors of the top-level ``keys`` of a (vetted: :func:`check_dcp_metadata`) DCP folder, in this one
    process, without a process group."""
    from distlab.compat import load_state_dict_from_keys

    with warnings.catch_warnings():  # "no process group: loading in a single process" is the intent here
        warnings.simplefilter("ignore", UserWarning)
        return load_state_dict_from_keys(keys, checkpoint_id=str(folder))


def consolidated_state(
    ckpt_path: str | Path, prefix: str = "model."
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(hyperparameters, full tensors under ``prefix``) of a checkpoint file or an FSDP2 (DCP) folder, in one
    process, no process group; nothing in it runs. The optimizer state is not read."""
    path = Path(ckpt_path)
    ckpt = checkpoint_entries(path)  # a folder's .metadata vetted first: DCP unpickles it with plain pickle
    hparams, state = ckpt.get("hyper_parameters", {}), ckpt.get("state_dict", {})
    if path.is_dir():
        state = _read_dcp_keys(path, {"state_dict"})["state_dict"]
    tensors = {k: v for k, v in state.items() if k.startswith(prefix) and isinstance(v, torch.Tensor)}
    if not tensors:
        first = next(iter(state), None)
        held = f" (its weights are named like {first!r}: another LightningModule's)" if first else ""
        raise ConfigError(
            f"{str(path)!r} holds no weights under {prefix!r}{held}; export and generate read checkpoints of distlab's "
            "GPT (GPTLightningModule); for your own module, load the checkpoint with its class's load_from_checkpoint"
        )
    return dict(hparams), tensors


def consolidate_training_checkpoint(ckpt_dir: str | Path, out_path: str | Path) -> Path:
    """A sharded (FSDP2 / HSDP) checkpoint folder -> one Lightning checkpoint file holding the whole training state
    (full weights, each optimizer's state in torch's format, schedulers, loops, callbacks, step), resumable under
    any strategy on any world size. One process, no process group, no pickle run."""
    folder = Path(ckpt_dir)
    check_dcp_metadata(folder)
    checkpoint = load_checkpoint_file(folder / METADATA_FILENAME)
    from torch.distributed.checkpoint import FileSystemReader

    names = {k.split(".", 1)[0] for k in FileSystemReader(str(folder)).read_metadata().state_dict_metadata}
    optimizers = sorted((n for n in names if n.startswith("optimizer_")), key=lambda n: int(n.split("_")[1]))
    loaded = _read_dcp_keys(folder, {"state_dict", *optimizers})
    checkpoint["state_dict"] = loaded["state_dict"]
    checkpoint["optimizer_states"] = [_indexed_optimizer_state(loaded[n]) for n in optimizers]
    out_path = Path(out_path)
    with _atomic_target(out_path) as tmp:
        torch.save(checkpoint, tmp)
    return out_path


def _indexed_optimizer_state(by_name: dict[str, Any]) -> dict[str, Any]:
    """torch.distributed.checkpoint's optimizer state (keyed by parameter name) -> torch's own format (keyed by the
    parameter's index, counted over the param groups in order, as ``DistMuonAdamW.state_dict`` writes it)."""
    index: dict[str, int] = {}
    groups = [
        {**g, "params": [index.setdefault(n, len(index)) for n in g["params"]]}
        for g in by_name["param_groups"]
    ]
    state = {index[name]: dict(st) for name, st in by_name["state"].items()}
    return {"state": state, "param_groups": groups}


def export_consolidated(ckpt_dir: str | Path, out_path: str | Path, prefix: str = "model.") -> Path:
    """Sharded Lightning checkpoint folder (DCP shards + meta.pt) -> one ``torch.save`` file ``load_gpt`` reads."""
    check_dcp_metadata(ckpt_dir)  # a folder only (a file needs no consolidation)
    hparams, state = consolidated_state(ckpt_dir, prefix)
    out_path = Path(out_path)
    with _atomic_target(out_path) as tmp:
        torch.save({"hyper_parameters": hparams, "state_dict": state}, tmp)
    return out_path


def export_safetensors(ckpt_path: str | Path, out_path: str | Path, overwrite: bool = False) -> Path:
    """A fit's checkpoint (file, or FSDP2 folder) -> ``.safetensors`` for sharing without pickle: the model's
    tensors (keys ``model.*``) and its hyperparameters as JSON metadata. Written atomically; an existing
    file is kept unless ``overwrite``. ``load_gpt`` and ``distlab generate`` read it."""
    from safetensors.torch import save_file

    if not isinstance(overwrite, bool):  # "no" would be true: a file replaced that was to be kept
        raise ConfigError(f"overwrite={overwrite!r} is not accepted; set overwrite to True or False")
    out_path, ckpt_path = Path(out_path).expanduser(), Path(ckpt_path).expanduser()  # as a shell reads ~
    if out_path.exists() and not overwrite:
        raise ConfigError(f"{str(out_path)!r} exists; pass --overwrite true, or another --out")
    hparams, state = consolidated_state(ckpt_path)
    if not hparams:
        raise ConfigError(
            f"{str(ckpt_path)!r} holds no hyperparameters, so an export of it could not rebuild the model (load_gpt and "
            "distlab generate read them from the file); export a checkpoint of a module that calls "
            "save_hyperparameters(), as distlab's do"
        )
    refuse_non_finite_checkpoint(state, ckpt_path)
    metadata = {"distlab_hyper_parameters": json.dumps(hparams)}
    with _atomic_target(out_path) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp), metadata=metadata)
    return out_path
