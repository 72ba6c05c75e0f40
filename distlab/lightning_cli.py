"""DistlabCLI: LightningCLI with distlab's checks between parsing, building and running (the ``distlab`` command's
fit/validate/test/predict; :mod:`distlab.cli` is the entry point that turns every failure into one line).

What it adds to LightningCLI: packaged recipes and class names resolved before parsing (:mod:`distlab.command_line`),
generate/export listed beside the Trainer subcommands (:mod:`distlab.commands`), every parsed value checked against
its declared domain before a class is built (:func:`distlab.preflight.check_parsed`), a ``--ckpt_path`` read without
running code (:mod:`distlab.cli_checkpoint`), distlab's callbacks and loggers added to the Trainer, and a fresh fit
refused in a folder that holds an earlier run. Use it through :func:`distlab.cli.main` or :func:`distlab.cli.run_cli`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_info

from distlab.callbacks.fault_injection import FaultInjection
from distlab.callbacks.preemption import CheckpointOnStopRequest, DataResumeCheck, SaveUnsavedSteps
from distlab.callbacks.rank_own_state import RankOwnTensors
from distlab.callbacks.resume import ConfiguredOptimizerSettings
from distlab.checkpoint import (
    guard_checkpoint_names,
    install_verified_checkpoint_io,
)
from distlab.cli_checkpoint import (
    apply_checkpoint_settings,
    checkpoint_folders,
    prepare_evaluation,
    resolve_for_run,
)
from distlab.cli_errors import (
    find_in_chain,
    first_line,
    in_our_words,
    raised_in_user_code,
)
from distlab.command_line import (
    _class_arguments,
    check_argument_order,
    class_paths_as_classes,
    classes_first,
    classes_given,
    config_args,
    model_flags,
    packaged_recipes,
)
from distlab.commands import FUNCTION_COMMANDS
from distlab.compat import MultiProcessingLauncher, set_launcher, start_method
from distlab.data.datamodule import TextDataModule
from distlab.data.digits import DigitsDataModule
from distlab.distributed.restart import fresh_store_after_restart
from distlab.domains import Seed
from distlab.errors import ConfigError
from distlab.launch import check_process_group_plan, reconcile_trainer_config, restart_count
from distlab.lightning_domains import class_named
from distlab.modules.gpt_module import GPTLightningModule
from distlab.preflight import (
    check_hook_signatures,
    check_loaders,
    check_parsed,
    check_run_folder_is_free,
    check_token_ids,
    is_launching_process,
    newest_checkpoint,
    notes,
)
from distlab.run_files import default_loggers, keep_earlier_config, run_folder, this_run
from distlab.strategies.launcher import SpawnLauncher


def _default_classes() -> dict[str, str]:
    """The classes a recipe gets when it names none: the GPT and its text data."""
    return {
        "model": f"{GPTLightningModule.__module__}.{GPTLightningModule.__name__}",
        "data": f"{TextDataModule.__module__}.{TextDataModule.__name__}",
    }


def _same_class(a: str, b: str) -> bool:
    """Whether two class names import the same class (``GPTLightningModule``, ``distlab.modules.GPTLightningModule``
    and its home module's path)."""
    if "." not in a:  # a short name, as LightningCLI accepts for a registered subclass
        return a == b.rsplit(".", 1)[-1]
    found = class_named(a)
    return found is not None and found is class_named(b)


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


class SaveConfigKeepingEarlier(SaveConfigCallback):
    """Lightning's SaveConfigCallback, except that a resume into its own run folder keeps the earlier segment's
    config.yaml (as config.1.yaml, ...) when the new one says something else: nothing the user had is lost."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.save_to_log_dir and not self.already_saved:
            log_dir = trainer.log_dir  # on every rank: it broadcasts
            if trainer.is_global_zero and log_dir is not None:
                new = self.parser.dump(self.config, skip_none=False)
                kept = keep_earlier_config(Path(log_dir), self.config_filename, new)
                if kept is not None:
                    rank_zero_info(
                        f"distlab: note: this run's settings differ from the earlier {self.config_filename} in "
                        f"{log_dir}; it is kept as {kept.name}"
                    )
        super().setup(trainer, pl_module, stage)


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
            # a class named that is the default one keeps the default: a recipe's bare settings (which omit
            # class_path) then still apply when a later --config names the same class with its own init_args
            defaults = _default_classes()
            self.classes_given = {
                key
                for key, class_path in classes_given(argv, scan).items()
                if not _same_class(str(class_path), defaults[key])
            }
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
        """LightningCLI's hook for ``--ckpt_path``'s hyperparameters: read without running code, the class checked,
        what differs said (:func:`distlab.cli_checkpoint.apply_checkpoint_settings`)."""
        self.config = apply_checkpoint_settings(self.config, self.parser, set(self._model_flags))

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        # every subcommand: a spawned rank's metric states must be its own (Lightning's ddp_spawn shares them)
        callbacks = [*callbacks, RankOwnTensors()]
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
        this_run.folder = trainer.get("default_root_dir")

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
                    "(model.depth, model.aspect_ratio or model.n_embd, model.sequence_len, model.vocab_size, data.batch_size)"
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
        check_hook_signatures([*self.trainer.callbacks, self.model, self.datamodule])
        install_verified_checkpoint_io(self.trainer.strategy)
        guard_checkpoint_names(self.trainer)
        # fail now, in one line, on a bad corpus, an empty validation split, a training split short of a batch
        if isinstance(self.datamodule, TextDataModule):
            self.datamodule.prepare_splits()
        elif isinstance(self.datamodule, DigitsDataModule):
            self.datamodule.prepare_splits(self.trainer.world_size)
        check_token_ids(self.model, self.datamodule)

    def before_validate(self) -> None:
        prepare_evaluation(self.trainer, self.model, self.config_init["validate"], "validate")

    def before_test(self) -> None:
        prepare_evaluation(self.trainer, self.model, self.config_init["test"], "test")

    def before_predict(self) -> None:
        prepare_evaluation(self.trainer, self.model, self.config_init["predict"], "predict")

    def before_fit(self) -> None:
        """A restarted job resumes from its last checkpoint; a fresh fit must not mix with an earlier run's."""
        if restart_count() > 0 and not self.config_init["fit"].get("ckpt_path"):
            # torchrun --max-restarts / a SLURM requeue started this attempt: continue from the newest checkpoint
            # the job saved (a recipe may keep no last.ckpt: its step-named ones count as much)
            fresh_store_after_restart()  # not the first attempt's rendezvous keys (pytorch#167288)
            folders = checkpoint_folders(self.trainer)
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
        _, origin = resolve_for_run(self.trainer, self.model, self.config_init["fit"], "fit")
        if restart_count() == 0 and is_launching_process():
            folder = run_folder(self.trainer)
            set_by = "--trainer.default_root_dir"
            if (
                folder.resolve() != Path(str(self.trainer.default_root_dir)).resolve()
                and self.trainer.loggers
            ):
                set_by = f"trainer.logger ({type(self.trainer.loggers[0]).__name__}: its save_dir, name and version)"
            configs = [path for _, path in config_args(self._argv or [])]
            check_run_folder_is_free(folder, origin, checkpoint_folders(self.trainer), set_by, configs)
            this_run.created = None if folder.exists() else folder


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
