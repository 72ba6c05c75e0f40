"""Token corpora: the embedded Python stdlib source, user text files, and uint16 ``.bin`` shards.

Every corpus becomes two lists of uint16 token arrays (train, val). Documents are prefixed with
the BOS token. Train/val membership of a document is decided by a stable hash of its path
relative to its root, so the split does not depend on file order or on the machine.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from distlab.data.tokenizer import ByteTokenizer
from distlab.domains import ExistingPath, FileSuffix, OpenUnitInterval, check_domains
from distlab.errors import ConfigError

BIN_MAGIC = 20240520  # modded-nanogpt shard header: 256 int32, [magic, version, n_tokens, ...]
BIN_HEADER_INTS = 256


def stable_fraction(key: str) -> float:
    """Map a string to [0, 1) deterministically (sha1; independent of PYTHONHASHSEED)."""
    # surrogateescape: a file name that is not UTF-8 hashes by its own bytes
    return int.from_bytes(hashlib.sha1(key.encode("utf-8", "surrogateescape")).digest()[:8], "big") / 2**64


def is_val(key: str, val_fraction: float) -> bool:
    return stable_fraction(key) < val_fraction


def stdlib_files() -> list[tuple[str, Path]]:
    """(relative key, path) for every .py file of the running interpreter's stdlib, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")]
        rel = Path(dirpath).relative_to(root)
        out += [((rel / n).as_posix(), Path(dirpath) / n) for n in filenames if n.endswith(".py")]
    return sorted(out)  # (the walk's order is the file system's)


def _files_under(root: Path) -> list[Path]:
    """Every file under ``root``, sorted, following symlinked folders, each real folder once (a link cycle ends)."""
    seen: set[str] = set()
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        out += [f for n in filenames if (f := Path(dirpath) / n).is_file()]
    return sorted(out)


def text_files(paths: Iterable[str], extensions: tuple[str, ...] | None) -> list[tuple[str, Path]]:
    """(key, path) for user files/folders. Folders are walked; ``extensions`` filters folder contents."""
    out = []
    for raw in paths:
        p = Path(raw).expanduser()
        if not p.is_dir():
            out.append((p.name, p))
            continue
        found = _files_under(p)
        kept = [f for f in found if extensions is None or f.suffix in extensions]
        if found and not kept:
            suffixes = sorted({f.suffix or "(none)" for f in found})[:6]
            raise ConfigError(
                f"no file under {raw!r} ends in data.extensions={list(extensions or ())} (its files end in "
                f"{', '.join(suffixes)}); add those to data.extensions, or set data.extensions: null for every file"
            )
        out += [(f.relative_to(p).as_posix(), f) for f in kept]
    return out


@dataclass
class TokenSplits:
    train: list[np.ndarray]
    val: list[np.ndarray]
    description: str
    n_files: int | None = None  # text files read (None for token shards)
    # text files: (name, tokens) of each document in each split
    train_docs: list[tuple[str, int]] = field(default_factory=list)
    val_docs: list[tuple[str, int]] = field(default_factory=list)

    @property
    def n_train(self) -> int:
        return sum(len(a) for a in self.train)

    @property
    def n_val(self) -> int:
        return sum(len(a) for a in self.val)


def tokenize_documents(files: list[tuple[str, Path]], val_fraction: float, tok: ByteTokenizer) -> TokenSplits:
    train, val, train_docs, val_docs = [], [], [], []
    for key, path in files:
        data = path.read_bytes()
        if (nul := data.find(b"\0", 0, 1 << 16)) >= 0:  # no text holds one; checkpoints, images, archives do
            raise ConfigError(
                f"data.paths: {str(path)!r} is not text (a NUL byte at offset {nul}: a checkpoint, image or "
                "archive?); give text files or folders of them, or token shards written by distlab prepare"
            )
        tokens = tok.encode_array(data, bos=True)
        # one document: its last val_fraction is held out (there is no other file to hold out)
        if len(files) == 1:
            cut = len(tokens) - max(1, round(len(tokens) * val_fraction))
            return TokenSplits(
                [tokens[:cut]], [tokens[cut:]], f"1 file (its last {val_fraction:g} held out)", n_files=1
            )
        held_out = is_val(key, val_fraction)
        (val if held_out else train).append(tokens)
        (val_docs if held_out else train_docs).append((key, len(tokens)))
    cat = lambda xs: [np.concatenate(xs)] if xs else []  # noqa: E731
    return TokenSplits(cat(train), cat(val), f"{len(files)} files", len(files), train_docs, val_docs)


def read_bin_shard(path: Path) -> np.ndarray:
    """Memory-map a uint16 token shard: modded-nanogpt format (256-int32 header) or raw nanoGPT format.

    A shard whose size does not match its header (a truncated copy, shards joined) is a one-line ConfigError."""
    header = np.fromfile(path, dtype=np.int32, count=3)
    if len(header) == 3 and header[0] == BIN_MAGIC:
        n, offset = int(header[2]), BIN_HEADER_INTS * 4
        if (size := path.stat().st_size) != offset + 2 * n:  # past the count: dropped without a word
            raise ConfigError(
                f"{str(path)!r} does not match its header: it says {n:,} tokens ({offset + 2 * n:,} bytes), the file "
                f"has {size:,} bytes (a truncated copy, or shards joined?); copy it again or re-create it with "
                "distlab prepare"
            )
        return np.memmap(path, dtype=np.uint16, mode="r", offset=offset, shape=(n,))
    return np.memmap(path, dtype=np.uint16, mode="r")


def write_bin_shard(path: Path, tokens: np.ndarray) -> None:
    """Write tokens in the modded-nanogpt format, atomically (temp file + rename)."""
    tokens = np.asarray(tokens)
    if tokens.size and int(tokens.max()) >= 2**16:
        raise ValueError(f"token id {int(tokens.max())} does not fit uint16")
    header = np.zeros(BIN_HEADER_INTS, dtype=np.int32)
    header[:3] = [BIN_MAGIC, 1, len(tokens)]
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            f.write(tokens.astype(np.uint16).tobytes())
        os.replace(tmp, path)
    except BaseException:  # a full disk, a stop: no half-written file left behind
        tmp.unlink(missing_ok=True)
        raise


def load_corpus(
    paths: ExistingPath | list[ExistingPath] | None = None,
    val_fraction: OpenUnitInterval = 0.02,
    extensions: FileSuffix | tuple[FileSuffix, ...] | None = (".py", ".txt", ".md", ".rst"),
) -> TokenSplits:
    """Load the default embedded stdlib corpus (paths=None), user text files, or .bin shards (``paths``: a list of
    files and folders, or one; a Path or any iterable of paths too). A folder holding .bin files is read as shards."""
    if isinstance(paths, Iterable) and not isinstance(paths, (str, bytes, os.PathLike)):
        paths = list(paths)  # a generator is read once
    check_domains(load_corpus, {"paths": paths, "val_fraction": val_fraction, "extensions": extensions})
    if isinstance(paths, (str, os.PathLike)):  # one path is that path, never its characters
        paths = [paths]
    if isinstance(extensions, str):  # one suffix, not its characters (a str tests `in` by substring)
        extensions = (extensions,)
    tok = ByteTokenizer()
    if paths is None:
        return tokenize_documents(stdlib_files(), val_fraction, tok)
    shards, files = [], []
    for p in paths:
        folder = Path(p).expanduser()
        bins = sorted(folder.glob("*.bin")) if folder.is_dir() else []
        texts = [f for f in folder.iterdir() if f.suffix in (extensions or ())] if bins else []
        if texts:  # a folder is read as shards or as text, never as both
            raise ConfigError(
                f"data path {str(p)!r} holds .bin files ({', '.join(b.name for b in bins[:3])}), so it would be read as "
                f"token shards and its {len(texts)} text files ignored; move the .bin files out to train on the text, "
                "or put the shards in a folder of their own"
            )
        shards.append(str(p).endswith(".bin") or bool(bins))
        files += bins if folder.is_dir() else [folder]
    if all(shards):  # shards whose file name contains 'val' are validation; the rest are training
        if not files:
            raise ConfigError(f"no .bin shards found under {paths}; run distlab prepare first")
        train = [read_bin_shard(f) for f in files if "val" not in f.name]
        val = [read_bin_shard(f) for f in files if "val" in f.name]
        return TokenSplits(train, val, f"{len(files)} .bin shards")
    if any(shards):
        mixed = [str(p) for p, is_shard in zip(paths, shards, strict=True) if is_shard]
        raise ConfigError(
            f"data.paths mixes token shards ({', '.join(mixed[:2])}) with text files; a shard read as text would be "
            "trained on as bytes: give only .bin shards, or only text files and folders"
        )
    return tokenize_documents(text_files(paths, extensions), val_fraction, tok)
