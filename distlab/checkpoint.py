"""Checkpoints are data from strangers: every load here runs no pickled code, and fails in one line.

- :func:`load_checkpoint_file`: ``torch.load(weights_only=True)``; a payload, a corrupt or a missing file
  is a one-line :class:`ConfigError` and nothing of it runs.
- :func:`check_dcp_metadata`: torch.distributed.checkpoint reads a folder's ``.metadata`` with plain
  ``pickle.load``, which would run a payload; this reads it first with an unpickler that only builds
  DCP's own metadata classes.
- :func:`checkpoint_hparams`: the hyperparameters a checkpoint (file or DCP folder) carries.
- :func:`load_gpt`: a trained GPT from a checkpoint or an exported ``.safetensors`` file.
- :func:`export_safetensors` (``distlab export``): a fit's checkpoint (file or FSDP2 folder) as safetensors,
  for sharing without pickle; :func:`export_consolidated`: an FSDP2 folder as one torch file. Both write
  atomically: the file appears whole or not at all.
- :class:`VerifiedCheckpointIO`: Lightning's checkpoint writer, except that a write that fails (a folder
  turned read-only, a full disk) stops the run in one line. Lightning's own ``_atomic_save`` drops a
  ``PermissionError``, so a run could train for hours, save nothing and exit 0.

Example::

    export_consolidated("runs/x/checkpoints/step=100.ckpt", "gpt.ckpt")   # DCP folder -> single file
    model = load_gpt("gpt.ckpt")
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib
import inspect
import io
import os
import pickle
import tempfile
import typing
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from distlab.domains import ExistingPath, TorchDevice, check_domains
from distlab.errors import ConfigError, DistlabError, closest, file_size_limit_line, shown_briefly
from distlab.models.gpt import GPT, GPTConfig

METADATA_FILENAME = "meta.pt"  # what Lightning's ModelParallelStrategy writes next to the DCP shards


def load_checkpoint_file(ckpt_path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint file's contents, loaded with ``weights_only=True`` (one-line ConfigError otherwise)."""
    path = Path(ckpt_path).expanduser()
    _check_map_location(map_location)
    refuse_a_path_that_holds_no_checkpoint(path, pieces_too=False)
    if not path.is_file():
        raise ConfigError(
            f"checkpoint not found: {str(ckpt_path)!r}; pass --ckpt_path to an existing .ckpt file"
        )
    what = not_a_checkpoint(path)
    if what:
        raise ConfigError(f"{str(path)!r} is not a checkpoint: {what}")
    if path.suffix == ".safetensors" and _torch_written(
        path
    ):  # torch.load reads it as safetensors, by its name
        raise ConfigError(
            f"{str(path)!r} is a torch checkpoint (what torch.save writes) under a .safetensors name, and a file of "
            f"that name is read as safetensors; rename it to {path.with_suffix('.ckpt').name}"
        )
    try:
        with warnings.catch_warnings():  # "pickle protocol 4": the refusal below says what matters
            warnings.simplefilter("ignore", UserWarning)
            ckpt = _torch_load(path, map_location)
    except Exception as e:  # noqa: BLE001 - any unpickling failure gets the same one-line answer
        raise ConfigError(
            f"refusing {str(path)!r}: torch.load(weights_only=True) cannot read it ({_unpickler_reason(e)}); "
            "nothing in it was run. Load only checkpoints distlab or torch.save wrote, from sources you trust"
        ) from None
    if not isinstance(ckpt, dict):
        raise ConfigError(f"{str(path)!r} holds a {type(ckpt).__name__}, not a checkpoint dict")
    return ckpt


def refuse_a_path_that_holds_no_checkpoint(path: Path, pieces_too: bool = True) -> None:
    """A path the user gave that exists but is no checkpoint file or folder: a named pipe, a device (/dev/null), a
    socket, or (``pieces_too``) one piece of a sharded checkpoint folder, read only through the folder."""
    from distlab.domains import broken_link_reason

    broken = broken_link_reason(path)
    if broken is not None:
        raise ConfigError(f"checkpoint {str(path)!r} cannot be read: {broken}")
    import stat

    if not path.exists():
        return
    mode = path.stat().st_mode
    kind = next(
        (k for test, k in ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                           (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")) if test(mode)),
        None,
    )  # fmt: skip
    if kind is not None:
        raise ConfigError(
            f"{str(path)!r} is {kind}, not a checkpoint file; give the path of a .ckpt file or folder"
        )
    folder = path.parent
    if pieces_too and path.is_file() and (folder / ".metadata").is_file():
        raise ConfigError(
            f"{str(path)!r} is one piece of the sharded checkpoint folder {str(folder)!r}, which is read whole; "
            f"give the folder: --ckpt_path {folder}"
        )


def _check_map_location(map_location: Any) -> None:
    """A device to load onto must exist here (torch's own refusal reads like a refused file)."""
    if not isinstance(map_location, (str, torch.device)):
        return  # a dict or a function: torch's forms, passed through
    try:
        device = torch.device(map_location)
    except RuntimeError:
        raise ConfigError(
            f"map_location={map_location!r} is not a device; give 'cpu' or 'cuda' (or 'cuda:N')"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"map_location={map_location!r} asks for a CUDA device, and torch sees none here; use 'cpu'"
        )
    probe = (
        io.BytesIO()
    )  # what torch.load does with it, on one tiny tensor: 'cpu:1', 'mps' on Linux, 'cuda:7' of 1
    torch.save(torch.zeros(1), probe)
    probe.seek(0)
    try:
        torch.load(probe, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any refusal is about the device, not the file
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(
            f"map_location={map_location!r} is not a device torch can load onto here ({first}); give 'cpu', or "
            "'cuda' / 'cuda:N' for a GPU this machine has"
        ) from None


def not_a_checkpoint(path: Path) -> str | None:
    """What a file given as a checkpoint is instead, read from its first bytes (an empty file, a Git LFS pointer,
    a web page, other text); None when it may be one (torch writes a zip archive, or a pickle)."""
    with open(path, "rb") as f:
        head = f.read(512)
    if not head:
        return "it is empty (0 bytes: an interrupted copy or download?); copy it again"
    if head.startswith(b"\x1f\x8b"):
        return f"it is gzip-compressed; decompress it first (gunzip -k {path.name}) and give the .ckpt inside"
    if head.startswith(b"version https://git-lfs"):
        return "it is a Git LFS pointer, not the file itself; run `git lfs pull` where it came from"
    start = head.lstrip().lower()
    if start.startswith((b"<!doctype html", b"<html", b"<?xml", b"<")):
        return "it is a web page (HTML/XML), not the file: download the raw file instead of the page that links to it"
    if head.startswith(b"PK\x03\x04") and not zipfile.is_zipfile(path):  # its end (the directory) is missing
        return (
            f"it is cut short ({path.stat().st_size:,} bytes of a zip archive whose end is missing: an interrupted "
            "save or copy); copy it again, or give an earlier checkpoint"
        )
    if head.startswith((b"PK\x03\x04", b"\x80")):  # torch's zip archive, a legacy pickle
        return None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if text.isprintable() or all(c.isprintable() or c in "\r\n\t" for c in text):
        first = text.strip().splitlines()[0][:60] if text.strip() else ""
        return f"it is a text file (it starts {first!r}); give a .ckpt distlab fit (or torch.save) wrote"
    return None


def _torch_load(path: Path, map_location: Any) -> Any:
    """``torch.load(weights_only=True)``, memory-mapped where the file allows it (reading the step or the
    hyperparameters of a large checkpoint then reads no tensor data)."""
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
        inside = sorted(Path(folder).glob("*.ckpt")) + sorted(Path(folder).glob("checkpoints/*.ckpt"))
        if inside:  # a run folder (or its checkpoints folder), given where one of its checkpoints belongs
            last = [p for p in inside if p.name.startswith("last")]
            raise ConfigError(
                f"{str(folder)!r} is a folder of checkpoints, not a checkpoint; pass one of them, e.g. "
                f"--ckpt_path {(last or inside)[-1]}"
            )
        raise ConfigError(
            f"{str(folder)!r} is not a sharded (torch.distributed.checkpoint) checkpoint folder: no .metadata; "
            "pass the folder a fsdp2 run saved (e.g. runs/x/checkpoints/step=100.ckpt/)"
        )
    try:
        metadata = _MetadataUnpickler(io.BytesIO(meta.read_bytes())).load()
    except Exception as e:  # noqa: BLE001
        raise ConfigError(
            f"refusing {str(meta)!r}: {_first_line(e)} (nothing in it was run); only load checkpoints you trust"
        ) from None
    check_dcp_complete(Path(folder), metadata)


def check_dcp_complete(folder: Path, metadata: Any) -> None:
    """Every byte range the folder's metadata points to must be there (a shard file deleted or cut short by an
    interrupted copy would fail deep inside torch.distributed.checkpoint, on every rank), and Lightning's meta.pt."""
    needed: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        name = str(getattr(info, "relative_path", ""))
        if name:
            needed[name] = max(
                needed.get(name, 0), int(getattr(info, "offset", 0)) + int(getattr(info, "length", 0))
            )
    for name, size in sorted(needed.items()):
        shard = folder / name
        have = shard.stat().st_size if shard.is_file() else None
        if have is None or have < size:
            state = "is missing" if have is None else f"has {have:,} of its {size:,} bytes"
            raise ConfigError(
                f"sharded checkpoint {str(folder)!r} is incomplete: its shard {name} {state} (an interrupted copy?); "
                "copy the folder again, or use an earlier checkpoint"
            )
    if not (folder / METADATA_FILENAME).is_file():
        raise ConfigError(
            f"sharded checkpoint {str(folder)!r} is incomplete: no {METADATA_FILENAME} (Lightning writes the step, "
            "the loops and the hyperparameters there next to the shards); copy the folder again"
        )


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


def _torch_written(path: Path) -> bool:
    """Whether a file starts as torch.save writes (a zip archive, or a legacy pickle)."""
    with path.open("rb") as f:
        return f.read(4).startswith((b"PK\x03\x04", b"\x80"))


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
    saved at the highest step, the newest among equals; one that cannot be read (cut short by a crash) is passed
    over. None when there is none."""
    found = []
    for path in (p for folder in folders if folder.is_dir() for p in folder.glob("*.ckpt")):
        try:
            step = checkpoint_step(path)
        except Exception:  # noqa: BLE001 - a checkpoint a crash cut short: an earlier one continues the job
            continue
        if step is not None:
            found.append((step, path.stat().st_mtime, str(path)))
    return Path(max(found)[2]) if found else None


def check_lightning_checkpoint(ckpt_path: str | Path, resume: bool = False) -> None:
    """A file or FSDP2 folder that Lightning can resume (``resume``: with its loops' state, or the fit would start
    again at step 0 on a finished schedule) or evaluate from: one-line ConfigError for anything else (a bare
    state_dict, a dict of tensors, another layout) instead of Lightning's KeyError deep in its restore."""
    path = Path(ckpt_path)
    if path.is_dir():
        check_dcp_metadata(path)
        meta = path / METADATA_FILENAME
        found = load_checkpoint_file(meta) if meta.is_file() else {}
    else:
        found = load_checkpoint_file(path)
        if "state_dict" not in found:
            found = {}
    missing = [k for k in LIGHTNING_KEYS if k not in found]
    if missing:
        raise ConfigError(
            f"{str(ckpt_path)!r} is not a Lightning checkpoint (no {', '.join(missing)}): fit, validate and test need "
            "a .ckpt that distlab fit or a Lightning Trainer wrote; load bare weights with model.load_state_dict()"
        )
    if resume and "loops" not in found:
        raise ConfigError(
            f"{str(ckpt_path)!r} holds no training-loop state (written by Lightning "
            f"{found.get('pytorch-lightning_version', '?')} in another layout): a fit would restart at step 0 on its "
            "finished LR schedule; validate/test can read it, or start a new fit from its weights"
        )


def check_weights_fit(module: torch.nn.Module, ckpt_path: str | Path) -> None:
    """A checkpoint file's weights must be the module's: the same names and shapes (Lightning loads strictly).
    One line counting and naming what is missing, unexpected or reshaped; folders are checked by their loader."""
    path = Path(ckpt_path)
    if path.is_dir():
        return
    state = load_checkpoint_file(path).get("state_dict") or {}
    refuse_non_finite_checkpoint(state, path)
    mismatch = _key_mismatch(module, state)
    if mismatch:
        # the settings that differ from the ones saved with the weights (save_hyperparameters) say what to change
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


def check_holds_optimizer_state(ckpt_path: str | Path) -> None:
    """A checkpoint a fit resumes must hold the optimizer's state (Lightning's KeyError mid-restore otherwise)."""
    path = Path(ckpt_path)
    if not path.is_dir() and "optimizer_states" not in load_checkpoint_file(path):
        raise ConfigError(
            f"{str(ckpt_path)!r} holds the model's weights only (a ModelCheckpoint with save_weights_only=true, or the "
            "optimizer state removed): a fit cannot resume it; resume from a full checkpoint (last.ckpt), or start a "
            "new fit from these weights, or evaluate it with distlab validate / test"
        )


def check_same_optimizer(module: Any, ckpt_path: str | Path) -> None:
    """A fit resumed under another ``optimizer`` setting than its checkpoint's cannot continue the optimizer's state
    (Muon's momentum is not AdamW's moments; a sharded folder fails deep in torch's loader): one line instead."""
    hparams = getattr(module, "hparams", {}) or {}
    if "optimizer" not in hparams:
        return
    saved = checkpoint_hparams(ckpt_path).get("optimizer")
    if saved is not None and saved != hparams["optimizer"]:
        raise ConfigError(
            f"{str(ckpt_path)!r} was trained with model.optimizer={saved!r}, and this fit sets "
            f"model.optimizer={hparams['optimizer']!r}: its optimizer state cannot continue under another optimizer; "
            f"resume with model.optimizer={saved!r}, or start a new fit (without --ckpt_path) from its weights"
        )


def checkpoint_hparams(ckpt_path: str | Path, key: str = "hyper_parameters") -> dict[str, Any]:
    """The ``hyper_parameters`` (or, with ``key``, e.g. the ``datamodule_hyper_parameters``) a checkpoint file or DCP
    folder (its meta.pt) carries; {} if none. Runs no code."""
    path = Path(ckpt_path)
    if path.is_dir():
        check_dcp_metadata(path)
        meta = path / METADATA_FILENAME
        return dict(load_checkpoint_file(meta).get(key, {})) if meta.is_file() else {}
    return dict(load_checkpoint_file(path).get(key, {}))


def check_loadable_by(cls: type, checkpoint_path: Any) -> None:
    """What ``cls.load_from_checkpoint`` is given (a local path) must be a Lightning checkpoint it can read: not a
    distlab export (safetensors: torch would advise turning weights_only off), nor one that another of distlab's
    module classes wrote (the "import the module" advice could not help). Reads no tensor, runs no code."""
    import importlib

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


def load_gpt(
    ckpt_path: ExistingPath, map_location: TorchDevice | torch.device = "cpu", **unknown: Any
) -> GPT:
    """Rebuild the GPT from a checkpoint's (a file, an FSDP2 folder, or an exported .safetensors file's)
    hyperparameters and weights. It takes nothing else: a sampling setting belongs to ``GPT.generate``, and the
    architecture (a :class:`GPTConfig` field) is the trained checkpoint's own; either is refused in one line."""
    if unknown:
        _refuse_settings(unknown)
    check_domains(load_gpt, locals())
    path = Path(ckpt_path).expanduser()
    _check_map_location(map_location)
    refuse_a_path_that_holds_no_checkpoint(path)
    if path.is_file() and (
        is_safetensors(path) or (path.suffix == ".safetensors" and not _torch_written(path))
    ):
        ckpt = _load_safetensors(path)  # read by its content: a renamed file is what its bytes are
    elif path.is_dir():
        hparams, tensors = consolidated_state(path)  # an FSDP2 run's sharded folder, read in this one process
        ckpt = {"hyper_parameters": hparams, "state_dict": tensors}
    else:
        ckpt = load_checkpoint_file(ckpt_path, map_location)
    hp = ckpt.get("hyper_parameters", {})
    if "state_dict" in ckpt and not hp and path.suffix == ".safetensors":
        raise ConfigError(
            f"{str(ckpt_path)!r} is an export without hyperparameters (an older distlab exported a checkpoint that had "
            "none), so the GPT cannot be rebuilt from it; export again from the .ckpt of a run whose module saves "
            "them (distlab's do)"
        )
    if "state_dict" not in ckpt or not hp:
        raise ConfigError(
            f"{str(ckpt_path)!r} holds {'no hyperparameters' if 'state_dict' in ckpt else 'no state_dict'}, so the GPT "
            "it holds cannot be rebuilt; give a checkpoint distlab fit wrote, or a distlab export .safetensors"
        )
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    writer = str(hp.get("_class_path") or "")
    if not fields & set(hp):  # none of a GPT's settings: another kind of model
        raise ConfigError(
            f"{str(ckpt_path)!r} was written by {writer or 'a module that is no distlab GPT'} (its settings: "
            f"{', '.join(sorted(k for k in hp if not k.startswith('_'))[:4])}), not by distlab's GPT language model; "
            "distlab generate samples text from GPT checkpoints only (distlab fit with a GPT recipe, e.g. configs/demo_cpu.yaml)"
        )
    cfg = GPTConfig(**{k: v for k, v in hp.items() if k in fields})
    model = GPT(cfg)
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
            f"{str(ckpt_path)!r} does not hold a distlab GPT's weights: {_key_mismatch(model, state) or _first_line(e)}"
        ) from None
    return model.eval()


def _refuse_settings(unknown: dict[str, Any]) -> None:
    """load_gpt given keywords it does not take: named, with what the first is (a setting of GPT.generate's, or of
    the trained architecture) or the nearest name load_gpt takes; a TypeError, as Python's own for an unknown keyword."""
    import difflib

    takes = ["ckpt_path", "map_location"]
    sampling = [n for n in inspect.signature(GPT.generate).parameters if n not in ("self", "idx")]
    fields = [f.name for f in dataclasses.fields(GPTConfig)]
    name = sorted(unknown)[0]
    shown = ", ".join(f"{n}={shown_briefly(unknown[n], 40)}" for n in sorted(unknown))
    nearest = (difflib.get_close_matches(name, takes + sampling + fields, n=1) or [None])[0]
    if closest(name, takes) or name in takes:
        why = closest(name, takes).strip()[1:-1]
    elif name == "device":
        why = "the device to load onto is map_location: load_gpt(path, map_location='cuda')"
    elif nearest in sampling or name in sampling:
        meant = name if name in sampling else nearest
        mean = "" if meant == name else f"did you mean {meant!r}? "
        why = f"{mean}{meant} is a sampling setting: give it to load_gpt(path).generate(ids, {meant}=...)"
    elif nearest in fields or name in fields:
        meant = name if name in fields else nearest
        mean = "" if meant == name else f"did you mean {meant!r}? "
        why = f"{mean}{meant} is the trained GPT's own setting, read from the checkpoint: it cannot change after training"
    else:
        why = "no such setting"
    raise TypeError(f"load_gpt() does not take {shown} ({why}); it takes {' and '.join(takes)}")


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
    if path.is_dir():
        check_dcp_metadata(path)  # DCP unpickles .metadata with plain pickle: refuse a payload first
        loaded = _read_dcp_keys(path, {"state_dict"})
        meta = path / METADATA_FILENAME
        hparams = load_checkpoint_file(meta).get("hyper_parameters", {}) if meta.is_file() else {}
        state = loaded["state_dict"]
    else:
        ckpt = load_checkpoint_file(path)
        hparams, state = ckpt.get("hyper_parameters", {}), ckpt.get("state_dict", {})
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
    """A sharded (FSDP2 / HSDP) checkpoint folder -> one Lightning checkpoint file holding the whole training state:
    full weights, each optimizer's state in torch's format (keyed by parameter index in group order, as
    ``DistMuonAdamW.state_dict`` writes it), the LR schedulers, loops, callbacks and step. Resumable under any
    strategy on any world size (``ddp_optimizer_sync``, one process). One process, no process group, no pickle run."""
    folder = Path(ckpt_dir)
    check_dcp_metadata(folder)
    meta = folder / METADATA_FILENAME
    if not meta.is_file():
        raise ConfigError(
            f"{str(folder)!r} has no {METADATA_FILENAME}: it is not a checkpoint folder distlab fit wrote"
        )
    checkpoint = load_checkpoint_file(meta)
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
    parameter's index, counted over the param groups in order)."""
    index: dict[str, int] = {}
    groups = []
    for group in by_name["param_groups"]:
        ids = []
        for name in group["params"]:
            index[name] = len(index)
            ids.append(index[name])
        groups.append({**group, "params": ids})
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
    import json

    from safetensors.torch import save_file

    if not isinstance(overwrite, bool):  # "no" would be true: a file replaced that was to be kept
        raise ConfigError(f"overwrite={overwrite!r} is not accepted; set overwrite to True or False")
    out_path, ckpt_path = (
        Path(out_path).expanduser(),
        Path(ckpt_path).expanduser(),
    )  # as the CLI and a shell read ~
    if out_path.suffix != ".safetensors":
        raise ConfigError(f"--out={str(out_path)!r} must end in .safetensors")
    if out_path.is_dir():
        raise ConfigError(f"--out={str(out_path)!r} is a folder; give a file name ending in .safetensors")
    if out_path.exists() and not overwrite:
        raise ConfigError(f"{str(out_path)!r} exists; pass --overwrite true, or another --out")
    refuse_a_path_that_holds_no_checkpoint(Path(ckpt_path))
    if is_safetensors(ckpt_path):
        raise ConfigError(
            f"{str(ckpt_path)!r} is already an exported .safetensors file (distlab generate reads it); export reads the "
            ".ckpt file or FSDP2 folder distlab fit wrote"
        )
    hparams, state = consolidated_state(ckpt_path)
    if not hparams:
        raise ConfigError(
            f"{str(ckpt_path)!r} holds no hyperparameters, so an export of it could not rebuild the model (load_gpt and "
            "distlab generate read them from the file); export a checkpoint of a module that calls "
            "save_hyperparameters(), as distlab's do"
        )
    refuse_non_finite_checkpoint(state, ckpt_path)
    _refuse_weights_its_settings_do_not_build(hparams, state, ckpt_path)
    try:
        metadata = {"distlab_hyper_parameters": json.dumps(hparams)}
    except TypeError as e:
        raise ConfigError(
            f"the checkpoint's hyperparameters are not plain values ({e}); cannot export them"
        ) from None
    with _atomic_target(out_path) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp), metadata=metadata)
        os.chmod(tmp, 0o666 & ~_umask())  # safetensors creates it 0600: give it what any new file gets here
    return out_path


def _refuse_weights_its_settings_do_not_build(
    hparams: dict[str, Any], state: dict[str, Any], ckpt_path: Any
) -> None:
    """The weights must be the ones the saved settings build (an exported file whose settings build another model
    loads nowhere): the module class the checkpoint names is built from them on the meta device, nothing allocated,
    and compared by names and shapes. Only distlab's own classes are imported (a class path read from a file never
    runs a user's import); one that cannot be built so is not judged."""
    import importlib

    module, _, name = str(hparams.get("_class_path") or "").rpartition(".")
    if not module.startswith("distlab."):
        return
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return
    try:
        with torch.device("meta"):
            module = cls(**{k: v for k, v in hparams.items() if not k.startswith("_")})
    except Exception:  # noqa: BLE001 - its own __init__ wants more than its saved settings: not ours to judge
        return
    mismatch = _key_mismatch(module, state)
    if mismatch:
        raise ConfigError(
            f"{str(ckpt_path)!r}: its weights are not those of the model its saved settings build "
            f"({cls.__name__}: {mismatch.split('; ')[0]}), so the export would load nowhere; give a checkpoint as "
            "distlab fit wrote it"
        )


@contextlib.contextmanager
def _atomic_target(out_path: Path) -> Iterator[Path]:
    """Yield a temporary name next to ``out_path``; on success it replaces ``out_path``, on any failure it is
    removed (nothing half-written is ever left under either name). An unwritable place is a one-line error."""
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=out_path.parent)
    except OSError as e:
        raise ConfigError(
            f"cannot write {str(out_path)!r}: {e.strerror or type(e).__name__}; choose a folder you can write"
        ) from None
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        tmp.replace(out_path)
    except BaseException as e:
        limited = _stopped_at_the_size_limit(e, tmp, repr(str(out_path)))
        tmp.unlink(missing_ok=True)
        if limited is not None:
            raise DistlabError(limited) from None
        raise


def _stopped_at_the_size_limit(e: BaseException, tmp: Path | None, what: str) -> str | None:
    """The line for a write of ``tmp`` (for ``what``) that the process's file-size limit stopped (EFBIG, or the
    file cut at the limit: torch's writer says "iostream error" and removes nothing), else None."""
    if not isinstance(e, Exception) or tmp is None:
        return None
    try:
        size = tmp.stat().st_size
    except OSError:
        size = None
    too_large = (isinstance(e, OSError) and e.errno == errno.EFBIG) or "File too large" in str(
        e
    )  # safetensors'
    return file_size_limit_line(what, size, too_large)


class VerifiedCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` for local files, except that every save either writes the whole file
    or stops the run: written to a temporary name in the same folder and renamed into place, and any OSError
    (permission, a full disk) is a one-line :class:`~distlab.errors.DistlabError` naming the file. Remote
    (``scheme://``) paths go to Lightning's writer unchanged."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        refuse_non_finite_weights(checkpoint, path)
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        tmp: Path | None = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            os.close(fd)
            tmp = Path(name)
            torch.save(checkpoint, tmp)
            os.chmod(tmp, 0o666 & ~_umask())
            tmp.replace(target)
        except BaseException as e:  # torch's C++ writer fails as a RuntimeError ("iostream error")
            limited = _stopped_at_the_size_limit(e, tmp, f"the checkpoint {str(target)!r}")
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            if limited is not None:
                raise DistlabError(f"{limited}; resume from the last checkpoint written") from None
            if not isinstance(e, OSError):
                raise
            raise DistlabError(
                f"could not write the checkpoint {str(target)!r} ({e.strerror or type(e).__name__}); the run stops "
                "so that no more training goes unsaved: make the folder writable (or free space) and resume from "
                "the last checkpoint written"
            ) from None


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
    """A checkpoint read to resume, evaluate, sample or export must hold finite weights (a run that diverged saved
    it, or it was damaged): one-line ConfigError naming the first bad tensor, instead of NaN trained on, exported
    or sampled from."""
    name = first_non_finite(state)
    if name is not None:
        raise ConfigError(
            f"{str(path)!r} holds NaN/Inf weights ({name}): the run that wrote it had diverged (or the file is "
            "damaged); use an earlier checkpoint of that run"
        )


def refuse_non_finite_weights(checkpoint: dict[str, Any], path: Any) -> None:
    """Never write NaN/Inf weights over a checkpoint (``last.ckpt`` is replaced at every save: the last good weights
    would be gone). One-line DistlabError naming the first bad tensor and the step."""
    state = checkpoint.get("state_dict") or {}
    name = first_non_finite(state)
    if name is not None:
        half = state[name].dtype == torch.float16
        why = (
            ", and they are float16, which overflows beyond 65504 and underflows below 6e-8 (trainer.precision="
            "'16-true'?): train with bf16-mixed (or 16-mixed on a GPU)"
            if half
            else ""
        )
        earlier = [p for p in Path(str(path)).parent.glob("*.ckpt") if p.name != Path(str(path)).name]
        then = (
            "the checkpoints saved before stay as they are; resume from the last one with a lower learning rate"
            if earlier
            else "no checkpoint was saved before it; start again (in a new --trainer.default_root_dir, or delete "
            f"{Path(str(path)).parent.parent}) with a lower learning rate"
        )
        fault = os.environ.get("DISTLAB_FAULT", "")
        if fault.startswith(
            "nan"
        ):  # the user asked for it: the cure is to unset the variable, not the learning rate
            then = f"DISTLAB_FAULT={fault} injected the NaN (distlab's fault injection); unset it to train normally"
        raise DistlabError(
            f"the weights hold NaN/Inf ({name}) at step {checkpoint.get('global_step', '?')}{why}: not writing "
            f"{str(path)!r}; {then} (distlab.callbacks.SyncEarlyStopping stops every rank at a non-finite loss)"
        )


def install_verified_checkpoint_io(strategy: Any) -> None:
    """Give ``strategy`` a :class:`VerifiedCheckpointIO` unless the user chose a checkpoint writer of their own."""
    if type(strategy.checkpoint_io) is TorchCheckpointIO:  # Lightning's default (the getter creates it)
        strategy.checkpoint_io = VerifiedCheckpointIO()


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
        raise ConfigError(
            f"could not read {str(path)!r} as safetensors ({_first_line(e)}): a copy cut short, or not a file distlab "
            "export wrote; copy it again, or export the checkpoint again with distlab export"
        ) from None
    return {"hyper_parameters": hparams, "state_dict": state}


def refuse_bad_hparams(ckpt: str, class_path: str | None, hparams: dict[str, Any]) -> None:
    """A checkpoint's hyperparameters must lie in the domains the model class declares (an edited file, another
    version's): one line naming the setting, instead of the parser's message about the whole model."""
    from distlab.domains import conforms, refusal

    module, _, name = str(class_path).rpartition(".")
    try:
        hints = typing.get_type_hints(getattr(importlib.import_module(module), name).__init__)
    except Exception:  # noqa: BLE001 - a class the parser resolves its own way: it will say what is wrong
        return
    for key, value in hparams.items():
        tp = hints.get(key)
        if tp is not None and not conforms(tp, plain_value(value) if isinstance(value, list) else value):
            if isinstance(value, list) and conforms(tp, tuple(value)):
                continue  # a checkpoint stores the tuple (0.8, 0.95) as a list
            raise ConfigError(f"the checkpoint {ckpt!r}: {refusal('model.' + key, value, tp)}")


def plain_value(value: Any) -> Any:
    """A config value with its sequences as lists: a checkpoint stores the tuple (0.8, 0.95) as a list."""
    return [plain_value(v) for v in value] if isinstance(value, (list, tuple)) else value


class _NamedAfterLoggedMetrics:
    """A ModelCheckpoint's ``format_checkpoint_name`` that refuses a file-name field nothing has logged (see
    :func:`guard_checkpoint_names`). A module-level class that holds only the callback, so the spawn presets can
    pickle the callback with it."""

    def __init__(self, callback: Any) -> None:
        self.callback = callback

    def __call__(self, metrics: dict, filename: str | None = None, *args: Any, **kwargs: Any) -> str:
        import re

        template = filename if filename is not None else self.callback.filename
        missing = [f[1:] for f in re.findall(r"(\{.*?)[:\}]", template or "") if f[1:] not in metrics]
        if missing:
            logged = sorted(k for k in metrics if k not in ("epoch", "step"))
            step = metrics.get("step")
            raise ConfigError(
                f"ModelCheckpoint(filename={template!r}) names {', '.join(missing)}, which nothing has logged by step "
                f"{int(step) if step is not None else '?'} (logged: {', '.join(logged) or 'nothing'}; Lightning would "
                "write 0 there); name a metric the module logs, or log it before the checkpoint is saved"
            )
        return type(self.callback).format_checkpoint_name(self.callback, metrics, filename, *args, **kwargs)


def guard_checkpoint_names(trainer: Any) -> None:
    """Every ModelCheckpoint of ``trainer`` refuses to name a file after a metric nothing has logged: Lightning
    writes such a field as 0 (``{val_acc:.3f}`` -> ``val_acc=0.000``, a number no run measured). One-line
    ConfigError at the first save that would."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from distlab.compat import patch

    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint):
            patch(callback, "format_checkpoint_name", _NamedAfterLoggedMetrics(callback))
