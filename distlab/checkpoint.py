"""Checkpoints into plain models: load a trained GPT (weights_only=True: no pickled code runs), and turn an
FSDP2 run's sharded checkpoint folder into one file.

Example::

    export_consolidated("runs/x/checkpoints/step=100.ckpt", "gpt.ckpt")   # DCP folder -> single file
    model = load_gpt("gpt.ckpt")
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import torch

from distlab.errors import ConfigError
from distlab.models.gpt import GPT, GPTConfig

METADATA_FILENAME = "meta.pt"  # what Lightning's ModelParallelStrategy writes next to the DCP shards


def load_gpt(ckpt_path: str | Path, map_location: str | torch.device = "cpu") -> GPT:
    """Rebuild the GPT from a checkpoint's hyperparameters and load its weights."""
    path = Path(ckpt_path)
    if not path.is_file():
        raise ConfigError(
            f"checkpoint not found: {str(ckpt_path)!r}; pass --ckpt_path to an existing .ckpt file"
        )
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure gets the same one-line answer
        raise ConfigError(
            f"could not load {str(path)!r} with weights_only=True: {str(e).splitlines()[0]}"
        ) from None
    hp = ckpt.get("hyper_parameters", {})
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    cfg = GPTConfig(**{k: v for k, v in hp.items() if k in fields})
    model = GPT(cfg)
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    state = {k.replace("_orig_mod.", ""): v for k, v in state.items()}  # saved from a compiled model
    model.load_state_dict(state)
    return model.eval()


def export_consolidated(ckpt_dir: str | Path, out_path: str | Path, prefix: str = "model.") -> Path:
    """Sharded Lightning checkpoint folder (DCP shards + meta.pt) -> one file ``load_gpt`` reads.

    Runs in a single process without a process group: DCP reads every shard of the "state_dict"
    entry (the optimizer state is not loaded). Keeps the keys under ``prefix`` (the GPT's).
    """
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    ckpt_dir, out_path = Path(ckpt_dir), Path(out_path)
    if not (ckpt_dir / ".metadata").is_file():
        raise ConfigError(
            f"{str(ckpt_dir)!r} is not a sharded (torch.distributed.checkpoint) checkpoint folder; pass the "
            "folder a fsdp2 run saved (e.g. runs/x/checkpoints/step=100.ckpt/)"
        )
    with warnings.catch_warnings():  # "no process group: loading in a single process" is the intent here
        warnings.simplefilter("ignore", UserWarning)
        loaded = _load_state_dict_from_keys({"state_dict"}, checkpoint_id=str(ckpt_dir))
    state = {k: v for k, v in loaded["state_dict"].items() if k.startswith(prefix)}
    meta = ckpt_dir / METADATA_FILENAME
    hparams = torch.load(meta, weights_only=True).get("hyper_parameters", {}) if meta.is_file() else {}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"hyper_parameters": dict(hparams), "state_dict": state}, out_path)
    return out_path
