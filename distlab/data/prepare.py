"""Tokenize text into uint16 .bin shards (modded-nanogpt format: 256-int32 header, then tokens).

    python -m distlab.data.prepare --out data_cache/stdlib                 # the embedded stdlib corpus
    python -m distlab.data.prepare --paths ~/code/myproject --out data_cache/myproject --shard_tokens 50000000
    (from the repository also: python scripts/prepare_data.py ...)
    distlab fit --config configs/demo_cpu.yaml --data.paths=[data_cache/stdlib]

Train/val membership is decided per document by a stable hash of its path (same as the in-memory
loader), so the shards hold exactly the split `distlab fit` would use. Writes are atomic.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from distlab.data.corpus import load_corpus, write_bin_shard

# The corpus loader names distlab fit's settings in its messages; prepare's options for the same things.
_OPTION_NAMES = {
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
    paths = []
    for i, start in enumerate(range(0, max(len(tokens), 1), shard_tokens)):
        path = out / f"{prefix}_{i:03d}.bin"
        write_bin_shard(path, tokens[start : start + shard_tokens])
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--paths", nargs="*", default=None, help="text files/folders (default: Python stdlib)"
    )
    parser.add_argument("--out", required=True, help="output folder for train_*.bin / val_*.bin")
    parser.add_argument(
        "--val_fraction",
        type=float,
        default=0.02,
        help="share of the documents held out for validation, in (0, 1)",
    )
    parser.add_argument(
        "--extensions",
        nargs="*",
        default=[".py", ".txt", ".md", ".rst"],
        help="which files a folder in --paths contributes, as distlab fit's data.extensions (none given: every file)",
    )
    parser.add_argument("--shard_tokens", type=int, default=100_000_000)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a dataset prepared in --out before (its shards are removed)",
    )
    args = parser.parse_args(argv)
    if not 0.0 < args.val_fraction < 1.0:
        percent = " (a share, not a percent: 10 means 0.1)" if 1 <= args.val_fraction <= 100 else ""
        print(
            f"prepare_data: error: --val_fraction {args.val_fraction:g} is not a share of the documents{percent}; set "
            "--val_fraction in (0, 1), e.g. 0.02",
            file=sys.stderr,
        )
        return 2
    if args.shard_tokens < 1:
        print(f"prepare_data: error: --shard_tokens must be >= 1, got {args.shard_tokens}", file=sys.stderr)
        return 2
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        print(
            f"prepare_data: error: --out {args.out} is a file; give a folder for the shards", file=sys.stderr
        )
        return 2
    # every .bin file there: distlab fit reads them all as one dataset, not only the shards prepare writes
    earlier = sorted(out.glob("*.bin")) if out.is_dir() else []
    if earlier and not args.overwrite:
        print(
            f"prepare_data: error: --out {args.out} already holds token shards ({len(earlier)} .bin file(s), "
            f"{earlier[0].name} ...), which distlab fit would read together with the new ones; pass --overwrite to "
            "replace them, or choose another folder",
            file=sys.stderr,
        )
        return 2
    try:
        splits = load_corpus(args.paths, args.val_fraction, tuple(args.extensions) or None)
    except (FileNotFoundError, ValueError) as e:
        print(f"prepare_data: error: {_in_prepares_words(str(e))}", file=sys.stderr)
        return 2
    if splits.n_val == 0 or splits.n_train == 0:
        empty = "validation" if splits.n_val == 0 else "training"
        print(
            f"prepare_data: error: the {empty} split of {splits.description} is empty with --val_fraction "
            f"{args.val_fraction} (documents are split by a hash of their path); "
            f"{'raise' if splits.n_val == 0 else 'lower'} --val_fraction or add files",
            file=sys.stderr,
        )
        return 2
    try:
        out.mkdir(parents=True, exist_ok=True)
        train = write_shards(splits.train, out, "train", args.shard_tokens)
        val = write_shards(splits.val, out, "val", args.shard_tokens)
    except OSError as e:
        print(
            f"prepare_data: error: cannot write the shards to {args.out}: {e.strerror or e}", file=sys.stderr
        )
        return 2
    for stale in (
        set(earlier) - set(train) - set(val)
    ):  # the replaced dataset's shards the new one does not reuse
        stale.unlink()
    print(
        f"{splits.description}: {splits.n_train:,} train tokens in {len(train)} shard(s), "
        f"{splits.n_val:,} val tokens in {len(val)} shard(s) -> {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
