"""``python -m distlab.data.prepare ...`` is ``distlab prepare ...`` (:func:`distlab.data.shards.prepare`)."""

from __future__ import annotations

import sys

from distlab.data.shards import prepare, write_shards

__all__ = ["main", "prepare", "write_shards"]


def main(argv: list[str] | None = None) -> int:
    """``distlab prepare ...``, returning its exit status."""
    from distlab.cli import main as distlab_main

    try:
        distlab_main(["prepare", *(sys.argv[1:] if argv is None else argv)])
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
