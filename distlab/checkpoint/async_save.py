"""Asynchronous distributed checkpoints (FSDP2 / HSDP): the training step waits for the staging copy only.

A save writes into a hidden folder ``.NAME.partial`` beside its target (what a crash leaves: see docs/guide.md,
section 3), in a background thread over a process group of its own (never the one training uses). When every
rank's files are written, rank 0 adds the integrity record and renames the folder to ``NAME``. One save is in
flight at a time; the next one, a removal of its target, and the end of the fit wait for it.

Example (what :class:`~distlab.strategies.FSDP2Strategy` does with ``async_save=True``)::

    writer = AsyncCheckpointWriter()
    writer.save({"state_dict": ..., "optimizer_0": ...}, meta, Path("ckpts/step=8.ckpt"), rank == 0)  # every rank
    writer.wait()                                                    # every rank: the folder is complete
"""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distlab.checkpoint.integrity import write_record
from distlab.checkpoint.reading import METADATA_FILENAME
from distlab.errors import DistlabError


class AsyncCheckpointWriter:
    """Writes DCP checkpoint folders in the background, one at a time (every rank calls every method)."""

    def __init__(self) -> None:
        self._group: dist.ProcessGroup | None = None
        self._pending: tuple[Future, Path, threading.Event] | None = None

    @property
    def target(self) -> Path | None:
        """The folder the save in flight will become (None when none is)."""
        return None if self._pending is None else self._pending[1]

    def save(self, state: dict[str, Any], meta: dict[str, Any], path: Path, is_zero: bool) -> None:
        """Stage ``state`` (tensors, DTensors) and start writing it to ``path`` in the background; rank 0 also
        writes ``meta`` (the checkpoint's other entries). Returns once the state is copied."""
        from torch.distributed.checkpoint import async_save

        self.wait()
        if self._group is None:  # collective, once: the background writes never share training's group
            self._group = dist.new_group(backend="gloo")
        partial = path.with_name(f".{path.name}.partial")  # a name no checkpoint search matches
        if is_zero:
            shutil.rmtree(partial, ignore_errors=True)  # left by a save that was killed
            partial.mkdir(parents=True)
        dist.barrier(group=self._group)
        future = async_save(state, checkpoint_id=str(partial), process_group=self._group)
        if is_zero:
            torch.save(meta, partial / METADATA_FILENAME)
        done = threading.Event()

        def finish(f: Future) -> None:
            try:
                if is_zero and f.exception() is None:  # rank 0's write ends after every rank's
                    write_record(partial)
                    aside = path.with_name(f".{path.name}.old")  # an older checkpoint of that name
                    shutil.rmtree(aside, ignore_errors=True)
                    if path.is_dir():
                        path.rename(aside)
                    elif path.exists():
                        path.unlink()
                    partial.rename(path)
                    shutil.rmtree(aside, ignore_errors=True)
            finally:
                done.set()

        future.add_done_callback(finish)
        self._pending = (future, path, done)

    def wait(self) -> None:
        """Block until the save in flight is complete (its folder renamed); a failed write is one DistlabError."""
        if self._pending is None:
            return
        future, path, done = self._pending
        self._pending = None
        try:
            future.result()
        except Exception as e:  # noqa: BLE001 - a disk error, a rank that died: said in one line
            raise DistlabError(
                f"the checkpoint {str(path)!r} was not written ({type(e).__name__}: {e}); the previous complete "
                "checkpoint is kept: free the disk or fix the folder, then resume from it"
            ) from e
        done.wait()
