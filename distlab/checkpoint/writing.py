"""Writing checkpoints so that nothing is lost: whole files or a stopped run, never NaN over a good checkpoint, and
file names that hold only numbers the run measured."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from distlab.checkpoint.integrity import check_intact
from distlab.checkpoint.reading import first_non_finite
from distlab.errors import ConfigError, DistlabError


@contextlib.contextmanager
def _atomic_target(out_path: Path) -> Iterator[Path]:
    """Yield a temporary name next to ``out_path``; on success it replaces ``out_path``, on any failure it is
    removed (nothing half-written is ever left under either name). The file gets the mode of the one it replaces,
    or the mode any new file gets under the umask (not mkstemp's 0600: others could not read it)."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    mode = out_path.stat().st_mode & 0o777 if out_path.exists() else 0o666 & ~_umask()
    fd, name = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=out_path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, mode)
        tmp.replace(out_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class VerifiedCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` for local files, except that every save either writes the whole file
    (a temporary name renamed into place) or stops the run with a one-line :class:`~distlab.errors.DistlabError`
    naming the file, and never writes NaN/Inf weights; a load checks the file's CRC-32s first. Remote
    (``scheme://``) paths go to Lightning's writer and reader."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        # never NaN/Inf weights over a checkpoint (last.ckpt is replaced at every save: the last good weights would go)
        name = first_non_finite(checkpoint.get("state_dict") or {})
        if name is not None:
            raise DistlabError(
                f"the weights hold NaN/Inf ({name}) at step {checkpoint.get('global_step', '?')}: not writing "
                f"{str(path)!r}; the checkpoints saved before stay as they are: resume from the last one with a lower "
                "learning rate (distlab.callbacks.SyncEarlyStopping stops every rank at a non-finite loss)"
            )
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        try:
            with _atomic_target(Path(path)) as tmp:
                torch.save(checkpoint, tmp)
        except OSError as e:
            raise DistlabError(
                f"could not write the checkpoint {str(path)!r} ({e.strerror or type(e).__name__}); the run stops "
                "so that no more training goes unsaved: make the folder writable (or free space) and resume from "
                "the last checkpoint written"
            ) from None

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Lightning's load, after the file's CRC-32s are checked: a damaged checkpoint is a one-line ConfigError
        naming it, never weights with changed bytes."""
        if "://" not in str(path):
            check_intact(path)
        return super().load_checkpoint(path, *args, **kwargs)


def install_verified_checkpoint_io(strategy: Any) -> None:
    """Give ``strategy`` a :class:`VerifiedCheckpointIO` unless the user chose a checkpoint writer of their own."""
    if type(strategy.checkpoint_io) is TorchCheckpointIO:  # Lightning's default (the getter creates it)
        strategy.checkpoint_io = VerifiedCheckpointIO()


def _umask() -> int:
    """This process's umask, read from /proc without setting it (os.umask, racy with other threads, elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


class _NamedAfterLoggedMetrics:
    """A ModelCheckpoint's ``format_checkpoint_name`` that refuses a file-name field nothing has logged (a
    module-level class, so the spawn presets can pickle the callback with it)."""

    def __init__(self, callback: Any) -> None:
        self.callback = callback

    def __call__(self, metrics: dict, filename: str | None = None, *args: Any, **kwargs: Any) -> str:
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
    """Every ModelCheckpoint of ``trainer`` refuses (one-line ConfigError at the first save) to name a file after a
    metric nothing has logged: Lightning writes such a field as 0 (``val_acc=0.000``, a number no run measured)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from distlab.compat import patch

    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint):
            patch(callback, "format_checkpoint_name", _NamedAfterLoggedMetrics(callback))
