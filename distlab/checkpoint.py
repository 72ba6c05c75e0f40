"""Checkpoints are data from strangers: every load here runs no pickled code, and fails in one line.

- :func:`load_checkpoint_file`: ``torch.load(weights_only=True)``; a payload, a corrupt or a missing file
  is a one-line :class:`ConfigError` and nothing of it runs.
- :func:`check_dcp_metadata`: torch.distributed.checkpoint reads a folder's ``.metadata`` with plain
  ``pickle.load``, which would run a payload; this reads it first with an unpickler that only builds
  DCP's own metadata classes.
- :func:`checkpoint_hparams`: the hyperparameters a checkpoint (file or DCP folder) carries.
- :func:`load_gpt`: a trained GPT from a checkpoint or an exported ``.safetensors`` file.
- :func:`export_safetensors` (``distlab export``): a fit's checkpoint (file or FSDP2 folder) as safetensors,
  for sharing without pickle; :func:`export_consolidated`: an FSDP2 folder as one torch file.

Example::

    export_consolidated("runs/x/checkpoints/step=100.ckpt", "gpt.ckpt")   # DCP folder -> single file
    model = load_gpt("gpt.ckpt")
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch

from distlab.errors import ConfigError
from distlab.models.gpt import GPT, GPTConfig

METADATA_FILENAME = "meta.pt"  # what Lightning's ModelParallelStrategy writes next to the DCP shards


def load_checkpoint_file(ckpt_path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint file's contents, loaded with ``weights_only=True`` (one-line ConfigError otherwise)."""
    path = Path(ckpt_path)
    if not path.is_file():
        raise ConfigError(
            f"checkpoint not found: {str(ckpt_path)!r}; pass --ckpt_path to an existing .ckpt file"
        )
    try:
        with warnings.catch_warnings():  # "pickle protocol 4": the refusal below says what matters
            warnings.simplefilter("ignore", UserWarning)
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure gets the same one-line answer
        raise ConfigError(
            f"refusing {str(path)!r}: torch.load(weights_only=True) cannot read it ({_unpickler_reason(e)}); "
            "nothing in it was run. Load only checkpoints distlab or torch.save wrote, from sources you trust"
        ) from None
    if not isinstance(ckpt, dict):
        raise ConfigError(f"{str(path)!r} holds a {type(ckpt).__name__}, not a checkpoint dict")
    return ckpt


# What a DCP .metadata pickle may reference: DCP's own classes, torch dtypes/layouts/Size, paths, containers.
_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_DCP_SAFE_GLOBALS = {
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only the classes DCP metadata is made of; anything else (os.system, ...) is refused unbuilt."""

    def find_class(self, module: str, name: str) -> Any:
        if "." not in name:  # a dotted name would walk attributes (module.os.system)
            if (module, name) in _DCP_SAFE_GLOBALS:
                return super().find_class(module, name)
            if module == "torch" and isinstance(
                getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)
            ):
                return getattr(torch, name)
            if module in _DCP_MODULES and isinstance(obj := super().find_class(module, name), type):
                return obj  # a dataclass or enum defined by DCP
        raise pickle.UnpicklingError(f"it references {module}.{name}, which DCP metadata never does")


def check_dcp_metadata(folder: str | Path) -> None:
    """Refuse (one line) a DCP folder whose ``.metadata`` pickle would build anything but DCP metadata."""
    meta = Path(folder) / ".metadata"
    if not meta.is_file():
        raise ConfigError(
            f"{str(folder)!r} is not a sharded (torch.distributed.checkpoint) checkpoint folder: no .metadata; "
            "pass the folder a fsdp2 run saved (e.g. runs/x/checkpoints/step=100.ckpt/)"
        )
    try:
        _MetadataUnpickler(io.BytesIO(meta.read_bytes())).load()
    except Exception as e:  # noqa: BLE001
        raise ConfigError(
            f"refusing {str(meta)!r}: {_first_line(e)} (nothing in it was run); only load checkpoints you trust"
        ) from None


def checkpoint_hparams(ckpt_path: str | Path) -> dict[str, Any]:
    """The ``hyper_parameters`` a checkpoint file or DCP folder (its meta.pt) carries; {} if none. Runs no code."""
    path = Path(ckpt_path)
    if path.is_dir():
        check_dcp_metadata(path)
        meta = path / METADATA_FILENAME
        return dict(load_checkpoint_file(meta).get("hyper_parameters", {})) if meta.is_file() else {}
    return dict(load_checkpoint_file(path).get("hyper_parameters", {}))


def load_gpt(ckpt_path: str | Path, map_location: str | torch.device = "cpu") -> GPT:
    """Rebuild the GPT from a checkpoint's (or an exported .safetensors file's) hyperparameters and weights."""
    path = Path(ckpt_path)
    if path.suffix == ".safetensors" and path.is_file():
        ckpt = _load_safetensors(path)
    else:
        ckpt = load_checkpoint_file(ckpt_path, map_location)
    hp = ckpt.get("hyper_parameters", {})
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    cfg = GPTConfig(**{k: v for k, v in hp.items() if k in fields})
    model = GPT(cfg)
    state = {
        k.removeprefix("model."): v for k, v in ckpt.get("state_dict", {}).items() if k.startswith("model.")
    }
    # saved from a compiled model (_orig_mod.) or a DDP-wrapped one (module.)
    state = {k.replace("_orig_mod.", "").removeprefix("module."): v for k, v in state.items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise ConfigError(
            f"{str(ckpt_path)!r} does not hold a distlab GPT's weights: {_key_mismatch(model, state) or _first_line(e)}"
        ) from None
    return model.eval()


def _key_mismatch(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> str:
    """What torch's multi-line load_state_dict error says, in one line: counts and the first few names."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    reshaped = sorted(k for k in set(expected) & set(state) if expected[k].shape != state[k].shape)
    parts = []
    if missing:
        parts.append(
            f"{len(missing)} missing key(s) ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"
        )
    if unexpected:
        shown = ", ".join(unexpected[:3]) + (", ..." if len(unexpected) > 3 else "")
        parts.append(f"{len(unexpected)} unexpected key(s) ({shown})")
    if reshaped:
        k = reshaped[0]
        parts.append(
            f"{len(reshaped)} of another shape ({k}: {tuple(state[k].shape)} in the file, "
            f"{tuple(expected[k].shape)} in the model)"
        )
    return "; ".join(parts)


def _unpickler_reason(e: BaseException) -> str:
    """The specific reason in torch's long weights_only message (an unsupported global names what would run)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for line in lines:
        if "WeightsUnpickler error:" in line:
            line = line.split("WeightsUnpickler error:", 1)[1].strip()
        if line and not line.startswith(
            ("Weights only load failed", "Check the documentation", "Please file")
        ):
            return line.split(" was not an allowed global")[0].rstrip(".")
    return lines[0] if lines else type(e).__name__


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def consolidated_state(
    ckpt_path: str | Path, prefix: str = "model."
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(hyperparameters, full tensors under ``prefix``) of a checkpoint file or an FSDP2 (DCP) folder, in one
    process, no process group; nothing in it runs. The optimizer state is not read."""
    path = Path(ckpt_path)
    if path.is_dir():
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

        check_dcp_metadata(path)  # DCP unpickles .metadata with plain pickle: refuse a payload first
        with warnings.catch_warnings():  # "no process group: loading in a single process" is the intent here
            warnings.simplefilter("ignore", UserWarning)
            loaded = _load_state_dict_from_keys({"state_dict"}, checkpoint_id=str(path))
        meta = path / METADATA_FILENAME
        hparams = load_checkpoint_file(meta).get("hyper_parameters", {}) if meta.is_file() else {}
        state = loaded["state_dict"]
    else:
        ckpt = load_checkpoint_file(path)
        hparams, state = ckpt.get("hyper_parameters", {}), ckpt.get("state_dict", {})
    tensors = {k: v for k, v in state.items() if k.startswith(prefix) and isinstance(v, torch.Tensor)}
    if not tensors:
        raise ConfigError(
            f"{str(path)!r} holds no weights under {prefix!r}; is it a distlab fit's checkpoint?"
        )
    return dict(hparams), tensors


def export_consolidated(ckpt_dir: str | Path, out_path: str | Path, prefix: str = "model.") -> Path:
    """Sharded Lightning checkpoint folder (DCP shards + meta.pt) -> one ``torch.save`` file ``load_gpt`` reads."""
    check_dcp_metadata(ckpt_dir)  # a folder only (a file needs no consolidation)
    hparams, state = consolidated_state(ckpt_dir, prefix)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"hyper_parameters": hparams, "state_dict": state}, out_path)
    return out_path


def export_safetensors(ckpt_path: str | Path, out_path: str | Path, overwrite: bool = False) -> Path:
    """A fit's checkpoint (file, or FSDP2 folder) -> ``.safetensors`` for sharing without pickle: the model's
    tensors (keys ``model.*``) and its hyperparameters as JSON metadata. Written atomically; an existing
    file is kept unless ``overwrite``. ``load_gpt`` and ``distlab generate`` read it."""
    import json

    from safetensors.torch import save_file

    out_path = Path(out_path)
    if out_path.suffix != ".safetensors":
        raise ConfigError(f"--out={str(out_path)!r} must end in .safetensors")
    if out_path.exists() and not overwrite:
        raise ConfigError(f"{str(out_path)!r} exists; pass --overwrite true, or another --out")
    hparams, state = consolidated_state(ckpt_path)
    try:
        metadata = {"distlab_hyper_parameters": json.dumps(hparams)}
    except TypeError as e:
        raise ConfigError(
            f"the checkpoint's hyperparameters are not plain values ({e}); cannot export them"
        ) from None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp), metadata=metadata)
    os.chmod(tmp, 0o666 & ~_umask())  # safetensors creates it 0600: give it what any new file gets here
    tmp.replace(out_path)
    return out_path


def _umask() -> int:
    """This process's umask, read without changing it (os.umask can only be read by setting it, which would
    briefly give files other threads create the wrong permissions)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)  # not Linux: the racy way
    os.umask(umask)
    return umask


def _load_safetensors(path: Path) -> dict[str, Any]:
    """A .safetensors file written by :func:`export_safetensors`, as a checkpoint dict (no pickle involved)."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        state = load_file(str(path))
        hparams = json.loads(meta.get("distlab_hyper_parameters", "{}"))
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"could not read {str(path)!r} as safetensors: {_first_line(e)}") from None
    return {"hyper_parameters": hparams, "state_dict": state}
