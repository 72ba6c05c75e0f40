"""``distlab prepare``'s work: tokenize text into uint16 .bin shards (modded-nanogpt format: 256-int32 header, then tokens);
the commands that make and train on them are in docs/guide.md, section 5.

Train/val membership is decided per document by a stable hash of its path (same as the in-memory
loader), so the shards hold exactly the split `distlab fit` would use. Writes are atomic. The CLI builds
the command's parser from :func:`prepare`'s signature.
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
from distlab.log import info_rank0


def write_shards(arrays: list[np.ndarray], out: Path, prefix: str, shard_tokens: int) -> list[Path]:
    tokens = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint16)
    starts = range(0, max(len(tokens), 1), shard_tokens)
    width = max(3, len(str(len(starts) - 1)))  # one width for every name: sorted by name is the order written
    paths = [out / f"{prefix}_{i:0{width}d}.bin" for i in range(len(starts))]
    for path, start in zip(paths, starts, strict=True):
        write_bin_shard(path, tokens[start : start + shard_tokens])
    return paths


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
        shard_tokens: tokens per shard file (at least 65,536: a smaller shard is mostly its 1 KB header)
        overwrite: replace a dataset prepared in --out before (its shards are removed)
    """
    check_domains(prepare, locals(), python=False)  # a command's options: a config's words
    if paths is not None and not paths:
        raise ConfigError(
            "--paths names no files; leave --paths out for the embedded corpus, or list files and folders"
        )
    target = Path(out).expanduser().resolve()
    for source in paths or ():
        folder = Path(source).expanduser().resolve()
        if folder.is_dir() and (target == folder or folder in target.parents):
            raise ConfigError(
                f"--out {out} lies inside --paths {source}: the shards would be written among the text they are made "
                "from (and read back as part of it next time); choose an --out outside the source folders"
            )
    # every .bin file there: distlab fit reads them all as one dataset, not only the shards prepare writes
    earlier = sorted(target.glob("*.bin")) if target.is_dir() else []
    if earlier and not overwrite:
        raise ConfigError(
            f"--out {out} already holds token shards ({len(earlier)} .bin file(s), {earlier[0].name} ...), which "
            "distlab fit would read together with the new ones; pass --overwrite to replace them, or choose another folder"
        )
    splits = load_corpus(paths, val_fraction, tuple(extensions) or None)
    if splits.n_val == 0 or splits.n_train == 0:
        empty = "validation" if splits.n_val == 0 else "training"
        raise ConfigError(
            f"the {empty} split of {splits.description} is empty with --val_fraction {val_fraction} (documents are "
            f"split by a hash of their path); {'raise' if splits.n_val == 0 else 'lower'} --val_fraction or add files"
        )
    target.mkdir(parents=True, exist_ok=True)
    train = write_shards(splits.train, target, "train", shard_tokens)
    val = write_shards(splits.val, target, "val", shard_tokens)
    for stale in set(earlier) - set(train) - set(val):  # the replaced dataset's shards not reused
        stale.unlink()
    info_rank0(
        f"{splits.description}: {splits.n_train:,} train tokens in {len(train)} shard(s), "
        f"{splits.n_val:,} val tokens in {len(val)} shard(s) -> {target}"
    )
    return train + val
