"""The ``distlab`` command: LightningCLI for fit/validate/test, plus ``generate`` and ``export``.

    distlab fit --config configs/demo_cpu.yaml
    distlab fit --config configs/debug.yaml --config configs/trainer/ddp_spawn_cpu.yaml
    distlab fit --config configs/demo_cpu.yaml --print_config
    distlab validate --config configs/demo_cpu.yaml --ckpt_path runs/demo/checkpoints/last.ckpt
    torchrun --standalone --nproc_per_node=2 -m distlab fit --config configs/demo_cpu.yaml
    distlab generate --ckpt_path runs/demo/checkpoints/last.ckpt --prompt "def " --max_new_tokens 200
    distlab export --ckpt_path runs/demo/checkpoints/last.ckpt --out demo.safetensors
    distlab generate --ckpt_path demo.safetensors --prompt "def "

Any LightningModule / LightningDataModule (LightningCLI subclass mode): the GPT and its text data are
the defaults, so a recipe may give only their arguments (``model: {depth: 4}``); another model is
``model: {class_path: my_pkg.MyModule, init_args: {...}}`` or ``--model my_pkg.MyModule``.
``distlab fit --model.help distlab.modules.GPTLightningModule`` lists a module's arguments.

Configuration errors print one line (``distlab: error: ...``) and exit with status 2.
"""

from __future__ import annotations

import codecs
import difflib
import functools
import importlib
import importlib.util
import json
import os
import re
import sys
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from distlab.callbacks.fault_injection import FaultInjection
from distlab.callbacks.preemption import CheckpointOnStopRequest, DataResumeCheck, SaveUnsavedSteps
from distlab.checkpoint import (
    check_lightning_checkpoint,
    check_same_optimizer,
    check_weights_fit,
    checkpoint_hparams,
    install_verified_checkpoint_io,
    is_safetensors,
)
from distlab.cli_errors import (
    SUBCOMMAND_OPTIONS,
    debug_requested,
    find_in_chain,
    first_line,
    in_our_words,
    is_stop_signal,
    raised_in_user_code,
    report,
    report_stop,
    subclasses,
)
from distlab.compat import AppendingCSVLogger, MultiProcessingLauncher, set_launcher, start_method
from distlab.data.datamodule import TextDataModule
from distlab.distributed.restart import fresh_store_after_restart
from distlab.domains import (
    ExistingPath,
    NonNegative,
    NonNegativeInt,
    PositiveInt,
    SafetensorsFile,
    Seed,
    Text,
    check_domains,
)
from distlab.errors import ConfigError
from distlab.launch import check_process_group_plan, reconcile_trainer_config, restart_count
from distlab.log import silence_moot_messages
from distlab.modules.gpt_module import GPTLightningModule
from distlab.preflight import (
    CKPT_ALIASES,
    check_before_run,
    check_evaluates_trained_weights,
    check_loaders,
    check_parsed,
    check_run_folder_is_free,
    check_seed_env,
    check_token_ids,
    check_writable,
    closest,
    is_launching_process,
    newest_checkpoint,
    notes,
)
from distlab.strategies.launcher import SpawnLauncher


def default_loggers(save_dir: str, subcommand: str = "fit", resume: bool = False) -> list:
    """CSV always (the loss-curve plot reads it) + TensorBoard when it is installed.

    ``fit`` writes ``save_dir/metrics.csv``; ``validate`` / ``test`` write ``save_dir/<subcommand>/metrics.csv``
    (Lightning's CSVLogger deletes an existing metrics.csv, and the fit's training log must survive). A resumed
    fit (``resume``) appends to the fit's metrics.csv instead of deleting the steps before the checkpoint."""
    from lightning.pytorch.loggers import TensorBoardLogger

    version = "" if subcommand == "fit" else subcommand
    csv_logger = (AppendingCSVLogger if resume else CSVLogger)(save_dir=save_dir, name="", version=version)
    loggers = [csv_logger]
    if importlib.util.find_spec("tensorboard") is not None:
        loggers.append(
            TensorBoardLogger(save_dir=save_dir, name="", version="tensorboard", default_hp_metric=False)
        )
    return loggers


def _default_classes() -> dict[str, str]:
    """The classes a recipe gets when it names none: the GPT and its text data."""
    return {
        "model": f"{GPTLightningModule.__module__}.{GPTLightningModule.__name__}",
        "data": f"{TextDataModule.__module__}.{TextDataModule.__name__}",
    }


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
        parts = Path(value).parts
        if "configs" in parts and (RECIPES / Path(*parts[parts.index("configs") + 1 :])).is_file():
            out[i] = prefix + str(RECIPES / Path(*parts[parts.index("configs") + 1 :]))
    return out


# Sections of a config file and what each must hold (a mapping of settings; model/data may name a class).
SECTION_KINDS = {"trainer": (dict,), "model": (dict, str), "data": (dict, str)}


def _subcommand_at(argv: list[str]) -> int:
    """The index of the subcommand in ``argv`` (-1 when it holds none: every --config is read as after one)."""
    return next((i for i, a in enumerate(argv) if a in SUBCOMMANDS), -1)


def _config_args(argv: list[str]) -> list[tuple[int, str]]:
    """(index, path) of every ``--config`` in ``argv``."""
    out = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            out.append((i, argv[i + 1]))
        elif arg.startswith("--config="):
            out.append((i, arg.split("=", 1)[1]))
    return out


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
        for i, p in _config_args(argv)
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


def refuse_bad_hparams(ckpt: str, class_path: str | None, hparams: dict[str, Any]) -> None:
    """A checkpoint's hyperparameters must lie in the domains the model class declares (an edited file, another
    version's): one line naming the setting, instead of the parser's message about the whole model."""
    from distlab.domains import conforms, refusal

    module, _, name = str(class_path).rpartition(".")
    try:
        hints = typing.get_type_hints(getattr(importlib.import_module(module), name).__init__)
    except Exception:  # noqa: BLE001 - a class the parser resolves its own way: it will say what is wrong
        return
    for key, value in hparams.items():
        tp = hints.get(key)
        if tp is not None and not conforms(tp, _plain(value) if isinstance(value, list) else value):
            if isinstance(value, list) and conforms(tp, tuple(value)):
                continue  # a checkpoint stores the tuple (0.8, 0.95) as a list
            raise ConfigError(f"the checkpoint {ckpt!r}: {refusal('model.' + key, value, tp)}")


class _DuplicateKey(Exception):
    pass


def _unique_key_loader() -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):  # noqa: ANN001
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:  # the mapping's own keys (a merged <<: *anchor may be overridden)
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise _DuplicateKey(
                        f"key {key!r} appears twice (lines {seen[key]} and {key_node.start_mark.line + 1})"
                    )
                seen[key] = key_node.start_mark.line + 1
            self.flatten_mapping(node)  # YAML merge keys, as SafeLoader does
            return super().construct_mapping(node, deep=deep)

    return Loader


_UniqueKeyLoader = _unique_key_loader()


def _class_entries(node: Any, key: str = "") -> Iterator[tuple[str, dict]]:
    """(dotted place, entry) of every class entry (a mapping with class_path) anywhere in a config."""
    if isinstance(node, dict):
        if "class_path" in node:
            yield key or "(top level)", node
        for k, v in node.items():
            yield from _class_entries(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _class_entries(v, f"{key} item {i + 1}")


def read_config_file(path: str | os.PathLike, before_subcommand: bool = False) -> dict | None:
    """A ``--config`` file's top level, checked: UTF-8 text, a mapping, and each section of the right kind
    (``trainer: 5`` would otherwise be dropped silently). None when the YAML does not parse (jsonargparse
    reports that with its line and column). One-line ConfigError otherwise."""
    import yaml

    raw = Path(path).read_bytes()
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
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {_yaml_problem(e, text)}") from None
    if cfg is None:
        raise ConfigError(
            f"config file {str(path)!r} is empty (or only comments); give a YAML mapping of sections"
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
    for key, spec in _class_entries(cfg):  # model, data, each callback, logger, strategy ... wherever one is
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
    return f"{problem}{where}"


@functools.cache
def _trainer_options() -> frozenset[str]:
    import inspect

    return frozenset(inspect.signature(L.Trainer.__init__).parameters) - {"self"}


def classes_given(argv: list[str], scan: tuple | None = None) -> set[str]:
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
    return set(given)


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
    moved = [
        choices[0][:2]
        for key, choices in on_command_line.items()
        if key not in in_configs and len(choices) == 1 and sub is not None and choices[0][0] > sub
    ]
    if not moved:
        return list(argv)
    front = [tok for i, n in sorted(moved) for tok in argv[i : i + n]]
    skip = {j for i, n in moved for j in range(i, i + n)}
    rest = [tok for j, tok in enumerate(argv) if j not in skip]
    return [*rest[: sub + 1], *front, *rest[sub + 1 :]]  # right after the subcommand


def check_importable(key: str, class_path: Any) -> None:
    """``--model my_pkg.MyModule``: the module must import and define the class; ``--model MyModule`` (a short
    name) must be one jsonargparse can resolve, an imported subclass (one-line ConfigError either way)."""
    if not isinstance(class_path, str) or class_path.startswith("{"):
        return  # inline YAML: jsonargparse checks it
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
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(
            f"{key} class {class_path!r}: no module named {module!r}; check the spelling, and that its package is "
            "installed or its folder is on PYTHONPATH"
        )
    if not hasattr(importlib.import_module(module), name):
        raise ConfigError(
            f"{key} class {class_path!r}: module {module!r} defines no {name!r}; check the name"
        )


def _enum_defaults_as_values(cfg: Any) -> None:
    """Replace enum members in the parsed config by their values: jsonargparse fills a class's enum default
    (Lightning's ``Timer(interval=Interval.step)``) and then cannot instantiate the class from it
    ("cannot represent an object"); the value (``"step"``) means the same to the class."""
    import enum

    items = cfg.items() if hasattr(cfg, "items") else enumerate(cfg) if isinstance(cfg, list) else ()
    for key, value in list(items):
        if isinstance(value, enum.Enum) and isinstance(value.value, (str, int, float)):
            cfg[key] = value.value
        elif hasattr(value, "items") or isinstance(value, list):
            _enum_defaults_as_values(value)


class DistlabCLI(LightningCLI):
    """LightningCLI with distlab's checks: launcher world size, data and model consistency."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        given = kwargs.get("args")
        self._argv: list[str] | None = (
            None  # the command line as parsed; None: args given as a dict/Namespace
        )
        self.classes_given: set[str] = set()
        if given is None or isinstance(given, (list, tuple)):
            argv = class_paths_as_classes(packaged_recipes(list(sys.argv[1:] if given is None else given)))
            check_argument_order(argv)
            scan = _class_arguments(argv)  # reads each --config file once for both
            self.classes_given = classes_given(argv, scan)
            self._argv = classes_first(argv, scan)
        self._model_flags = model_flags(self._argv or [])
        super().__init__(*args, **kwargs)

    def add_default_arguments_to_parser(self, parser) -> None:
        """LightningCLI's ``--seed_everything`` with its domain declared: ``true`` (pick a seed), ``false`` (none),
        or a seed numpy accepts (Lightning's ``bool | int`` let -1 through to a traceback in seed_everything)."""
        from distlab.domains import Seed

        parser.add_argument(
            "--seed_everything",
            type=bool | Seed,
            default=self.seed_everything_default,
            help="a seed in [0, 2**32) set before the classes are built; true picks one at random, false sets none",
        )

    def add_arguments_to_parser(self, parser) -> None:
        defaults = {
            k: {"class_path": v} for k, v in _default_classes().items() if k not in self.classes_given
        }
        parser.set_defaults({"trainer.default_root_dir": "runs/default", **defaults})

    def _parse_ckpt_path(self) -> None:
        """A ``--ckpt_path`` checkpoint's hyperparameters are data from a stranger (LightningCLI would apply them
        silently, and import the class a checkpoint names). Here: loaded without running code, the class
        must be the one the config builds, and every value that differs from the config is said in one line."""
        subcommand = self.config.get("subcommand")
        cfg = self.config.get(subcommand) if subcommand else None
        ckpt = cfg.get("ckpt_path") if cfg is not None else None
        if isinstance(ckpt, str) and not ckpt.strip():
            raise ConfigError(
                "--ckpt_path is empty (an unset variable?); give a checkpoint's path, or drop --ckpt_path to start "
                "from scratch"
            )
        if not ckpt or ckpt in CKPT_ALIASES:
            return
        if str(ckpt).startswith("~"):  # no shell expanded it (--ckpt_path=~/x, or a config file)
            cfg["ckpt_path"] = ckpt = os.path.expanduser(ckpt)
        if not Path(ckpt).exists():
            raise ConfigError(
                f"checkpoint not found: {ckpt!r}; pass --ckpt_path to an existing .ckpt file or folder"
            )
        if is_safetensors(ckpt):
            raise ConfigError(
                f"{ckpt!r} is an exported .safetensors file (weights only: no optimizer state, no step); {subcommand} "
                "needs a .ckpt that distlab fit wrote (distlab generate reads the .safetensors)"
            )
        check_lightning_checkpoint(
            ckpt, resume=subcommand == "fit"
        )  # weights_only; a DCP folder checked first
        if subcommand == "fit":
            self._note_other_data_settings(cfg, ckpt)
        hparams = checkpoint_hparams(ckpt)
        hparams.pop("_instantiator", None)
        model = cfg.get("model")
        named = hparams.pop("_class_path", None)
        if named and model is not None and named != model.get("class_path"):
            raise ConfigError(
                f"{ckpt!r} was written by {named}, but the config builds {model.get('class_path')}; distlab never "
                f"imports a class a checkpoint names: add --model {named} if you trust it"
            )
        init = model.get("init_args") if model is not None else None
        if not hparams or init is None:
            return
        typed = set(self._model_flags)  # set on the command line: the user's word beats the checkpoint's
        known = {k: v for k, v in hparams.items() if k in init and k not in typed}
        refuse_bad_hparams(ckpt, model.get("class_path"), known)
        differ = [
            f"model.{k}={v!r} (config: {init.get(k)!r})"
            for k, v in known.items()
            if _plain(init.get(k)) != _plain(v)
        ]
        kept = [
            f"model.{k}={init.get(k)!r} (checkpoint: {hparams[k]!r})"
            for k in sorted(typed)
            if k in hparams and _plain(init.get(k)) != _plain(hparams[k])
        ]
        unknown = sorted(k for k in hparams if k not in init and not k.startswith("_"))
        if differ:
            rank_zero_info(f"distlab: from the checkpoint, differing from the config: {', '.join(differ)}")
        if kept:
            rank_zero_info(f"distlab: kept from the command line over the checkpoint: {', '.join(kept)}")
        if unknown:
            rank_zero_info(
                f"distlab: the checkpoint has settings {model.get('class_path')} does not take (ignored): {', '.join(unknown)}"
            )
        self.config = self.parser.parse_object(
            {subcommand: {"model": {"class_path": model.get("class_path"), "init_args": known}}}, self.config
        )

    @staticmethod
    def _note_other_data_settings(cfg: Any, ckpt: str) -> None:
        """A resume with other data settings than the checkpoint's run is allowed (a new batch size is a choice),
        but the data then does not continue where that run was: said in one line."""
        saved = checkpoint_hparams(ckpt, "datamodule_hyper_parameters")
        data = cfg.get("data")
        init = data.get("init_args") if data is not None and hasattr(data, "get") else None
        if not saved or init is None:
            return
        differ = [
            f"data.{k}={init.get(k)!r} (checkpoint: {v!r})"
            for k, v in saved.items()
            if k in init and _plain(init.get(k)) != _plain(v)
        ]
        if differ:
            rank_zero_info(
                f"distlab: note: resuming with other data settings than the checkpoint's run: {', '.join(differ)}; the "
                "data does not continue exactly where that run was"
            )

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        stop = CheckpointOnStopRequest.from_env()
        if stop is not None:
            callbacks = [*callbacks, stop]
        if self.subcommand == "fit":
            callbacks = [
                *callbacks,
                SaveUnsavedSteps(),
                DataResumeCheck(),
            ]  # no finished step is lost when a fit ends between saves
        fault = FaultInjection.from_env()
        if fault is not None:
            callbacks = [*callbacks, fault]
            rank_zero_info(
                f"distlab: fault injection armed: {fault.kind} on rank {fault.rank} at step {fault.step}"
            )
        notes = reconcile_trainer_config(config)
        if notes:
            rank_zero_info(f"distlab: matched the launcher: {', '.join(notes)}")
        if config.get("logger") in (None, True) and not config.get(
            "barebones"
        ):  # barebones: no loggers at all
            cfg = self.config.get(str(self.subcommand), self.config)
            config["logger"] = default_loggers(
                config.get("default_root_dir") or "runs/default",
                str(self.subcommand),
                resume=bool(cfg.get("ckpt_path")) or restart_count() > 0,
            )
        return super()._instantiate_trainer(config, callbacks)

    def parse_arguments(self, parser: Any, args: Any) -> None:
        if self._argv is None:
            return super().parse_arguments(parser, args)
        self.config = parser.parse_args(self._argv)

    def before_instantiate_classes(self) -> None:
        """The one validation step between parsing and building (:func:`distlab.preflight.check_parsed`)."""
        global _run_folder
        cfg = self.config.get(str(self.subcommand), self.config)
        trainer = cfg.get("trainer") or {}
        root = trainer.get("default_root_dir")
        if (
            isinstance(root, str) and root and "://" not in root  # (a URL is refused by its domain, as given)
        ):  # every writer (loggers, ModelCheckpoint) the same folder: ~ expanded,
            # and `typo/../run` resolved (os.makedirs would leave an empty `typo` behind)
            trainer["default_root_dir"] = os.path.normpath(os.path.expanduser(root))
        for key in ("strategy", "accelerator"):  # a class named in a config file, as on the command line
            value = trainer.get(key)
            if isinstance(value, str) and class_paths_as_classes([f"--trainer.{key}={value}"])[0].endswith(
                "}"
            ):
                from jsonargparse import Namespace

                trainer[key] = Namespace(class_path=value, init_args=Namespace())
        _enum_defaults_as_values(cfg)
        check_parsed(str(self.subcommand), cfg)
        for note in notes(str(self.subcommand), cfg):
            rank_zero_info(f"distlab: note: {note}")
        _run_folder = trainer.get("default_root_dir")

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as e:
            # Building the objects from the config: whatever fails here is the user's input (an unknown
            # strategy, an accelerator that is absent, a bad value a class refused). One line, exit 2.
            cause = find_in_chain(e, (ConfigError,))
            memory = find_in_chain(
                e, lambda x: isinstance(x, MemoryError) or "can't allocate memory" in str(x)
            )
            if cause is None and memory is None and raised_in_user_code(e):
                raise  # a bug in the user's own class (its __init__): an internal error, with its traceback
            if cause is None and memory is not None:
                cause = ConfigError(
                    f"building the model and data ran out of memory ({first_line(memory)[:160]}); lower their sizes "
                    "(model.depth, model.sequence_len, model.vocab_size, data.batch_size)"
                )
            if cause is None:
                line = first_line(e)  # a union's specific error is already a sentence of its own
                plain_first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                cause = ConfigError(
                    in_our_words(line if line != plain_first else f"{type(e).__name__}: {line}")
                )
            raise cause from None
        check_process_group_plan(self.trainer)
        check_loaders(str(self.subcommand), self.model, self.datamodule)
        install_verified_checkpoint_io(self.trainer.strategy)
        if isinstance(self.datamodule, TextDataModule):
            self.datamodule.prepare_splits()  # fail now, in one line, on a bad corpus or an empty validation split
        check_token_ids(self.model, self.datamodule)

    def _checkpoint_folders(self) -> list[Path]:
        return [
            Path(cb.dirpath) if cb.dirpath else checkpoint_folder(self.trainer)
            for cb in self.trainer.checkpoint_callbacks
        ]

    def _check_ckpt_path(self, subcommand: str) -> str | None:
        """``--ckpt_path`` before the run: a sharded (FSDP2) folder needs the fsdp2 strategy, an alias must resolve
        (:func:`distlab.preflight.check_before_run`); that it exists and runs no code was checked when the config was
        parsed, in :meth:`_parse_ckpt_path`."""
        ckpt = self.config_init[subcommand].get("ckpt_path")
        if ckpt and ckpt not in CKPT_ALIASES:
            path = Path(ckpt)
            if path.is_dir() and type(self.trainer.strategy).__name__ != "FSDP2Strategy":
                raise ConfigError(
                    f"{ckpt!r} is a sharded (FSDP2) checkpoint folder, but the strategy is "
                    f"{type(self.trainer.strategy).__name__}; add --config configs/trainer/fsdp2_cpu.yaml (or "
                    "fsdp2_gpu.yaml), or export it first: distlab export --ckpt_path FOLDER --out model.safetensors"
                )
        if ckpt and ckpt not in CKPT_ALIASES:
            if (
                subcommand == "fit"
                and Path(ckpt).is_file()
                and type(self.trainer.strategy).__name__ == "FSDP2Strategy"
            ):
                raise ConfigError(
                    f"{ckpt!r} is a one-file checkpoint (one process or ddp): its optimizer state cannot continue under "
                    "fsdp2's sharded optimizer; resume it under the strategy that wrote it, or resume an fsdp2 fit from "
                    "the checkpoint folder an fsdp2 run saved"
                )
            check_weights_fit(self.model, ckpt)
            if subcommand == "fit":
                check_same_optimizer(self.model, ckpt)
        if not ckpt and subcommand != "fit":
            check_evaluates_trained_weights(subcommand, self.model)
        restarted = subcommand == "fit" and restart_count() > 0  # "last" set by us: none yet means start over
        folders = self._checkpoint_folders()
        if (
            subcommand != "fit"
        ):  # `last` of validate/test/predict: the fit's checkpoints in the same run folder
            fit_folder = Path(str(self.trainer.default_root_dir)) / "checkpoints"
            folders = [*folders, *([fit_folder] if fit_folder not in folders else [])]
        if restarted:
            check_before_run(self.trainer, subcommand, None, folders)
            return ckpt
        return check_before_run(self.trainer, subcommand, ckpt, folders)

    def _evaluate_from(self, subcommand: str) -> None:
        for (
            logger
        ) in self.trainer.loggers:  # the evaluation's own log folder (<root>/validate ...), before a write
            try:
                folder = logger.log_dir
            except (OSError, AttributeError, NotImplementedError):  # it lists its root to pick a version
                folder = getattr(logger, "root_dir", None) or getattr(logger, "save_dir", None)
            if folder:
                check_writable(
                    folder,
                    f"{subcommand}'s log folder",
                    "move what is there away, or set trainer.default_root_dir to another folder",
                )
        resolved = self._check_ckpt_path(subcommand)
        if self.config_init[subcommand].get("ckpt_path") == "last" and resolved:
            # Lightning's own `last` looks only where this command's ModelCheckpoint would write (a folder of its
            # own), finds nothing and evaluates the initial weights with a warning: hand it the file found
            check_weights_fit(self.model, resolved)
            self.config_init[subcommand]["ckpt_path"] = resolved

    def before_validate(self) -> None:
        self._evaluate_from("validate")

    def before_test(self) -> None:
        self._evaluate_from("test")

    def before_predict(self) -> None:
        self._evaluate_from("predict")

    def before_fit(self) -> None:
        """A restarted job resumes from its last checkpoint; a fresh fit must not mix with an earlier run's."""
        if restart_count() > 0 and not self.config_init["fit"].get("ckpt_path"):
            # torchrun --max-restarts / a SLURM requeue started this attempt: continue from the newest checkpoint
            # the job saved (a recipe may keep no last.ckpt: its step-named ones count as much)
            fresh_store_after_restart()  # not the first attempt's rendezvous keys (pytorch#167288)
            folders = self._checkpoint_folders()
            newest = newest_checkpoint(folders)
            if newest is not None:
                self.config_init["fit"]["ckpt_path"] = str(newest)
            shown = ", ".join(str(f) for f in folders) or "(no ModelCheckpoint)"
            rank_zero_info(
                f"distlab: restart {restart_count()} of this job: resuming from {newest}"
                if newest is not None
                else f"distlab: restart {restart_count()} of this job: no checkpoint in {shown} yet, starting over"
            )
        launcher = self.trainer.strategy.launcher
        if (
            type(launcher) is MultiProcessingLauncher
        ):  # Lightning's ddp_spawn: distlab's passes stop signals on
            set_launcher(
                self.trainer.strategy,
                SpawnLauncher(self.trainer.strategy, start_method=start_method(launcher)),
            )
        for owner in (self.model, self.trainer.strategy):  # their own refusals, before a file is written
            check_trainer = getattr(owner, "check_trainer", None)
            if callable(check_trainer):
                check_trainer(self.trainer)
        ckpt = self._check_ckpt_path("fit")
        if restart_count() == 0 and is_launching_process():
            global _created_run_folder
            folder = run_folder(self.trainer)
            check_run_folder_is_free(folder, ckpt, self._checkpoint_folders())
            _created_run_folder = None if folder.exists() else folder


def run_folder(trainer) -> Path:
    """Where a fit writes its config, metrics and (by default) checkpoints: the first logger's directory."""
    return checkpoint_folder(trainer).parent


def checkpoint_folder(trainer) -> Path:
    """Where ModelCheckpoint writes when it has no dirpath (the first logger's directory, as Lightning does)."""
    if trainer.loggers:
        logger = trainer.loggers[0]
        parts = [logger.save_dir or trainer.default_root_dir, logger.name or "", str(logger.version or "")]
        return Path(*[p for p in parts if p]) / "checkpoints"
    return Path(trainer.default_root_dir) / "checkpoints"


def _parser_kwargs() -> dict[str, Any]:
    """Every parser raises on bad input (we print one line) instead of printing a usage wall."""
    kwargs: dict[str, Any] = {"exit_on_error": False}
    if importlib.util.find_spec("omegaconf"):
        kwargs["parser_mode"] = "omegaconf"
    top = {
        **kwargs,
        "description": "distlab: train and evaluate a LightningModule on any number of ranks. Subcommands: fit, "
        "validate, test, predict (listed below: `distlab fit --help`), and generate, export (sample from or export a "
        "checkpoint: `distlab generate --help`, `distlab export --help`).",
    }
    return {**top, **{sub: dict(kwargs) for sub in ("fit", "validate", "test", "predict")}}


def run_cli(args: list[str] | None = None) -> DistlabCLI:
    """Run ``distlab fit|validate|test|predict`` in this process and return the CLI (``.trainer``, ``.model``).

    The launch environment a run writes (MASTER_PORT, LOCAL_RANK, ...) is undone afterwards, so a notebook
    can call it again."""
    torch.set_float32_matmul_precision("high")
    with launch_env_restored():
        return _make_cli(args)


def _make_cli(args: list[str] | None) -> DistlabCLI:
    from distlab import compat

    compat.int_before_float(compat.lightning_init_functions())  # --trainer.limit_train_batches=2 stays an int
    return DistlabCLI(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        parser_kwargs=_parser_kwargs(),
        args=args,
        auto_configure_optimizers=False,
    )


def generate(
    ckpt_path: ExistingPath,
    prompt: Text = "def ",
    max_new_tokens: NonNegativeInt = 200,
    temperature: NonNegative = 0.8,
    top_k: PositiveInt | None = 50,
    seed: Seed = 0,
) -> str:
    """Sample text from a trained checkpoint.

    Args:
        ckpt_path: a .ckpt written by distlab fit, or a distlab export .safetensors
        prompt: text to continue
        max_new_tokens: bytes to generate
        temperature: 0 = greedy
        top_k: sample from the k most likely bytes (null: from all)
        seed: sampling seed
    """
    from distlab.checkpoint import load_gpt
    from distlab.data.tokenizer import ByteTokenizer

    check_domains(generate, locals())
    model = load_gpt(ckpt_path)
    tok = ByteTokenizer()
    if model.config.vocab_size != tok.vocab_size:
        raise ConfigError(
            f"the GPT in {str(ckpt_path)!r} has vocab_size={model.config.vocab_size}, and distlab generate speaks bytes "
            f"(vocab_size={tok.vocab_size}): it was trained on another tokenizer's ids; sample from Python with "
            "distlab.checkpoint.load_gpt(path).generate(ids, ...) and decode with that tokenizer"
        )
    if prompt.startswith("@") and Path(prompt[1:]).expanduser().is_file():
        rank_zero_info(
            f"distlab: note: the prompt {prompt!r} is used as text; to continue that file's text, pass "
            f'--prompt "$(cat {prompt[1:]})"'
        )
    idx = torch.tensor([tok.encode(prompt, bos=True)], dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    # Printed as it is sampled (a long --max_new_tokens shows progress at once): the same tokens as one call,
    # since each step depends only on the context so far and the generator's state.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    if hasattr(
        sys.stdout, "reconfigure"
    ):  # a terminal or pipe that is not UTF-8: replace what it cannot show
        sys.stdout.reconfigure(errors="replace")
    pieces = [decoder.decode(bytes(i for i in idx[0].tolist() if 0 <= i < 256))]
    try:
        sys.stdout.write(pieces[0])
        done = 0
        while done < max_new_tokens:
            n = min(64, max_new_tokens - done)
            idx = model.generate(idx, n, temperature=temperature, top_k=top_k, generator=gen)
            new = bytes(i for i in idx[0, -n:].tolist() if 0 <= i < 256)
            pieces.append(decoder.decode(new))
            sys.stdout.write(pieces[-1])
            sys.stdout.flush()
            done += n
        pieces.append(decoder.decode(b"", final=True))
        sys.stdout.write(pieces[-1] + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `distlab generate ... | head`: the reader has what it wanted; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
    return "".join(pieces)


def export(ckpt_path: ExistingPath, out: SafetensorsFile, overwrite: bool = False) -> Path:
    """Write a checkpoint's model weights and hyperparameters as safetensors (no pickle).

    Args:
        ckpt_path: a .ckpt file or an FSDP2 checkpoint folder
        out: output file, e.g. model.safetensors (written whole or not at all)
        overwrite: replace an existing --out
    """
    from distlab.checkpoint import export_safetensors

    check_domains(export, locals())
    written = export_safetensors(ckpt_path, out, overwrite=overwrite)
    print(f"wrote {written}")
    return written


# ``distlab <name>`` commands that are plain functions: their signatures declare their options and domains.
FUNCTION_COMMANDS: dict[str, Callable[..., Any]] = {"generate": generate, "export": export}


def function_command_parser(name: str) -> Any:
    """The parser of ``distlab generate`` / ``distlab export``, built from the function's signature."""
    from jsonargparse import ArgumentParser

    fn = FUNCTION_COMMANDS[name]
    parser = ArgumentParser(
        prog=f"distlab {name}", description=(fn.__doc__ or "").split("\n")[0], exit_on_error=False
    )
    parser.add_function_arguments(fn, as_group=False)
    return parser


def run_function_command(name: str, argv: list[str]) -> Any:
    """Parse ``argv`` against the command's signature (refusing what lies outside a declared domain), then run it."""
    world = os.environ.get("WORLD_SIZE", "1").strip()
    if world.isdigit() and int(world) > 1:
        raise ConfigError(
            f"distlab {name} runs in one process, and a launcher started {world} (WORLD_SIZE={world}): each would do the "
            f"same work and write the same files; run distlab {name} without torchrun / srun"
        )
    for before, arg in zip([name, *argv], argv, strict=False):
        if (
            not arg.startswith("-")
            and not (before.startswith("-") and "=" not in before)
            and Path(arg).exists()
        ):
            raise ConfigError(f"{arg} is given without an option name; write --ckpt_path {arg}")
    cfg = function_command_parser(name).parse_args(argv)
    return FUNCTION_COMMANDS[name](**cfg.as_dict())


def generate_main(argv: list[str]) -> str:
    """``distlab generate ...`` (kept for callers of the earlier API)."""
    return run_function_command("generate", argv)


def export_main(argv: list[str]) -> Path:
    """``distlab export ...`` (kept for callers of the earlier API)."""
    return run_function_command("export", argv)


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
    value, file name or prompt can hold. One line naming the argument."""
    for i, arg in enumerate(argv):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as e:
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            raise ConfigError(
                f"argument {i + 1} ({shown!r}) holds bytes that are not UTF-8 text (at character {e.start}); "
                "retype it, or set the terminal's encoding to UTF-8"
            ) from None


_run_folder: str | None = None  # the run's folder once parsed: where an internal error's traceback is saved
_created_run_folder: Path | None = None  # the run folder this fit creates (it did not exist before)


def remove_failed_start(folder: Path | None) -> None:
    """A fit that failed before it saved or logged a step leaves no files behind in the run folder it created
    (its config.yaml would make the retry "an earlier run"); the traceback's error.log stays."""
    if folder is None or not folder.is_dir() or any(folder.rglob("*.ckpt")):
        return
    metrics = folder / "metrics.csv"
    if (
        metrics.is_file()
        and sum(1 for line in metrics.read_text(errors="replace").splitlines() if line.strip()) > 1
    ):
        return
    import shutil

    for entry in folder.iterdir():
        if entry.name.startswith("error"):  # error.log, error-rank1.log: named by the one line printed
            continue
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    if not any(folder.iterdir()):
        folder.rmdir()


def say_error(line: str) -> None:
    """Print the one line; under torchrun also hand it to torchrun as this rank's error, so the failure summary
    torchrun prints names it as the root cause (instead of "To enable traceback see: ...")."""
    print(f"distlab: error: {line}", file=sys.stderr)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        import json
        import time

        try:
            Path(error_file).write_text(
                json.dumps({"message": f"distlab: error: {line}", "timestamp": int(time.time())})
            )
        except OSError:
            pass  # torchrun then says what it says without it; the line above is printed either way


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``distlab`` console script; ``args`` lets tests and notebooks call it.

    Whatever fails ends in one line on stderr and a non-zero exit (:mod:`distlab.cli_errors`): 2 for refused
    input, 1 for a stop the ranks agreed on or an internal error (its traceback saved to the run folder's
    ``error.log`` or a temporary file), 143 / 130 for a run stopped by SIGTERM / Ctrl-C (its finished steps
    saved first); ``DISTLAB_DEBUG=1`` shows the traceback instead."""
    global _run_folder, _created_run_folder
    from distlab.callbacks import preemption

    argv = sys.argv[1:] if args is None else list(args)
    _run_folder, _created_run_folder, preemption.stopped_by, preemption.stop_note = None, None, None, ""
    silence_moot_messages()
    try:
        check_text_arguments(argv)
        check_subcommand(argv)
        check_seed_env()
        with launch_env_restored():
            if argv and argv[0] in FUNCTION_COMMANDS:
                run_function_command(argv[0], argv[1:])
            else:
                run_cli(args)  # None: LightningCLI reads sys.argv itself
        if preemption.stopped_by == "SIGTERMException":  # the ranks agreed on a stop signal, saved, and ended
            raise SIGTERMException()
        if preemption.stopped_by == "KeyboardInterrupt":
            raise KeyboardInterrupt()
    except SystemExit as e:
        stop: BaseException = e
        if preemption.stopped_by == "KeyboardInterrupt":  # Lightning's own exit(1) after Ctrl-C
            stop = KeyboardInterrupt()
        elif preemption.stopped_by == "SIGTERMException" and e.code not in (
            0,
            None,
        ):  # (a stop while ranks start)
            stop = SIGTERMException()
        elif not is_stop_signal(e):
            raise  # --help, and the exits this function itself asks for
        line, code = report_stop(stop, _run_folder)
        say_error(line)
        sys.exit(code)
    except KeyboardInterrupt as e:
        line, code = report_stop(e, _run_folder)
        say_error(line)
        sys.exit(code)
    except BaseException as e:  # Exception, and the BaseExceptions torch raises (DCP's CheckpointException)
        if debug_requested():
            raise
        if preemption.stopped_by is not None and type(e).__name__.startswith("Process"):
            # a rank ended by the stop this process passed on before it could catch it (it was starting)
            stop = SIGTERMException() if preemption.stopped_by == "SIGTERMException" else KeyboardInterrupt()
            line, code = report_stop(stop, _run_folder)
            say_error(line)
            sys.exit(code)
        line, code = report(e, argv, _run_folder, FUNCTION_COMMANDS.get(argv[0]) if argv else None)
        remove_failed_start(_created_run_folder)
        say_error(line)
        sys.exit(code)


def _plain(value: Any) -> Any:
    """A config value with its sequences as lists: a checkpoint stores the tuple (0.8, 0.95) as a list."""
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


# Set in os.environ by a Lightning run in this process (its subprocess launcher and DDP set-up write them).
LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "RANK")


@contextmanager
def launch_env_restored():
    """Undo what a run wrote of the launch environment, so a second ``main()`` in the same process (a
    notebook, the tests) starts its own job: a leftover LOCAL_RANK makes Lightning believe an external
    launcher started the processes, and a 2-device run then waits forever for a rank nobody launches."""
    saved = {k: os.environ.get(k) for k in LAUNCH_ENV}
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


if __name__ == "__main__":
    main()
