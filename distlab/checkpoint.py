"""Load a trained GPT from a Lightning checkpoint (weights_only=True: no pickled code runs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from distlab.errors import ConfigError
from distlab.models.gpt import GPT, GPTConfig


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
