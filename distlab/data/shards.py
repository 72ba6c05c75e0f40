"""``distlab prepare``'s work: tokenize text into uint16 .bin shards (modded-nanogpt format: 256-int32 header, then tokens).

    distlab prepare --out data_cache/stdlib                                # the embedded stdlib corpus
    distlab prepare --paths ~/code/myproject --out data_cache/myproject --shard_tokens 50000000
    distlab fit --config configs/demo_cpu.yaml --data.paths=[data_cache/stdlib]

Train/val membership is decided per document by a stable hash of its path (same as the in-memory
loader), so the shards hold exactly the split `distlab fit` would use. Writes are atomic.

The options and their domains are :func:`prepare`'s signature: the CLI builds its parser from it, like
``generate`` and ``export``, so a value outside its domain is one line before anything is read or written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from distlab.data.corpus import load_corpus, write_bin_shard
from distlab.domains import (
    ExistingPath,
    FileSuffix,
    OpenUnitInterval,
    ShardTokens,
    WritableFolder,
    check_domains,
)
from distlab.errors import ConfigError

# The corpus loader names distlab fit's settings in its messages; prepare's options for the same things.
_OPTION_NAMES = {
    "data.extensions: null": "--extensions with no value",
    "data.paths": "--paths",
    "data.val_fraction": "--val_fraction",
    "data.extensions": "--extensions",
}


def _in_prepares_words(message: str) -> str:
    for setting, option in _OPTION_NAMES.items():
        message = message.replace(setting, option)
    return message


def write_shards(arrays: list[np.ndarray], out: Path, prefix: str, shard_tokens: int) -> list[Path]:
    tokens = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint16)
    paths, starts = [], range(0, max(len(tokens), 1), shard_tokens)
    width = max(3, len(str(len(starts) - 1)))  # one width for every name: sorted by name is the order written
    for i, start in enumerate(starts):
        path = out / f"{prefix}_{i:0{width}d}.bin"
        write_bin_shard(path, tokens[start : start + shard_tokens])
        paths.append(path)
    return paths


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def prepare(
    out: WritableFolder,
    paths: list[ExistingPath] | None = None,
    val_fraction: OpenUnitInterval = 0.02,
    extensions: list[FileSuffix] = [".py", ".txt", ".md", ".rst"],  # noqa: B006 - read only
    shard_tokens: ShardTokens = 100_000_000,
    overwrite: bool = False,
) -> list[Path]:
    """Tokenize text files into train_*.bin / val_*.bin shards that distlab fit reads with --data.paths.

    Args:
        out: output folder for train_*.bin / val_*.bin (not inside a --paths folder)
        paths: text files/folders (not given: the embedded Python stdlib)
        val_fraction: share of the documents held out for validation, in (0, 1) (one file: its last share)
        extensions: which files a folder in --paths contributes, as distlab fit's data.extensions (none given: every file)
        shard_tokens: tokens per shard file (at least 65,536: a smaller shard is mostly its 1 KB header, and shorter
            than a long context's window)
        overwrite: replace a dataset prepared in --out before (its shards are removed)
    """
    check_domains(prepare, locals(), python=False)  # a command's options: a config's words
    if paths is not None and not paths:
        raise ConfigError(
            "--paths names no files; leave --paths out for the embedded corpus, or list files and folders"
        )
    target = Path(out).expanduser().resolve()
    seen: dict[Path, str] = {}
    for source in paths or ():
        same = seen.setdefault(Path(source).expanduser().resolve(), str(source))
        if same != str(source) or list(map(str, paths)).count(str(source)) > 1:
            raise ConfigError(
                f"--paths gives {source} twice{f' (also as {same})' if same != str(source) else ''}: its text would be "
                "read twice; give each file or folder once"
            )
    for source in paths or ():
        folder = Path(source).expanduser().resolve()
        if folder.is_dir() and _inside(target, folder):
            raise ConfigError(
                f"--out {out} lies inside --paths {source}: the shards would be written among the text they are made "
                "from (and read back as part of it next time); choose an --out outside the source folders"
            )
    others = sorted(p.name for p in target.iterdir() if p.suffix != ".bin") if target.is_dir() else []
    if (
        others
    ):  # fit refuses a folder of shards that also holds text (it would be read as shards, the text ignored)
        raise ConfigError(
            f"--out {out} holds other files than token shards ({', '.join(others[:3])}{' ...' if len(others) > 3 else ''}); "
            "the shards would be mixed with them (and a text file there would be skipped when fit reads the folder as "
            "shards); choose an empty or new folder"
        )
    # every .bin file there: distlab fit reads them all as one dataset, not only the shards prepare writes
    earlier = sorted(target.glob("*.bin")) if target.is_dir() else []
    if earlier and not overwrite:
        raise ConfigError(
            f"--out {out} already holds token shards ({len(earlier)} .bin file(s), {earlier[0].name} ...), which "
            "distlab fit would read together with the new ones; pass --overwrite to replace them, or choose another folder"
        )
    try:
        splits = load_corpus(paths, val_fraction, tuple(extensions) or None)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(_in_prepares_words(str(e))) from None
    if splits.n_val == 0 or splits.n_train == 0:
        empty = "validation" if splits.n_val == 0 else "training"
        raise ConfigError(
            f"the {empty} split of {splits.description} is empty with --val_fraction {val_fraction} (documents are "
            f"split by a hash of their path); {'raise' if splits.n_val == 0 else 'lower'} --val_fraction or add files"
        )
    try:
        target.mkdir(parents=True, exist_ok=True)
        train = write_shards(splits.train, target, "train", shard_tokens)
        val = write_shards(splits.val, target, "val", shard_tokens)
    except OSError as e:
        raise ConfigError(f"cannot write the shards to {out}: {e.strerror or e}") from None
    for stale in (
        set(earlier) - set(train) - set(val)
    ):  # the replaced dataset's shards the new one does not reuse
        stale.unlink()
    print(
        f"{splits.description}: {splits.n_train:,} train tokens in {len(train)} shard(s), "
        f"{splits.n_val:,} val tokens in {len(val)} shard(s) -> {target}"
    )
    return train + val
