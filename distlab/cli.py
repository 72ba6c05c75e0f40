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

import csv
import difflib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_info

from distlab.callbacks.fault_injection import FaultInjection
from distlab.callbacks.preemption import CheckpointOnStopRequest
from distlab.checkpoint import checkpoint_hparams
from distlab.data.datamodule import TextDataModule
from distlab.distributed.restart import fresh_store_after_restart
from distlab.errors import ConfigError, DistlabError
from distlab.launch import check_process_group_plan, check_run_folder, reconcile_trainer_config, restart_count
from distlab.modules.gpt_module import GPTLightningModule


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


class _AppendingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        # Lightning deletes an existing metrics.csv here; keep it and continue its columns.
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                self.metrics_keys = sorted(next(csv.reader(f), []))


class AppendingCSVLogger(CSVLogger):
    """Lightning's CSVLogger, except that an existing metrics.csv is continued, not deleted (resumed fits)."""

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


def _default_classes() -> dict[str, str]:
    """The classes a recipe gets when it names none: the GPT and its text data."""
    return {
        "model": f"{GPTLightningModule.__module__}.{GPTLightningModule.__name__}",
        "data": f"{TextDataModule.__module__}.{TextDataModule.__name__}",
    }


SUBCOMMANDS = ("fit", "validate", "test", "predict")


def _class_arguments(argv: list[str]) -> tuple[dict[str, list[tuple[int, int, str | None]]], dict[str, str]]:
    """Where model / data classes are chosen: ``({key: [(index, n_tokens, class), ...] on the command line},
    {key: the class a --config file names})``."""
    import yaml

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
        if path and Path(path).is_file():
            try:
                cfg = yaml.safe_load(Path(path).read_text()) or {}
            except yaml.YAMLError:
                continue  # jsonargparse reports it
            for key in ("model", "data"):
                value = cfg.get(key) if isinstance(cfg, dict) else None
                if isinstance(value, str):  # `model: MyModule`
                    in_configs[key] = value
                elif isinstance(value, dict) and "class_path" in value:
                    in_configs[key] = value["class_path"]
    return on_command_line, in_configs


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
        known = sorted({c.__name__ for c in _subclasses(base)[1:] if not c.__name__.startswith("_")})
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


class DistlabCLI(LightningCLI):
    """LightningCLI with distlab's checks: launcher world size, data and model consistency."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        given = kwargs.get("args")
        self._argv: list[str] | None = (
            None  # the command line as parsed; None: args given as a dict/Namespace
        )
        self.classes_given: set[str] = set()
        if given is None or isinstance(given, (list, tuple)):
            argv = list(sys.argv[1:] if given is None else given)
            scan = _class_arguments(argv)  # reads each --config file once for both
            self.classes_given = classes_given(argv, scan)
            self._argv = classes_first(argv, scan)
        super().__init__(*args, **kwargs)

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
        if not ckpt or ckpt in ("last", "best", "hpc", "registry"):
            return
        if not Path(ckpt).exists():
            raise ConfigError(
                f"checkpoint not found: {ckpt!r}; pass --ckpt_path to an existing .ckpt file or folder"
            )
        hparams = checkpoint_hparams(ckpt)  # weights_only; a DCP folder's .metadata checked first
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
        known = {k: v for k, v in hparams.items() if k in init}
        differ = [
            f"model.{k}={v!r} (config: {init.get(k)!r})"
            for k, v in known.items()
            if _plain(init.get(k)) != _plain(v)
        ]
        if differ:
            rank_zero_info(f"distlab: from the checkpoint, differing from the config: {', '.join(differ)}")
        self.config = self.parser.parse_object(
            {subcommand: {"model": {"class_path": model.get("class_path"), "init_args": known}}}, self.config
        )

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        stop = CheckpointOnStopRequest.from_env()
        if stop is not None:
            callbacks = [*callbacks, stop]
        fault = FaultInjection.from_env()
        if fault is not None:
            callbacks = [*callbacks, fault]
            rank_zero_info(
                f"distlab: fault injection armed: {fault.kind} on rank {fault.rank} at step {fault.step}"
            )
        notes = reconcile_trainer_config(config)
        if notes:
            rank_zero_info(f"distlab: matched the launcher: {', '.join(notes)}")
        if config.get("logger") in (None, True):
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
        cfg = self.config.get(str(self.subcommand), self.config)
        trainer = cfg.get("trainer")
        if trainer is not None and trainer.get("default_root_dir"):
            check_run_folder(trainer.get("default_root_dir"))
        if self.subcommand == "fit" and trainer is not None and not trainer.get("fast_dev_run"):
            max_steps = trainer.get("max_steps")
            if max_steps is None or max_steps < 1:
                raise ConfigError(
                    f"trainer.max_steps must be a positive integer (the training stream is endless), got {max_steps}"
                )

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as e:
            # Building the objects from the config: whatever fails here is the user's input (an unknown
            # strategy, an accelerator that is absent, a bad value a class refused). One line, exit 2.
            cause = _find_in_chain(e, (ConfigError,))
            raise (cause or ConfigError(f"{type(e).__name__}: {_first_line(e)}")) from None
        check_process_group_plan(self.trainer)
        model, dm = self.model, self.datamodule
        if isinstance(model, GPTLightningModule) and isinstance(dm, TextDataModule):
            if dm.seq_len > model.config.sequence_len:
                raise ConfigError(
                    f"data.seq_len={dm.seq_len} exceeds the model context model.sequence_len="
                    f"{model.config.sequence_len}; lower data.seq_len or raise model.sequence_len"
                )
            dm.prepare_splits()  # fail now, in one line, on a bad path or an empty validation split

    def _check_ckpt_path(self, subcommand: str) -> str | None:
        """A sharded (FSDP2) checkpoint folder needs the fsdp2 strategy to load it (that it exists and runs no
        code was checked when the config was parsed, in :meth:`_parse_ckpt_path`)."""
        ckpt = self.config_init[subcommand].get("ckpt_path")
        if not ckpt or ckpt in ("last", "best", "hpc", "registry"):
            return ckpt
        path = Path(ckpt)
        if path.is_dir() and type(self.trainer.strategy).__name__ != "FSDP2Strategy":
            raise ConfigError(
                f"{ckpt!r} is a sharded (FSDP2) checkpoint folder, but the strategy is "
                f"{type(self.trainer.strategy).__name__}; add --config configs/trainer/fsdp2_cpu.yaml (or fsdp2_gpu.yaml), "
                "or export it first: python scripts/export_fsdp_checkpoint.py FOLDER model.pt"
            )
        return ckpt

    def before_validate(self) -> None:
        self._check_ckpt_path("validate")

    def before_test(self) -> None:
        self._check_ckpt_path("test")

    def before_fit(self) -> None:
        """A restarted job resumes from its last checkpoint; a fresh fit must not mix with an earlier run's."""
        if restart_count() > 0 and not self.config_init["fit"].get("ckpt_path"):
            # torchrun --max-restarts / a SLURM requeue started this attempt: continue where the job was
            self.config_init["fit"]["ckpt_path"] = "last"
            fresh_store_after_restart()  # not the first attempt's rendezvous keys (pytorch#167288)
            folder = checkpoint_folder(self.trainer)
            found = folder.is_dir() and any(folder.glob("last*.ckpt"))
            rank_zero_info(
                f"distlab: restart {restart_count()} of this job: resuming from the last checkpoint in {folder}"
                if found
                else f"distlab: restart {restart_count()} of this job: no checkpoint in {folder} yet, starting over"
            )
        check_trainer = getattr(self.model, "check_trainer", None)
        if callable(check_trainer):
            check_trainer(self.trainer)  # the module's own refusals, before a file is written
        if self._check_ckpt_path("fit"):
            return  # resuming: the folder is meant to hold that run's checkpoints
        for cb in self.trainer.checkpoint_callbacks:
            folder = Path(cb.dirpath) if cb.dirpath else checkpoint_folder(self.trainer)
            existing = sorted(folder.glob("*.ckpt")) if folder.is_dir() else []
            if existing:
                raise ConfigError(
                    f"{folder} already holds checkpoints of an earlier run ({existing[-1].name}); resume with "
                    f"--ckpt_path {existing[-1]}, or set another --trainer.default_root_dir, or delete the folder"
                )


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
    return {**kwargs, **{sub: dict(kwargs) for sub in ("fit", "validate", "test", "predict")}}


def run_cli(args: list[str] | None = None) -> DistlabCLI:
    """Run ``distlab fit|validate|test|predict`` in this process and return the CLI (``.trainer``, ``.model``).

    The launch environment a run writes (MASTER_PORT, LOCAL_RANK, ...) is undone afterwards, so a notebook
    can call it again."""
    torch.set_float32_matmul_precision("high")
    with launch_env_restored():
        return _make_cli(args)


def _make_cli(args: list[str] | None) -> DistlabCLI:
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


def generate_main(argv: list[str]) -> str:
    """``distlab generate``: sample from a checkpoint; returns (and prints) the text."""
    from jsonargparse import ArgumentParser

    from distlab.checkpoint import load_gpt
    from distlab.data.tokenizer import ByteTokenizer

    parser = ArgumentParser(
        prog="distlab generate", description="Sample text from a trained checkpoint.", exit_on_error=False
    )
    parser.add_argument(
        "--ckpt_path",
        type=str,
        required=True,
        help="a .ckpt written by distlab fit, or a distlab export .safetensors",
    )
    parser.add_argument("--prompt", type=str, default="def ", help="text to continue")
    parser.add_argument("--max_new_tokens", type=int, default=200, help="bytes to generate")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    parser.add_argument("--top_k", type=int | None, default=50, help="sample from the k most likely bytes")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    args = parser.parse_args(argv)
    if args.max_new_tokens < 0:
        raise ConfigError(f"--max_new_tokens must be >= 0, got {args.max_new_tokens}")
    model = load_gpt(args.ckpt_path)
    tok = ByteTokenizer()
    idx = torch.tensor([tok.encode(args.prompt, bos=True)], dtype=torch.long)
    gen = torch.Generator().manual_seed(args.seed)
    out = model.generate(
        idx, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, generator=gen
    )
    text = tok.decode(out[0].tolist())
    print(text)
    return text


def export_main(argv: list[str]) -> Path:
    """``distlab export``: a fit's checkpoint (file, or FSDP2 folder) -> .safetensors, for sharing without pickle."""
    from jsonargparse import ArgumentParser

    from distlab.checkpoint import export_safetensors

    parser = ArgumentParser(
        prog="distlab export",
        description="Write a checkpoint's model weights and hyperparameters as safetensors (no pickle).",
        exit_on_error=False,
    )
    parser.add_argument(
        "--ckpt_path", type=str, required=True, help="a .ckpt file or an FSDP2 checkpoint folder"
    )
    parser.add_argument("--out", type=str, required=True, help="output file, e.g. model.safetensors")
    parser.add_argument("--overwrite", type=bool, default=False, help="replace an existing --out")
    args = parser.parse_args(argv)
    out = export_safetensors(args.ckpt_path, args.out, overwrite=args.overwrite)
    print(f"wrote {out}")
    return out


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``distlab`` console script; ``args`` lets tests and notebooks call it."""
    argv = sys.argv[1:] if args is None else list(args)
    try:
        with launch_env_restored():
            if argv and argv[0] == "generate":
                generate_main(argv[1:])
            elif argv and argv[0] == "export":
                export_main(argv[1:])
            else:
                run_cli(args)  # None: LightningCLI reads sys.argv itself
    except Exception as e:
        # Bad input (ConfigError, exit 2) and stops every rank agreed on (DistlabError: NaN loss, a failed
        # evaluation; exit 1) are one line, also when they come back from ddp_spawn children as the text
        # of a ProcessRaisedException.
        found = one_line_error(e)
        if found is None:
            raise
        line, code = found
        print(f"distlab: error: {line}", file=sys.stderr)
        sys.exit(code)


def _plain(value: Any) -> Any:
    """A config value with its sequences as lists: a checkpoint stores the tuple (0.8, 0.95) as a list."""
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def _find_in_chain(
    e: BaseException, match: tuple[type, ...] | Callable[[BaseException], bool]
) -> BaseException | None:
    """The first exception in ``e``'s cause/context chain that is one of the types (or satisfies ``match``)."""
    test = match if callable(match) else lambda x: isinstance(x, match)
    seen = set()
    while e is not None and id(e) not in seen:
        if test(e):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def condense_argument_error(message: str) -> str:
    """jsonargparse's multi-line error -> one line: the key and the specific problem(s)."""
    noise = ("Does not validate against any of the Union subtypes", "Subtypes:", "Errors:", "Given value")
    lines = [line.strip().removeprefix("- ").strip() for line in message.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(noise) and ln != "Expected a <class 'NoneType'>"]
    return " ".join(lines) + " (see --help)"


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


# Lightning's errors about the user's settings that surface only once training runs (a monitored metric that
# is never logged): (exception class name, text in its message). Other Lightning errors keep their traceback.
LIGHTNING_SETTING_ERRORS = (
    ("MisconfigurationException", "could not find the monitored key"),
    ("RuntimeError", "Early stopping conditioned on metric"),
)


def _is_lightning_setting_error(e: BaseException) -> bool:
    return any(type(e).__name__ == name and text in str(e) for name, text in LIGHTNING_SETTING_ERRORS)


def one_line_error(e: BaseException) -> tuple[str, int] | None:
    """(message, exit code) for distlab's own errors and Lightning's about the user's settings, directly or
    inside a spawn child's traceback text."""
    from jsonargparse import ArgumentError

    found = _find_in_chain(e, (ConfigError, DistlabError))
    if isinstance(found, ConfigError):
        return _first_line(found), 2
    if isinstance(found, DistlabError):
        return _first_line(found), 1
    if isinstance(e, ArgumentError):
        return condense_argument_error(str(e)), 2
    lightning = _find_in_chain(e, _is_lightning_setting_error)
    if lightning is not None:
        return f"{type(lightning).__name__}: {_first_line(lightning)}", 2
    # A spawn child's error arrives as traceback text: its last line names the class (with its module)
    markers = [(f"{cls.__module__}.{cls.__name__}: ", 2) for cls in _subclasses(ConfigError)]
    markers += [(f"{cls.__module__}.{cls.__name__}: ", 1) for cls in _subclasses(DistlabError)]
    for line in reversed(str(e).splitlines()):
        for marker, code in markers:
            if line.startswith(marker):
                return line[len(marker) :], code
        for name, text in LIGHTNING_SETTING_ERRORS:
            m = re.match(rf"(?:[\w.]+\.)?{name}: (.*)", line)
            if m and text in m.group(1):
                return f"{name}: {m.group(1)}", 2
    return None


def _subclasses(cls: type) -> list[type]:
    """``cls`` and every subclass imported so far (distlab's callbacks, which define error classes, included)."""
    import distlab.callbacks  # noqa: F401  (defines the DistlabError subclasses)

    out = [cls]
    for sub in cls.__subclasses__():
        out += _subclasses(sub)
    return out


if __name__ == "__main__":
    main()
