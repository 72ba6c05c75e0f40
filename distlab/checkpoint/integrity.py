"""Checkpoints you can trust: a damaged one is refused in one line, and a resume picks the newest intact one.

A ``.ckpt`` file is a zip whose every record carries the CRC-32 ``torch.save`` wrote with it; torch's reader never
checks them, :func:`damage` does (one streaming pass over the file). A DCP folder (FSDP2 / HSDP) gets the same
record from :func:`write_record`: ``integrity.json``, a CRC-32 and size per file, written after every rank's shards.

Example::

    why = damage("runs/x/checkpoints/last.ckpt")    # None, or "record archive/data/3 fails its CRC-32 ..."
"""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path

from distlab.errors import ConfigError

RECORD = "integrity.json"
_CHUNK = 1 << 22
# (file, mtime, size) -> its first bad record, or None: a file already read as it is now is not read again
_FILES_SEEN: dict[tuple[str, int, int], str | None] = {}


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def write_record(folder: str | Path) -> None:
    """Write ``folder``'s integrity record: every file's CRC-32 and size (call once every file is written)."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != RECORD)
    record = {str(p.relative_to(folder)): [_crc32(p), p.stat().st_size] for p in files}
    tmp = folder / f".{RECORD}.tmp"
    tmp.write_text(json.dumps(record, indent=0))
    tmp.replace(folder / RECORD)


def damage(path: str | Path) -> str | None:
    """What is damaged in the checkpoint at ``path`` (a ``.ckpt`` file or a DCP folder), in words; None if intact
    (a folder without a record, written before records existed, counts as intact)."""
    path = Path(path)
    if path.is_dir():
        record_file = path / RECORD
        if not record_file.is_file():
            return None
        for name, (crc, size) in json.loads(record_file.read_text()).items():
            part = path / name
            if not part.is_file():
                return f"{name} is missing"
            if part.stat().st_size != size or _crc32(part) != crc:
                return f"{name} differs from the CRC-32 written with it"
        return None
    try:
        st = path.stat()
        key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
        if key not in _FILES_SEEN:
            with zipfile.ZipFile(path) as z:
                _FILES_SEEN[key] = z.testzip()  # every record read and checked against its CRC-32
        bad = _FILES_SEEN[key]
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        return f"not a whole checkpoint file ({e})"
    return None if bad is None else f"record {bad} fails its CRC-32 (bytes changed after it was written)"


def check_intact(path: str | Path) -> None:
    """One-line ConfigError naming the file when the checkpoint at ``path`` is damaged."""
    why = damage(path)
    if why is not None:
        raise ConfigError(
            f"the checkpoint {str(path)!r} is damaged: {why}; resume from an earlier checkpoint (--ckpt_path "
            "last picks the newest intact one)"
        )
