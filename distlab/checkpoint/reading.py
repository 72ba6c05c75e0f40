"""What a checkpoint holds, read without running code, and what a resume or an evaluation checks of it."""

from __future__ import annotations

import importlib
import io
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch

from distlab.checkpoint.integrity import damage
from distlab.errors import ConfigError

METADATA_FILENAME = "meta.pt"  # what Lightning's ModelParallelStrategy writes next to the DCP shards


def load_checkpoint_file(ckpt_path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint file's contents, loaded with ``weights_only=True`` (one-line ConfigError otherwise)."""
    path = Path(ckpt_path).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"checkpoint not found: {str(ckpt_path)!r}; pass --ckpt_path to an existing .ckpt file"
        )
    try:
        with warnings.catch_warnings():  # "pickle protocol 4": the refusal below says what matters
            warnings.simplefilter("ignore", UserWarning)
            return _torch_load(path, map_location)
    except Exception as e:  # noqa: BLE001 - any failure to read gets a one-line answer
        text = str(e)
        if (
            isinstance(e, (EOFError, KeyError, OSError))
            or "zip archive" in text
            or "_use_new_zipfile" in text
        ):
            raise ConfigError(
                f"refusing {str(path)!r}: it is damaged or not a torch checkpoint (a truncated copy or an "
                f"interrupted save?): {type(e).__name__}: {text.split('. ')[0]}; copy it again or pass another "
                "checkpoint"
            ) from None
        raise ConfigError(
            f"refusing {str(path)!r}: torch.load(weights_only=True) cannot read it ({_unpickler_reason(e)}); "
            "nothing in it was run. Load only checkpoints distlab or torch.save wrote, from sources you trust"
        ) from None


def _torch_load(path: Path, map_location: Any) -> Any:
    """``torch.load(weights_only=True)``, memory-mapped where the file allows it (no tensor data read)."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):
            raise
    return torch.load(path, map_location=map_location, weights_only=True)


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
            f"refusing {str(meta)!r}: {_unpickler_reason(e)} (nothing in it was run); only load checkpoints you trust"
        ) from None


def is_safetensors(path: str | Path) -> bool:
    """Whether ``path`` is a safetensors file (by its header: an 8-byte length, then a JSON object)."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open("rb") as f:
        head = f.read(9)
    return (
        len(head) == 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= p.stat().st_size
    )


def checkpoint_step(ckpt_path: str | Path) -> int | None:
    """The optimizer step a fit's checkpoint (file, or FSDP2 folder's meta.pt) was saved at; None if unknown."""
    path = Path(ckpt_path)
    meta = path / METADATA_FILENAME if path.is_dir() else path
    if not meta.is_file():
        return None
    step = load_checkpoint_file(meta).get("global_step")
    return int(step) if isinstance(step, int) else None


# What a Lightning checkpoint holds besides the weights (a folder keeps them in its meta.pt).
LIGHTNING_KEYS = ("pytorch-lightning_version", "global_step")


def newest_checkpoint(folders: list[Path]) -> Path | None:
    """What a restarted job continues from: of every ``*.ckpt`` in ``folders`` (files and FSDP2 folders), the one
    saved at the highest step, the newest among equals; one that cannot be read, or is damaged (said), is passed
    over. None if none."""
    from lightning.pytorch.utilities import rank_zero_info

    found = []
    for path in (p for folder in folders if folder.is_dir() for p in folder.glob("*.ckpt")):
        try:
            step = checkpoint_step(path)
        except Exception:  # noqa: BLE001 - a checkpoint a crash cut short: an earlier one continues the job
            continue
        if step is not None:
            found.append((step, path.stat().st_mtime, str(path)))
    for _, _, path in sorted(found, reverse=True):
        why = damage(path)
        if why is None:
            return Path(path)
        rank_zero_info(f"distlab: {path} is damaged ({why}); passed over for an earlier intact checkpoint")
    return None


def check_lightning_checkpoint(ckpt_path: str | Path) -> None:
    """A file or FSDP2 folder that Lightning can resume or evaluate from: one-line ConfigError for anything else (a
    bare state_dict, a dict of tensors) instead of Lightning's KeyError deep in its restore."""
    path = Path(ckpt_path)
    found = checkpoint_entries(path)
    if not path.is_dir() and "state_dict" not in found:
        found = {}
    missing = [k for k in LIGHTNING_KEYS if k not in found]
    if missing:
        raise ConfigError(
            f"{str(ckpt_path)!r} is not a Lightning checkpoint (no {', '.join(missing)}): fit, validate and test need "
            "a .ckpt that distlab fit or a Lightning Trainer wrote; load bare weights with model.load_state_dict()"
        )


def check_weights_fit(module: torch.nn.Module, ckpt_path: str | Path) -> None:
    """A checkpoint file's weights must be the module's: the same names and shapes, and finite (one line naming
    what differs, and the saved settings that explain it); folders are checked by their loader."""
    path = Path(ckpt_path)
    if path.is_dir():
        return
    state = load_checkpoint_file(path).get("state_dict") or {}
    refuse_non_finite_checkpoint(state, path)
    mismatch = _key_mismatch(module, state)
    if mismatch:
        saved, here = checkpoint_hparams(path), dict(getattr(module, "hparams", {}) or {})
        differ = [k for k in here if k in saved and saved[k] != here[k]]
        if differ:
            raise ConfigError(
                f"{str(ckpt_path)!r} holds weights for another model than {type(module).__name__} builds: it was "
                f"trained with {', '.join(f'{k}={_as_typed(saved[k])}' for k in differ)}, and this run sets "
                f"{', '.join(f'{k}={_as_typed(here[k])}' for k in differ)}; set "
                f"{', '.join(f'model.{k}={_as_typed(saved[k])}' for k in differ)}, or give another checkpoint"
            )
        raise ConfigError(
            f"{str(ckpt_path)!r} holds weights for another model than {type(module).__name__} builds: {mismatch}; "
            "give the settings it was trained with (its config.yaml) or another checkpoint"
        )


def _as_typed(value: Any) -> str:
    """A setting as it is typed on the command line (``[0.8,0.95]``, ``muon``, ``null``)."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_as_typed(v) for v in value) + "]"
    return "null" if value is None else str(value)


def checkpoint_hparams(ckpt_path: str | Path, key: str = "hyper_parameters") -> dict[str, Any]:
    """The ``hyper_parameters`` (or ``key``, e.g. ``datamodule_hyper_parameters``) of a checkpoint file or DCP
    folder (its meta.pt); {} if none. Runs no code."""
    return dict(checkpoint_entries(Path(ckpt_path)).get(key, {}))


def checkpoint_entries(path: Path) -> dict[str, Any]:
    """A checkpoint file's entries, or a DCP folder's (its .metadata vetted first) besides the tensors: its meta.pt
    ({} without one)."""
    if not path.is_dir():
        return load_checkpoint_file(path)
    check_dcp_metadata(path)
    meta = path / METADATA_FILENAME
    return load_checkpoint_file(meta) if meta.is_file() else {}


def check_loadable_by(cls: type, checkpoint_path: Any) -> None:
    """What ``cls.load_from_checkpoint`` is given (a local path) must be a Lightning checkpoint it can read: not a
    distlab export (safetensors), nor one another of distlab's module classes wrote. Runs no code."""
    if not isinstance(checkpoint_path, (str, os.PathLike)) or not Path(checkpoint_path).expanduser().exists():
        return  # a file object, a URL, a missing path: Lightning's own answers
    path = Path(checkpoint_path).expanduser()
    if is_safetensors(path):
        raise ConfigError(
            f"{str(path)!r} is a distlab export (safetensors: the weights and settings, no training state), which "
            f"{cls.__name__}.load_from_checkpoint cannot read; rebuild the GPT with distlab.checkpoint.load_gpt(path), "
            "or load the run's .ckpt"
        )
    written = str(checkpoint_hparams(path).get("_class_path") or "")
    module, _, name = written.rpartition(".")
    if not module.startswith("distlab."):
        return  # a user's class, or none named: nothing imported on a file's word
    try:
        writer = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return
    if isinstance(writer, type) and not issubclass(cls, writer) and not issubclass(writer, cls):
        raise ConfigError(
            f"{str(path)!r} was written by {written}, not {cls.__name__}; load it with {name}.load_from_checkpoint"
        )


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
    boilerplate = ("Weights only load failed", "Check the documentation")
    lines = [ln.strip() for ln in str(e).split("WeightsUnpickler error:")[-1].splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(boilerplate)]
    return lines[0].split(" was not an allowed global")[0].rstrip(".") if lines else type(e).__name__


def first_non_finite(state: dict[str, Any]) -> str | None:
    """The name of the first floating-point tensor in ``state`` holding NaN or Inf, or None."""
    for name, tensor in state.items():
        if (
            isinstance(tensor, torch.Tensor)
            and tensor.is_floating_point()
            and not torch.isfinite(tensor).all()
        ):
            return name
    return None


def refuse_non_finite_checkpoint(state: dict[str, Any], path: Any) -> None:
    """One-line ConfigError naming the first NaN/Inf tensor of a checkpoint's weights (resumed, evaluated, sampled
    or exported), instead of NaN trained on or sampled from."""
    name = first_non_finite(state)
    if name is not None:
        raise ConfigError(
            f"{str(path)!r} holds NaN/Inf weights ({name}): the run that wrote it had diverged (or the file is "
            "damaged); use an earlier checkpoint of that run"
        )


def plain_value(value: Any) -> Any:
    """A config value with its sequences as lists: a checkpoint stores the tuple (0.8, 0.95) as a list."""
    return [plain_value(v) for v in value] if isinstance(value, (list, tuple)) else value
