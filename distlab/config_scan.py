"""Where settings sit in ``--config`` files and argv, read without judging them (:mod:`distlab.command_line` checks
the files; :mod:`distlab.cli_errors` asks where an option was written to word its message).

Example::

    config_args(["fit", "--config", "a.yaml"])                # [(1, 'a.yaml')]
    written_for(argv, "lightning.pytorch.callbacks.ModelCheckpoint", "every_n_train_step")   # "init_args"
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml


def config_args(argv: list[str]) -> list[tuple[int, str]]:
    """(index, path) of every ``--config`` in ``argv``."""
    out = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            out.append((i, argv[i + 1]))
        elif arg.startswith("--config="):
            out.append((i, arg.split("=", 1)[1]))
    return out


def class_entries(node: Any, key: str = "") -> Iterator[tuple[str, dict]]:
    """(dotted place, entry) of every class entry (a mapping with class_path) anywhere in a config."""
    if isinstance(node, dict):
        if "class_path" in node:
            yield key or "(top level)", node
        for k, v in node.items():
            yield from class_entries(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from class_entries(v, f"{key} item {i + 1}")


def written_for(argv: list[str], class_path: str, option: str) -> str | None:
    """Where the ``--config`` files of ``argv`` set ``option`` for ``class_path`` itself: ``"init_args"`` (among
    its settings, a misspelt or foreign option of that class), ``"entry"`` (beside class_path, where only
    class_path / init_args belong), or None (not in a config file naming that class)."""
    short = class_path.rsplit(".", 1)[-1]
    for _, path in config_args(argv):
        try:
            cfg = yaml.safe_load(Path(path).read_text()) if Path(path).is_file() else None
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # the file's own problem is said by the code that reads it for the parser
        for _, entry in class_entries(cfg):
            if str(entry.get("class_path", "")).rsplit(".", 1)[-1] != short:
                continue
            if isinstance(entry.get("init_args"), dict) and option in entry["init_args"]:
                return "init_args"
            if option in entry:
                return "entry"
    return None
