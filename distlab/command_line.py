"""The command line and its ``--config`` files, read and checked before jsonargparse parses them.

What the parser cannot say well in one line is found here, on the raw argv and the YAML files: a file that is not
UTF-8, not YAML, empty, keyed by subcommand, or holds settings beside ``class_path``; a flag placed before the
``--config`` that overrides it; a class path that does not import; a subcommand that does not exist; bytes that are
not text. Two rewrites of argv remain, each for a jsonargparse behaviour its docstring names:
:func:`class_paths_as_classes` and :func:`classes_first`; and :func:`packaged_recipes` finds the recipes that ship
inside the package.

Example::

    cfg = read_config_file("configs/debug.yaml")          # {'model': {...}, 'trainer': {...}} or a one-line error
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from distlab.cli_errors import SUBCOMMAND_OPTIONS, subclasses
from distlab.commands import FUNCTION_COMMANDS
from distlab.config_scan import class_entries, config_args
from distlab.errors import ConfigError, closest

SUBCOMMANDS = ("fit", "validate", "test", "predict")


def _class_arguments(argv: list[str]) -> tuple[dict[str, list[tuple[int, int, str | None]]], dict[str, str]]:
    """Where model / data classes are chosen: ``({key: [(index, n_tokens, class), ...] on the command line},
    {key: the class a --config file names})``. Each --config file is read (and checked) here."""
    on_command_line: dict[str, list[tuple[int, int, str | None]]] = {}
    in_configs: dict[str, str] = {}
    for i, arg in enumerate(argv):
        for key in ("model", "data"):
            if arg in (f"--{key}", f"--{key}.class_path"):
                on_command_line.setdefault(key, []).append((i, 2, argv[i + 1] if i + 1 < len(argv) else None))
            elif arg.startswith((f"--{key}=", f"--{key}.class_path=")):
                on_command_line.setdefault(key, []).append((i, 1, arg.split("=", 1)[1]))
        path = None
        if arg in ("--config", "-c") and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        if path is not None and not path.strip():
            raise ConfigError(
                "--config '' names no file; give the path of a YAML config (e.g. configs/debug.yaml)"
            )
        if path and Path(path).is_file():
            cfg = read_config_file(path, before_subcommand=i < _subcommand_at(argv))
            if cfg is None:
                continue  # a YAML syntax error: jsonargparse reports it with its position
            for key in ("model", "data"):
                value = cfg.get(key) if isinstance(cfg, dict) else None
                if isinstance(value, str):  # `model: MyModule`
                    in_configs[key] = value
                elif isinstance(value, dict) and "class_path" in value:
                    in_configs[key] = value["class_path"]
    return on_command_line, in_configs


RECIPES = Path(__file__).resolve().parent / "configs"  # the recipes that ship inside the package


def packaged_recipes(argv: list[str]) -> list[str]:
    """``--config configs/X.yaml`` where this folder has no such file reads the recipe installed with distlab
    (``pip install distlab`` users run the README's commands from any folder). A file that exists is used as is."""
    out = list(argv)
    for i, arg in enumerate(out):
        value, prefix = None, ""
        if arg in ("--config", "-c") and i + 1 < len(out):
            value, i = out[i + 1], i + 1
        elif arg.startswith("--config="):
            value, prefix = arg.split("=", 1)[1], "--config="
        if value is None or Path(value).exists():
            continue
        if re.match(
            r"^[a-z][a-z0-9+.-]*://", value
        ):  # read by no one: it would fall to a recipe of the same name
            raise ConfigError(
                f"--config {value} is a URL, and --config reads a local file; download it first (curl -O {value}) and "
                "give its path"
            )
        parts = Path(value).parts
        if (
            not Path(value).is_absolute()
            and "configs" in parts
            and (RECIPES / Path(*parts[parts.index("configs") + 1 :])).is_file()
        ):
            out[i] = prefix + str(RECIPES / Path(*parts[parts.index("configs") + 1 :]))
            rank_zero_info(
                f"distlab: note: {value} is not in this folder; reading the recipe installed with distlab ({out[i].removeprefix(prefix)})"
            )
    return out


# Sections of a config file and what each must hold (a mapping of settings; model/data may name a class).
SECTION_KINDS = {"trainer": (dict,), "model": (dict, str), "data": (dict, str)}


def _subcommand_at(argv: list[str]) -> int:
    """The index of the subcommand in ``argv`` (-1 when it holds none: every --config is read as after one)."""
    return next((i for i, a in enumerate(argv) if a in SUBCOMMANDS), -1)


def _sets(cfg: Any, dotted: str) -> bool:
    """Whether the config mapping sets ``dotted`` (``model.depth`` also under ``model.init_args``)."""
    node = cfg
    for part in dotted.split("."):
        if isinstance(node, dict) and part not in node and isinstance(node.get("init_args"), dict):
            node = node["init_args"]
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def check_argument_order(argv: list[str]) -> None:
    """Arguments apply in order, so a flag before a --config that sets the same key is silently overridden: refused.
    A later config's ``trainer.callbacks`` list replaces an earlier one's (jsonargparse's rule): said in one line."""
    configs = [
        (i, p, read_config_file(p, before_subcommand=i < _subcommand_at(argv)))
        for i, p in config_args(argv)
        if Path(p).is_file()
    ]
    for i, arg in enumerate(argv):
        m = re.match(r"^--((?:trainer|model|data)\.[\w.]+?)(?:=.*)?$", arg)
        if not m or m.group(1).endswith(("help", "+")):
            continue
        later = next((p for j, p, cfg in configs if j > i and cfg and _sets(cfg, m.group(1))), None)
        if later:
            raise ConfigError(
                f"{arg} comes before --config {later}, which sets {m.group(1)} too: arguments apply in order, so "
                "yours would be ignored; put it after that --config"
            )
    with_callbacks = [
        (p, cfg["trainer"]["callbacks"]) for _, p, cfg in configs if cfg and _sets(cfg, "trainer.callbacks")
    ]
    for (first, earlier), (second, _) in zip(with_callbacks, with_callbacks[1:], strict=False):
        if isinstance(earlier, list) and earlier:
            rank_zero_info(
                f"distlab: note: --config {second} gives trainer.callbacks, which replaces the {len(earlier)} "
                f"callbacks of --config {first}; to add to a recipe's callbacks use --trainer.callbacks+=CLASS"
            )
    for i, arg in enumerate(argv):  # --trainer.callbacks=X (not +=) after a config that lists callbacks
        if not re.match(r"^--trainer\.callbacks(=|$)", arg):
            continue
        before = [
            (p, cfg["trainer"]["callbacks"])
            for j, p, cfg in configs
            if j < i and cfg and _sets(cfg, "trainer.callbacks")
        ]
        if before and isinstance(before[-1][1], list) and before[-1][1]:
            rank_zero_info(
                f"distlab: note: {arg.split('=')[0]}= replaces the {len(before[-1][1])} callbacks of --config "
                f"{before[-1][0]}; to add to them use --trainer.callbacks+=CLASS"
            )


def model_flags(argv: list[str]) -> list[str]:
    """The model settings a command line sets itself (``--model.lr=...``, ``--model.init_args.lr ...``)."""
    out = []
    for arg in argv:
        m = re.match(r"^--model\.(?:init_args\.)?([A-Za-z_]\w*)(?:=|$)", arg)
        if m and m.group(1) not in ("help", "class_path", "init_args"):
            out.append(m.group(1))
    return out


class _DuplicateKey(Exception):
    pass


class _SurprisingScalar(Exception):
    pass


def yaml11_reading(text: str) -> str | None:
    """Why a plain YAML scalar means something other than it looks (YAML 1.1, which PyYAML and jsonargparse
    read config files by): ``010`` is octal 8, ``1:30`` is base 60 (90), ``off`` is false. None for an ordinary
    number or true/false."""
    if text.lower() in ("yes", "no", "on", "off"):
        return (
            f"{text!r} is read by YAML as {str(text.lower() in ('yes', 'on')).lower()} (YAML 1.2 reads it as text); write "
            f"{str(text.lower() in ('yes', 'on')).lower()}, or quote it ('{text}') if you mean the word"
        )
    digits = text.strip().lstrip("+-").replace("_", "")
    if ":" in digits:
        return f"{text!r} is read by YAML as a base-60 number; quote it if it is text, or write the number itself"
    if len(digits) > 1 and digits[0] == "0" and digits[1] in "01234567" and digits.isdigit():
        return (
            f"{text!r} is read by YAML as octal ({int(digits, 8)}); write it without the leading zero "
            f"({int(digits)}), or quote it if it is text"
        )
    return None


FOLDER_KEY = re.compile(r"(^|_)(dir|dirpath|folder|root)$")


def tilde_as_home(key: str) -> str:
    """The words for ``key: ~`` where ``key`` names a folder: YAML reads a bare ``~`` as null, not the home folder."""
    return (
        f"{key}: ~ is YAML's null (no value), not your home folder; write null for none, or the folder "
        "itself (e.g. ~/runs, which is expanded)"
    )


def _unique_key_loader() -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_yaml_int(self, node):  # noqa: ANN001
            problem = yaml11_reading(node.value) if node.style is None else None
            if problem:
                raise _SurprisingScalar(f"line {node.start_mark.line + 1}: {problem}")
            return super().construct_yaml_int(node)

        def construct_yaml_float(self, node):  # noqa: ANN001
            problem = yaml11_reading(node.value) if node.style is None else None
            if problem:
                raise _SurprisingScalar(f"line {node.start_mark.line + 1}: {problem}")
            return super().construct_yaml_float(node)

        def construct_yaml_bool(self, node):  # noqa: ANN001
            problem = yaml11_reading(node.value) if node.style is None else None
            if problem:
                raise _SurprisingScalar(f"line {node.start_mark.line + 1}: {problem}")
            return super().construct_yaml_bool(node)

        def construct_mapping(self, node, deep=False):  # noqa: ANN001
            seen: dict[Any, int] = {}
            # the mapping's own keys (a merged <<: *anchor may be overridden)
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                if (
                    getattr(value_node, "value", None) == "~"
                    and value_node.style is None
                    and FOLDER_KEY.search(str(key))
                ):
                    raise _SurprisingScalar(
                        f"line {value_node.start_mark.line + 1}: {tilde_as_home(str(key))}"
                    )
                if key in seen:
                    raise _DuplicateKey(
                        f"key {key!r} appears twice (lines {seen[key]} and {key_node.start_mark.line + 1})"
                    )
                seen[key] = key_node.start_mark.line + 1
            self.flatten_mapping(node)  # YAML merge keys, as SafeLoader does
            return super().construct_mapping(node, deep=deep)

    Loader.add_constructor("tag:yaml.org,2002:bool", Loader.construct_yaml_bool)
    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    Loader.add_constructor("tag:yaml.org,2002:float", Loader.construct_yaml_float)
    return Loader


_UniqueKeyLoader = _unique_key_loader()


def _contains_itself(node: Any, place: str = "", inside: tuple[int, ...] = ()) -> str | None:
    """The dotted place where a YAML value holds itself through an alias (``a: &x {b: *x}``), or None."""
    if not isinstance(node, (dict, list)):
        return None
    if id(node) in inside:
        return place or "the top level"
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        found = _contains_itself(value, f"{place}.{key}" if place else str(key), (*inside, id(node)))
        if found is not None:
            return found
    return None


def _weights_file_kind(raw: bytes) -> str | None:
    """What a file handed to ``--config`` is when it holds weights: a torch checkpoint (a zip archive or a pickle) or
    an exported .safetensors file (an 8-byte header length, then its JSON header); None for anything else."""
    if raw.startswith(b"PK\x03\x04") or raw.startswith(b"\x80\x02") or raw[:2] in (b"\x80\x04", b"\x80\x05"):
        return "a torch checkpoint (weights)"
    if len(raw) > 9 and raw[8:10] == b'{"' and int.from_bytes(raw[:8], "little") < len(raw):
        return "an exported .safetensors file (weights)"
    return None


def read_config_file(path: str | os.PathLike, before_subcommand: bool = False) -> dict | None:
    """A ``--config`` file's top level, checked: UTF-8 text, a mapping, and each section of the right kind
    (``trainer: 5`` would otherwise be dropped silently). None when the YAML does not parse (jsonargparse
    reports that with its line and column). One-line ConfigError otherwise."""
    import yaml

    raw = Path(path).read_bytes()
    if Path(path).suffix == ".py" or re.match(rb"^(import |from \w[\w.]* import |def |class |#!)", raw):
        raise ConfigError(
            f"config file {str(path)!r} is Python code, not a YAML config; name your class with "
            f"--model=module.ClassName (its folder on PYTHONPATH), and give settings in a YAML file"
        )
    kind = _weights_file_kind(raw)
    if kind is not None:
        raise ConfigError(
            f"config file {str(path)!r} is {kind}, not a YAML config; "
            + (
                "give it to distlab generate --ckpt_path"
                if "safetensors" in kind
                else "give it as --ckpt_path (to resume or evaluate), with its run's config.yaml as --config"
            )
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {str(path)!r} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); save it "
            "as UTF-8 YAML"
        ) from None
    try:
        cfg = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as e:
        raise ConfigError(
            f"config file {str(path)!r}: {e}; keep one (YAML keeps the last one silently)"
        ) from None
    except _SurprisingScalar as e:
        raise ConfigError(f"config file {str(path)!r}, {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {_yaml_problem(e, text)}") from None
    if cfg is None:
        raise ConfigError(
            f"config file {str(path)!r} is empty (or only comments); give a YAML mapping of sections"
        )
    loop = _contains_itself(cfg)
    if loop is not None:
        raise ConfigError(
            f"config file {str(path)!r}: {loop} holds an alias of an anchor that encloses it (&name ... *name inside "
            "it), an endless value; give the value itself, or anchor a smaller part"
        )
    if not isinstance(cfg, dict):
        raise ConfigError(
            f"config file {str(path)!r} holds a {type(cfg).__name__}, not a mapping of sections; write e.g. "
            "'trainer: {max_steps: 100}'"
        )
    for key in ("model", "data", "trainer"):
        if key in cfg and cfg[key] is None:
            raise ConfigError(
                f"config file {str(path)!r} sets {key}: to nothing (null); give its settings indented below it, or "
                "delete the line"
            )
    if "_instantiator" in cfg or (Path(path).name == "hparams.yaml" and not set(cfg) & set(SECTION_KINDS)):
        raise ConfigError(
            f"config file {str(path)!r} is a run's hparams.yaml (the model's hyperparameters, flat), not a config of "
            "sections; give the run's config.yaml (beside it) to --config"
        )
    if set(cfg) & set(SUBCOMMANDS) and not before_subcommand:
        sub = sorted(set(cfg) & set(SUBCOMMANDS))[0]
        raise ConfigError(
            f"config file {str(path)!r} is keyed by subcommand ('{sub}:'): given after the subcommand it can hold only "
            f"sections; drop the '{sub}:' level (indent its sections one level less), or give it before the "
            f"subcommand: distlab --config {path} {sub}"
        )
    for key, spec in class_entries(cfg):  # model, data, each callback, logger, strategy ... wherever one is
        loose = sorted(set(spec) - {"class_path", "init_args", "dict_kwargs", "__path__"}, key=str)
        misspelt = next((k for k in loose if closest(str(k), ["init_args", "dict_kwargs"])), None)
        if misspelt is not None:
            raise ConfigError(
                f"config file {str(path)!r}: {key}: a class entry holds class_path and init_args (its settings), not "
                f"'{misspelt}'{closest(str(misspelt), ['init_args', 'dict_kwargs'])}; write its settings under init_args"
            )
        if loose:
            raise ConfigError(
                f"config file {str(path)!r}: {key}: sets {', '.join(map(str, loose))} beside class_path; a class's "
                "settings go under init_args: (indented below it)"
            )
    callbacks = (cfg.get("trainer") or {}).get("callbacks") if isinstance(cfg.get("trainer"), dict) else None
    if (
        isinstance(callbacks, dict)
        and "class_path" not in callbacks
        and callbacks
        and all(isinstance(v, dict) and "class_path" in v for v in callbacks.values())
    ):
        raise ConfigError(
            f"config file {str(path)!r}: trainer.callbacks is a mapping of names ({', '.join(map(str, callbacks))}); "
            "write it as a list, one '- class_path: ...' item per callback"
        )
    for i, item in enumerate(callbacks if isinstance(callbacks, list) else []):
        if isinstance(item, dict) and "class_path" not in item:
            raise ConfigError(
                f"config file {str(path)!r}: trainer.callbacks item {i + 1} has no class_path ({sorted(item)}); "
                "name the callback's class, e.g. class_path: lightning.pytorch.callbacks.ModelCheckpoint"
            )
    trainer_options = _trainer_options()
    known = {*SECTION_KINDS, *SUBCOMMAND_OPTIONS, *SUBCOMMANDS, "optimizer", "lr_scheduler", *trainer_options}
    if cfg and not any(key in known for key in cfg):  # a notebook, a package.json, another tool's config...
        raise ConfigError(
            f"config file {str(path)!r} has none of distlab's sections (trainer, model, data) but sets "
            f"{', '.join(map(str, list(cfg)[:4]))}: it is not a distlab config; give a YAML file with those sections"
            + (" (a notebook is not a config file)" if str(path).endswith(".ipynb") else "")
        )
    for key in cfg:
        if key not in SECTION_KINDS and key in trainer_options:
            raise ConfigError(
                f"config file {str(path)!r} sets {key} at the top level, where only sections go; it is a Trainer "
                f"setting: put it under 'trainer:' (indented), or pass --trainer.{key}"
            )
    for key, kinds in SECTION_KINDS.items():
        if key in cfg and cfg[key] is not None and not isinstance(cfg[key], kinds):
            raise ConfigError(
                f"config file {str(path)!r}: {key}: {cfg[key]!r} is not a mapping of {key} settings; write e.g. "
                f"'{key}:' followed by indented 'name: value' lines"
            )
    return cfg


def _yaml_problem(e: Exception, text: str) -> str:
    """PyYAML's error in one line: the problem, where (line, column), and the usual cause when it is a tab."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    line = text.splitlines()[mark.line] if mark is not None and mark.line < len(text.splitlines()) else ""
    if "\t" in line[: (mark.column + 1) if mark is not None else 0]:
        return f"a tab character{where}: YAML indents with spaces only; replace the tabs with spaces"
    if "another document" in problem:  # a second '---' document: distlab reads one mapping per file
        return (
            f"it holds more than one document (a second '---' at line {mark.line + 1 if mark else '?'}); a config file is one mapping: remove the "
            "'---' line (merge the two), or give the second part as another --config"
        )
    context, begun = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and begun is not None:  # where the unclosed '[' / '{' or the mapping began
        return f"{problem}{where}, {context.removeprefix('while ')} begun at line {begun.line + 1}, column {begun.column + 1}"
    return f"{problem}{where}"


@functools.cache
def _trainer_options() -> frozenset[str]:
    import inspect

    return frozenset(inspect.signature(L.Trainer.__init__).parameters) - {"self"}


def classes_given(argv: list[str], scan: tuple | None = None) -> dict[str, str]:
    """Which of model / data the command line or its config files give a class_path for.

    Only those get no default: jsonargparse keeps the init_args a new class_path shares with the previous
    one (by design, jsonargparse#460), so a default class's values (TextDataModule's val_fraction=0.02)
    would leak into the user's class if the default were parsed first. A dotted class path that cannot be
    imported is a one-line error here (jsonargparse would report an unrelated option instead).
    """
    on_command_line, in_configs = scan or _class_arguments(argv)
    given = {**in_configs, **{key: choices[-1][2] for key, choices in on_command_line.items()}}
    for key, class_path in given.items():
        check_importable(key, class_path)
    return given


# Trainer arguments typed ``str | <class>``: jsonargparse takes a bare dotted class path there as a name (Lightning
# then refuses "invalid strategy name"), and the class only when options follow it.
NAME_OR_CLASS_OPTIONS = ("--trainer.strategy", "--trainer.accelerator")


def class_paths_as_classes(argv: list[str]) -> list[str]:
    """``--trainer.strategy=distlab.strategies.FSDP2Strategy`` (a class, as ``--help`` lists them) is passed on as
    ``{"class_path": ...}``, so that it means the class whether or not options follow."""
    out = list(argv)
    for i, tok in enumerate(out):
        option, eq, value = tok.partition("=")
        if option not in NAME_OR_CLASS_OPTIONS:
            continue
        if not eq and i + 1 < len(out):
            value = out[i + 1]
        if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+", value):
            continue
        module, _, name = value.rpartition(".")
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue  # not a module: left to the parser (its own message)
        if found is None:
            names = [n for n in dir(importlib.import_module(module)) if not n.startswith("_")]
            close = difflib.get_close_matches(name, names, n=1)
            raise ConfigError(
                f"{option.lstrip('-')}={value}: module {module} has no {name}"
                + (f"; did you mean {module}.{close[0]}?" if close else "")
            )
        if isinstance(found, type):
            spec = json.dumps({"class_path": value})
            if eq:
                out[i] = f"{option}={spec}"
            else:
                out[i + 1] = spec
    return out


def classes_first(argv: list[str], scan: tuple | None = None) -> list[str]:
    """``fit --config recipe.yaml --model MyModule``: the class chosen on the command line comes first, so the
    recipe's ``model:`` values apply to it (jsonargparse reads in order: parsed after the recipe, the recipe's
    values would meet no class and be refused). Only when it is the one class named for that key, on the
    command line or in a config file: otherwise the order keeps its meaning (the last class named wins)."""
    on_command_line, in_configs = scan or _class_arguments(argv)
    sub = next((i for i, tok in enumerate(argv) if tok in SUBCOMMANDS), None)
    single = {
        key: choices[0]
        for key, choices in on_command_line.items()
        if key not in in_configs and len(choices) == 1 and sub is not None and choices[0][0] > sub
    }
    # a class file (--model model.yaml): its class goes first, and the file stays where it is written, so that its
    # init_args apply after the recipe's, as a later --config's would
    files = {key: c for key, c in single.items() if names_a_file(c[2])}
    named = {key: _class_in_file(str(c[2])) for key, c in files.items()}
    moved = [c[:2] for key, c in single.items() if key not in files]
    if not moved and not any(named.values()):
        return list(argv)
    front = [tok for i, n in sorted(moved) for tok in argv[i : i + n]]
    front += [tok for key, cls in named.items() if cls for tok in (f"--{key}", cls)]
    skip = {j for i, n in moved for j in range(i, i + n)}
    rest = [tok for j, tok in enumerate(argv) if j not in skip]
    return [*rest[: sub + 1], *front, *rest[sub + 1 :]]  # right after the subcommand


def _class_in_file(path: str) -> str | None:
    """The class_path a class file names, or None (unreadable: check_class_file says why, later)."""
    import yaml

    try:
        content = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    value = content.get("class_path") if isinstance(content, dict) else None
    return value if isinstance(value, str) else None


def names_a_file(value: str | None) -> bool:
    """``--model model.yaml``: the value is a file of class_path and init_args, not a class name."""
    return isinstance(value, str) and (
        value.endswith((".yaml", ".yml", ".json")) or Path(value).expanduser().is_file()
    )


def check_class_file(key: str, path: str) -> None:
    """``--model model.yaml``: a file that holds ``class_path`` and ``init_args`` (jsonargparse reads it). A file that
    is something else - missing, a whole config of sections, a run's flat hparams.yaml - is one line saying what."""
    import yaml

    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(
            f"--{key} {path!r} names a file that does not exist; give an existing file with class_path and init_args, "
            f"or a class (--{key} my_pkg.MyClass)"
        )
    try:
        content = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(
            f"--{key} {path!r} could not be read as YAML ({type(e).__name__}); give a YAML file"
        ) from None
    sections = {"trainer", "model", "data", "seed_everything"}
    if isinstance(content, dict) and "class_path" in content:
        return
    if isinstance(content, dict) and content.keys() & sections:
        raise ConfigError(
            f"--{key} {path!r} is a whole config (it has {', '.join(sorted(content.keys() & sections))}): give it to "
            f"--config, which reads every section"
        )
    if isinstance(content, dict) and "_instantiator" in content:
        raise ConfigError(
            f"--{key} {path!r} is a run's hparams.yaml (the {key}'s settings, flat, as Lightning saved them), not a "
            f"class and its init args; give the run's config.yaml to --config, or a file of class_path: and init_args:"
        )
    raise ConfigError(
        f"--{key} {path!r} holds no class_path; write the file as class_path: my_pkg.MyClass and init_args: {{...}} "
        f"(or give the settings as --{key}.NAME=VALUE)"
    )


def check_importable(key: str, class_path: Any) -> None:
    """``--model my_pkg.MyModule``: the module must import and define the class; ``--model MyModule`` (a short
    name) must be one jsonargparse can resolve, an imported subclass (one-line ConfigError either way)."""
    if not isinstance(class_path, str) or class_path.startswith("{"):
        return  # inline YAML: jsonargparse checks it
    if names_a_file(class_path):
        check_class_file(key, class_path)
        return  # a file holding the class and its init args: jsonargparse reads it
    if "." not in class_path:
        base = L.LightningModule if key == "model" else L.LightningDataModule
        known = sorted({c.__name__ for c in subclasses(base)[1:] if not c.__name__.startswith("_")})
        if class_path not in known:
            close = difflib.get_close_matches(class_path, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"{key} class {class_path!r} is not a {base.__name__} imported here; {hint}check the spelling, or "
                f"give your class's import path, e.g. --{key} my_pkg.{class_path} (`distlab fit --{key}.help "
                f"CLASS` lists a class's options)"
            )
        return
    module, _, name = class_path.rpartition(".")
    unnamable = next((part for part in module.split(".") if not part.isidentifier()), None)
    if unnamable is not None:
        raise ConfigError(
            f"{key} class {class_path!r}: {unnamable!r} cannot be a module's name in an import path (Python names hold "
            f"letters, digits and _ only); rename the file or folder {re.sub(r'[^0-9A-Za-z_]', '_', unnamable)!r} "
            "and give that"
        )
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(_no_such_module(key, class_path, module))
    try:
        imported = importlib.import_module(module)
    except SystemExit as e:  # unguarded top-level code in the user's file (a script's sys.exit)
        raise ConfigError(
            f"importing {module!r} (for {key} class {class_path!r}) ended the program (sys.exit({e.code!r})): its "
            "top-level code ran as a script's would; put that code under `if __name__ == '__main__':`"
        ) from None
    if not hasattr(imported, name):
        raise ConfigError(
            f"{key} class {class_path!r}: module {module!r} defines no {name!r}; check the name"
        )


def _no_such_module(key: str, class_path: str, module: str) -> str:
    """Why ``module`` does not import: a class on the way (``pkg.Outer.Inner``: a nested class), or no such module."""
    parts = module.split(".")
    for i in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:i])
        try:
            obj: Any = importlib.import_module(head) if importlib.util.find_spec(head) else None
        except (ImportError, ValueError, SystemExit):
            obj = None
        if obj is None:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
        if isinstance(obj, type):
            return (
                f"{key} class {class_path!r}: {module!r} is a class, not a module, so {class_path.rsplit('.', 1)[-1]} "
                f"is a class inside a class, which an import path cannot name; define it at the top level of "
                f"{head!r} and give {head}.{class_path.rsplit('.', 1)[-1]}"
            )
        break
    return (
        f"{key} class {class_path!r}: no module named {module!r}; check the spelling, and that its package is "
        "installed or its folder is on PYTHONPATH"
    )


def check_subcommand(argv: list[str]) -> None:
    """The first word must be one of distlab's six subcommands (LightningCLI's own message knows four)."""
    known = [*SUBCOMMANDS, *FUNCTION_COMMANDS]
    sub = next((a for a in argv[2:] if a in known), None)
    if argv[:1] in (["--config"], ["-c"]) and sub and not _config_has_section(argv[1], sub):
        raise ConfigError(
            f"--config comes before the subcommand {sub!r}, where it can only hold top-level settings; write "
            f"distlab {sub} --config {argv[1] if len(argv) > 1 else 'FILE'} ..."
        )
    for before, arg in zip(argv, argv[1:], strict=False):
        takes_value = before.startswith("-") and "=" not in before
        if arg.endswith((".yaml", ".yml", ".json")) and not arg.startswith("-") and not takes_value:
            raise ConfigError(f"{arg} is given without --config before it; write --config {arg}")
    if argv and argv[0].startswith("-"):
        return  # --help: the parser's business
    if not argv or argv[0] not in known:
        said = f"unknown subcommand {argv[0]!r}{closest(argv[0], known)}" if argv else "no subcommand given"
        raise ConfigError(f"{said}; distlab's subcommands: {', '.join(known)} (distlab SUBCOMMAND --help)")


def _config_has_section(path: str, section: str) -> bool:
    """Whether the YAML file ``path`` has a top-level ``section:`` (a config for several subcommands)."""
    import yaml

    try:
        cfg = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(cfg, dict) and section in cfg


def check_text_arguments(argv: list[str]) -> None:
    """Every argument must be text: bytes that are not UTF-8 reach Python as lone surrogates, which no YAML
    value, file name or prompt can hold. One line naming the argument. A dash that is not ``-`` (pasted from a web
    page) and ``--folder=~`` (YAML's null, not home) are named too."""
    for i, arg in enumerate(argv):
        dash = re.match(r"^([\u2010-\u2015\u2212\ufe58\ufe63\uff0d]{1,2})([A-Za-z_][\w.]*)(=|$)", arg)
        a_value = i > 0 and argv[i - 1].startswith("-") and "=" not in argv[i - 1]  # e.g. --prompt '—quoted'
        if dash and not a_value:
            raise ConfigError(
                f"argument {i + 1} ({arg!r}) begins with {dash.group(1)!r} (U+{ord(dash.group(1)[0]):04X}, a "
                f"typographic dash pasted from a document), not '--'; retype it as --{dash.group(2)}"
            )
        single = re.match(r"^-([A-Za-z_][\w.]+)(=|$)", arg)
        if (
            single and not a_value
        ):  # -config is -c onfig to the parser; -trainer.max_steps=2 an unknown short option
            raise ConfigError(
                f"argument {i + 1} ({arg!r}) begins with one dash; long options take two: write --{single.group(1)}"
            )
        option = re.match(r"^--([A-Za-z_][\w.-]*)([:=]?)(.*)$", arg)
        if option and not a_value and "-" in option.group(1):  # --trainer.max-steps: options are snake_case
            fixed = option.group(1).replace("-", "_")
            raise ConfigError(
                f"argument {i + 1} ({arg!r}) writes the option with '-'; options use '_': --{fixed}"
                + (f"={option.group(3)}" if option.group(2) else "")
            )
        if option and not a_value and option.group(2) == ":":  # --trainer.max_steps:2 (YAML's colon)
            raise ConfigError(
                f"argument {i + 1} ({arg!r}) joins the option and its value with ':'; write "
                f"--{option.group(1)}={option.group(3).strip()}"
            )
        key, eq, value = arg.partition("=")
        if not eq and arg.startswith("--") and i + 1 < len(argv):
            value = argv[i + 1]
        if arg.startswith("--") and value == "~" and FOLDER_KEY.search(key.rsplit(".", 1)[-1]):
            raise ConfigError(tilde_as_home(key))
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as e:
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            raise ConfigError(
                f"argument {i + 1} ({shown!r}) holds bytes that are not UTF-8 text (at character {e.start}); "
                "retype it, or set the terminal's encoding to UTF-8"
            ) from None
