"""The command line as the parser gets it: three rewrites of argv, each for a behaviour its docstring names.

Example::

    argv = classes_first(class_paths_as_classes(packaged_recipes(sys.argv[1:])))
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import yaml
from lightning.pytorch.utilities import rank_zero_info

from distlab.errors import ConfigError

SUBCOMMANDS = ("fit", "validate", "test", "predict")
RECIPES = Path(__file__).resolve().parents[1] / "configs"  # the recipes that ship inside the package


def _given(argv: list[str], *options: str) -> list[tuple[int, int, str]]:
    """(index, tokens, value) of each ``--option X`` / ``--option=X`` (``-c X``) in ``argv``, for any of ``options``."""
    found = []
    for i, arg in enumerate(argv):
        if arg in options and i + 1 < len(argv):
            found.append((i, 2, argv[i + 1]))
        elif arg.startswith(tuple(f"{o}=" for o in options if o.startswith("--"))):
            found.append((i, 1, arg.split("=", 1)[1]))
    return found


def config_files(argv: list[str]) -> list[tuple[int, str]]:
    """(index of the value, path) of every ``--config`` in ``argv``."""
    return [(i + n - 1, path) for i, n, path in _given(argv, "--config", "-c")]


def packaged_recipes(argv: list[str]) -> list[str]:
    """``--config configs/X.yaml`` reads the recipe installed with distlab when this folder has no such file."""
    out = list(argv)
    for i, value in config_files(out):
        parts = Path(value).parts
        if Path(value).exists() or Path(value).is_absolute() or "configs" not in parts:
            continue
        installed = RECIPES / Path(*parts[parts.index("configs") + 1 :])
        if installed.is_file():
            out[i] = out[i].replace(value, str(installed))
            rank_zero_info(
                f"distlab: note: {value} is not in this folder; reading the recipe installed with distlab"
            )
    return out


def _setting(cfg: object, key: str) -> tuple[bool, object]:
    """(found, value) of a dotted ``key`` in a parsed config (a class's ``init_args`` looked through)."""
    node = cfg
    for part in key.split("."):
        if isinstance(node, dict) and part not in node and isinstance(node.get("init_args"), dict):
            node = node["init_args"]
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def check_config_files(argv: list[str]) -> None:
    """Refuse a ``--config`` file that is not YAML, naming the file, line and problem; and a ``--key=value`` that a
    later ``--config`` file sets otherwise: the parser applies the command line in order, so the file's value would
    win without a word (``--trainer.max_steps=2 --config recipe.yaml``)."""
    configs, loaded = config_files(argv), {}
    for _, path in configs:  # the parser would name neither the file nor the problem
        try:
            loaded[path] = yaml.safe_load(Path(path).read_text()) if Path(path).is_file() else None
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark
            where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(
                f"--config {path} is not valid YAML ({where}: {e.problem}); fix that line (a tab used to indent, or "
                "a key without its ':'?)"
            ) from None
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            loaded[path] = None  # the parser says what is wrong with it
    for i, tok in enumerate(argv):
        key, eq, value = tok.removeprefix("--").partition("=")
        if not tok.startswith("--") or not eq or key == "config":
            continue
        try:
            mine = yaml.safe_load(value)
        except yaml.YAMLError:
            continue  # the parser says what is wrong with it
        for j, path in configs:
            found, theirs = _setting(loaded[path], key) if j > i else (False, None)
            if found and not isinstance(theirs, dict) and theirs != mine:  # a class's section: classes_first
                raise ConfigError(
                    f"--{key}={value} comes before --config {path}, which sets {key}: {theirs} and would win (the "
                    f"command line applies in order); put --{key} after the --config"
                )


NAME_OR_CLASS_OPTIONS = ("--trainer.strategy", "--trainer.accelerator")


def class_paths_as_classes(argv: list[str]) -> list[str]:
    """A class path given to ``--trainer.strategy`` / ``--trainer.accelerator`` means the class (jsonargparse takes a
    bare dotted path there as a name, which Lightning then refuses)."""
    out = list(argv)
    for i, n, value in _given(argv, *NAME_OR_CLASS_OPTIONS):
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", value):
            continue
        module, _, name = value.rpartition(".")
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue  # the parser says it does not import
        if isinstance(found, type):
            spec = json.dumps({"class_path": value})
            out[i + n - 1] = spec if n == 2 else f"{argv[i].split('=', 1)[0]}={spec}"
    return out


def _class_in_file(path: str, key: str | None = None) -> str | None:
    """The class a config file names: its ``class_path`` (a class file), or its ``key:`` section's."""
    try:
        cfg = yaml.safe_load(Path(path).read_text()) if Path(path).is_file() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # the parser reads it and says what is wrong
    node = cfg.get(key) if key and isinstance(cfg, dict) else cfg
    if isinstance(node, str) and key:
        return node
    return node.get("class_path") if isinstance(node, dict) else None


def classes_given(argv: list[str]) -> dict[str, str]:
    """{model / data: the class the command line or its config files name} (the last named wins)."""
    given = {}
    for key in ("model", "data"):
        for _, path in config_files(argv):
            given[key] = _class_in_file(path, key) or given.get(key)
        on_line = _given(argv, f"--{key}", f"--{key}.class_path")
        if on_line:
            given[key] = _class_in_file(on_line[-1][2]) or on_line[-1][2]
    return {k: v for k, v in given.items() if v}


def classes_first(argv: list[str]) -> list[str]:
    """The one class chosen on the command line for model / data (no config file names one) right after the
    subcommand, so that the recipe's values apply to it; a class file (``--model model.yaml``) puts its class first
    and stays where it is, so its init_args apply after the recipe's."""
    sub = next((i for i, tok in enumerate(argv) if tok in SUBCOMMANDS), None)
    if sub is None:
        return list(argv)
    front, skip = [], set()
    for key in ("model", "data"):
        on_line = _given(argv, f"--{key}", f"--{key}.class_path")
        in_files = any(_class_in_file(path, key) for _, path in config_files(argv))
        if len(on_line) != 1 or in_files or on_line[0][0] < sub:
            continue
        i, n, value = on_line[0]
        if value.endswith((".yaml", ".yml")) and Path(value).is_file():
            named = _class_in_file(value)
            front += [f"--{key}", named] if named else []
        else:
            front += argv[i : i + n]
            skip |= set(range(i, i + n))
    rest = [tok for j, tok in enumerate(argv) if j not in skip]
    return [*rest[: sub + 1], *front, *rest[sub + 1 :]]
