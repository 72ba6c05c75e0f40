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

import atexit
import importlib
import importlib.util
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from distlab.callbacks.fault_injection import FaultInjection
from distlab.callbacks.preemption import CheckpointOnStopRequest, DataResumeCheck, SaveUnsavedSteps
from distlab.callbacks.resume import ConfiguredOptimizerSettings
from distlab.checkpoint import (
    check_lightning_checkpoint,
    check_same_optimizer,
    check_weights_fit,
    checkpoint_hparams,
    guard_checkpoint_names,
    install_verified_checkpoint_io,
    is_safetensors,
    plain_value,
    refuse_bad_hparams,
)
from distlab.cli_errors import (
    debug_requested,
    find_in_chain,
    first_line,
    in_our_words,
    is_stop_signal,
    raised_in_user_code,
    report,
    report_stop,
)
from distlab.command_line import (
    _class_arguments,
    check_argument_order,
    check_subcommand,
    check_text_arguments,
    class_paths_as_classes,
    classes_first,
    classes_given,
    config_args,
    model_flags,
    packaged_recipes,
)
from distlab.commands import FUNCTION_COMMANDS, run_function_command
from distlab.compat import MultiProcessingLauncher, set_launcher, start_method
from distlab.data.datamodule import TextDataModule
from distlab.distributed.restart import fresh_store_after_restart
from distlab.domains import Seed
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
    is_launching_process,
    newest_checkpoint,
    notes,
)
from distlab.run_files import checkpoint_folder, default_loggers, remove_failed_start, run_folder
from distlab.strategies.launcher import SpawnLauncher


def _default_classes() -> dict[str, str]:
    """The classes a recipe gets when it names none: the GPT and its text data."""
    return {
        "model": f"{GPTLightningModule.__module__}.{GPTLightningModule.__name__}",
        "data": f"{TextDataModule.__module__}.{TextDataModule.__name__}",
    }


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

        parser.add_argument(
            "--seed_everything",
            type=bool | Seed,
            default=self.seed_everything_default,
            help="a seed in [0, 2**32) set before the classes are built; true picks one at random, false sets none",
        )

    def _add_subcommands(self, parser, **kwargs: Any) -> None:
        """LightningCLI's fit/validate/test/predict, then distlab's generate and export (their parsers are built from
        the functions' signatures, :mod:`distlab.commands`), so that ``distlab --help`` lists every subcommand.
        :func:`main` runs generate/export from those parsers, without building a Trainer."""
        from distlab import compat
        from distlab.commands import function_command_parser

        super()._add_subcommands(parser, **kwargs)
        subcommands = compat.subcommands_action(parser)
        for name in FUNCTION_COMMANDS:
            command = function_command_parser(name)
            subcommands.add_subcommand(name, command, help=command.description)

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
        self._note_other_data_settings(cfg, ckpt, subcommand)
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
            if plain_value(init.get(k)) != plain_value(v)
        ]
        kept = [
            f"model.{k}={init.get(k)!r} (checkpoint: {hparams[k]!r})"
            for k in sorted(typed)
            if k in hparams and plain_value(init.get(k)) != plain_value(hparams[k])
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
    def _note_other_data_settings(cfg: Any, ckpt: str, subcommand: str) -> None:
        """Data settings other than those of the checkpoint's run are allowed (a new batch size is a choice), but a
        resume then does not continue the data where that run was, and an evaluation may run on another set (a
        split drawn with another seed can hold samples the run trained on): said in one line."""
        saved = checkpoint_hparams(ckpt, "datamodule_hyper_parameters")
        data = cfg.get("data")
        init = data.get("init_args") if data is not None and hasattr(data, "get") else None
        if not saved or init is None:
            return
        differ = [
            f"data.{k}={init.get(k)!r} (checkpoint: {v!r})"
            for k, v in saved.items()
            if k in init and plain_value(init.get(k)) != plain_value(v)
        ]
        if not differ:
            return
        if subcommand == "fit":
            rank_zero_info(
                f"distlab: note: resuming with other data settings than the checkpoint's run: {', '.join(differ)}; the "
                "data does not continue exactly where that run was"
            )
        else:
            rank_zero_info(
                f"distlab: note: {subcommand} runs with other data settings than the checkpoint's run: {', '.join(differ)}; "
                "its data may differ from what that run evaluated on (a split drawn another way can hold samples the "
                "run trained on)"
            )

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        stop = CheckpointOnStopRequest.from_env()
        if stop is not None:
            callbacks = [*callbacks, stop]
        if self.subcommand == "fit":
            # no finished step is lost when a fit ends between saves; a resume says what it cannot continue, and trains
            # with the optimizer settings it was given
            callbacks = [*callbacks, SaveUnsavedSteps(), DataResumeCheck(), ConfiguredOptimizerSettings()]
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
                evaluated=cfg.get("ckpt_path"),
            )
        return super()._instantiate_trainer(config, callbacks)

    def parse_arguments(self, parser: Any, args: Any) -> None:
        if self._argv is None:
            super().parse_arguments(parser, args)
        else:
            self.config = parser.parse_args(self._argv)
        subcommand = self.config.get("subcommand")
        cfg = self.config.get(subcommand, self.config) if subcommand else self.config
        if cfg.get("seed_everything") is True:  # Lightning's "choose randomly" is seed 0 (or PL_GLOBAL_SEED)
            cfg["seed_everything"] = seed = random_seed()
            rank_zero_info(f"distlab: seed_everything=true: seed {seed} (config.yaml records it)")

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
        guard_checkpoint_names(self.trainer)
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
                # a sharded (FSDP2 / HSDP) folder under another strategy: its whole training state, as one file
                import tempfile

                from distlab.checkpoint import consolidate_training_checkpoint

                fd, tmp = tempfile.mkstemp(prefix=f"{path.name}-", suffix=".consolidated.ckpt")
                os.close(fd)
                atexit.register(
                    Path(tmp).unlink, missing_ok=True
                )  # a copy: the folder stays the user's checkpoint
                ckpt = str(consolidate_training_checkpoint(path, tmp))
                self.config_init[subcommand]["ckpt_path"] = ckpt
                self._ckpt_origin = str(path)  # where it came from (the run folder it may continue in)
                rank_zero_info(
                    f"distlab: {path} is a sharded (FSDP2) checkpoint and the strategy is "
                    f"{type(self.trainer.strategy).__name__}: its weights and optimizer state, gathered into {ckpt}"
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
            set_by = "--trainer.default_root_dir"
            if (
                folder.resolve() != Path(str(self.trainer.default_root_dir)).resolve()
                and self.trainer.loggers
            ):
                set_by = f"trainer.logger ({type(self.trainer.loggers[0]).__name__}: its save_dir, name and version)"
            configs = [path for _, path in config_args(self._argv or [])]
            origin = getattr(self, "_ckpt_origin", None) or ckpt
            check_run_folder_is_free(folder, origin, self._checkpoint_folders(), set_by, configs)
            _created_run_folder = None if folder.exists() else folder


def random_seed(env: dict[str, str] | None = None) -> int:
    """A seed in [0, 2**32) for ``seed_everything: true``: random, but the same in every process of one launched job
    (torchrun's run id, SLURM's job and step), each of which parses the config itself; PL_GLOBAL_SEED (Lightning's
    spawned ranks inherit it) wins."""
    import hashlib
    import secrets

    env = os.environ if env is None else env
    if env.get("PL_GLOBAL_SEED", "").strip().isdigit():
        return int(env["PL_GLOBAL_SEED"]) % 2**32
    job = env.get("TORCHELASTIC_RUN_ID") or (
        f"{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}" if "SLURM_JOB_ID" in env else None
    )
    if job:
        return int.from_bytes(hashlib.sha256(job.encode()).digest()[:4], "little")
    return secrets.randbelow(2**32)


def _parser_kwargs() -> dict[str, Any]:
    """Every parser raises on bad input (we print one line) instead of printing a usage wall."""
    kwargs: dict[str, Any] = {"exit_on_error": False}
    if importlib.util.find_spec("omegaconf"):
        kwargs["parser_mode"] = "omegaconf"
    top = {
        **kwargs,
        "description": "distlab: train and evaluate a LightningModule on any number of ranks; sample from or "
        "export a checkpoint. Each subcommand lists its options: distlab SUBCOMMAND --help.",
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


_run_folder: str | None = None  # the run's folder once parsed: where an internal error's traceback is saved
_created_run_folder: Path | None = None  # the run folder this fit creates (it did not exist before)


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
