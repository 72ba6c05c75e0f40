"""``python -m distlab.data.prepare ...``: ``distlab prepare ...`` (kept for scripts written before the subcommand).

The command itself, its options and their domains live in :mod:`distlab.data.shards` (:func:`prepare`).
"""

from __future__ import annotations

import sys

from distlab.data.shards import prepare, write_shards

__all__ = ["main", "prepare", "write_shards"]


def main(argv: list[str] | None = None) -> int:
    """``python -m distlab.data.prepare ...``: ``distlab prepare ...``, returning its exit status."""
    from distlab.cli import argument_list
    from distlab.cli import main as distlab_main

    argv = argument_list(argv, "distlab.data.prepare.main")
    try:
        distlab_main(["prepare", *(sys.argv[1:] if argv is None else argv)])
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
