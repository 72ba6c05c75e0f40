"""DistlabCLI: LightningCLI, plus what only a command line knows (argv, the environment, files, run folders); each
override says what it adds. The rules about what the settings mean are the classes' own. Use it through
:func:`distlab.cli.main`.
"""

from __future__ import annotations

import enum
import hashlib
import importlib.util
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import lightning as L
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_info

from distlab import compat
from distlab.callbacks.fault_injection import FaultInjection
from distlab.callbacks.preemption import CheckpointOnStopRequest, DataResumeCheck, SaveUnsavedSteps
from distlab.callbacks.rank_own_state import RankOwnTensors
from distlab.callbacks.resume import ConfiguredOptimizerSettings
from distlab.checkpoint import guard_checkpoint_names, install_verified_checkpoint_io, newest_checkpoint
from distlab.cli.argv import (
    check_config_files,
    class_paths_as_classes,
    classes_first,
    classes_given,
    config_files,
    packaged_recipes,
)
from distlab.cli.checkpoint import (
    apply_checkpoint_settings,
    checkpoint_folders,
    prepare_evaluation,
    resolve_for_run,
)
from distlab.cli.commands import FUNCTION_COMMANDS, function_command_parser
from distlab.cli.errors import find_in_chain, first_line, parser_error_line, user_code_location
from distlab.cli.run_folder import (
    check_run_folder_is_free,
    default_loggers,
    is_launching_process,
    keep_earlier_config,
    run_folder,
    this_run,
)
from distlab.distributed.restart import fresh_store_after_restart
from distlab.domains import Seed
from distlab.errors import ConfigError
from distlab.launch import (
    check_launch_env,
    check_process_group_plan,
    reconcile_trainer_config,
    restart_count,
    started_by_cluster,
)
from distlab.strategies.launcher import SpawnLauncher, quick_start_method

DEFAULT_CLASSES = {"model": "distlab.modules.GPTLightningModule", "data": "distlab.data.TextDataModule"}


def make_cli(args: list[str] | None) -> DistlabCLI:
    compat.int_before_float(compat.lightning_init_functions())  # --trainer.limit_train_batches=2 stays an int
    # allow_abbrev: --trainer.max_step is no max_steps
    kwargs: dict[str, Any] = {"exit_on_error": False, "allow_abbrev": False}
    if importlib.util.find_spec("omegaconf"):
        kwargs["parser_mode"] = "omegaconf"
    top = {**kwargs, "description": "distlab: train and evaluate a LightningModule on any number of ranks; sample "
           "from or export a checkpoint; prepare token shards. Each subcommand lists its options: distlab SUB --help."}  # fmt: skip
    return DistlabCLI(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_callback=SaveConfigKeepingEarlier,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={**top, **{sub: dict(kwargs) for sub in ("fit", "validate", "test", "predict")}},
        args=args,
        auto_configure_optimizers=False,
    )


class SaveConfigKeepingEarlier(SaveConfigCallback):
    """Lightning's SaveConfigCallback, except that an earlier config.yaml that says something else is kept."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.save_to_log_dir and not self.already_saved:
            log_dir = trainer.log_dir  # on every rank: it broadcasts
            if trainer.is_global_zero and log_dir is not None:
                kept = keep_earlier_config(
                    Path(log_dir), self.config_filename, self.parser.dump(self.config, skip_none=False)
                )
                if kept is not None:
                    rank_zero_info(f"distlab: note: this run's settings differ from the earlier {self.config_filename} "
                                   f"in {log_dir}; it is kept as {kept.name}")  # fmt: skip
        super().setup(trainer, pl_module, stage)


class DistlabCLI(LightningCLI):
    """LightningCLI with distlab's defaults, callbacks, loggers and run-folder rules (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        given = kwargs.get("args")
        self._argv: list[str] | None = None  # the command line as parsed; None: given as a dict/Namespace
        self.classes_given: set[str] = set()
        if given is None or isinstance(given, (list, tuple)):
            argv = class_paths_as_classes(packaged_recipes(list(sys.argv[1:] if given is None else given)))
            check_config_files(argv)
            # a class named that is the default keeps the default, so a recipe's bare settings still apply
            self.classes_given = {k for k, v in classes_given(argv).items() if v.rsplit(".", 1)[-1] !=
                                  DEFAULT_CLASSES[k].rsplit(".", 1)[-1]}  # fmt: skip
            self._argv = classes_first(argv)
        self._model_flags = [a.split("=", 1)[0].removeprefix("--model.").removeprefix("init_args.")
                             for a in self._argv or [] if a.startswith("--model.")]  # fmt: skip
        super().__init__(*args, **kwargs)

    def add_default_arguments_to_parser(self, parser) -> None:
        """``--seed_everything``: true (pick one), false (none) or a seed numpy accepts."""
        parser.add_argument("--seed_everything", type=bool | Seed, default=self.seed_everything_default,
                            help="a seed in [0, 2**32) set before the classes are built; true picks one, false none")  # fmt: skip

    def _add_subcommands(self, parser, **kwargs: Any) -> None:
        """LightningCLI's subcommands, then generate/export/prepare: ``distlab --help`` lists every subcommand."""
        super()._add_subcommands(parser, **kwargs)
        subcommands = compat.subcommands_action(parser)
        for name in FUNCTION_COMMANDS:
            command = function_command_parser(name)
            subcommands.add_subcommand(name, command, help=command.description)

    def add_arguments_to_parser(self, parser) -> None:
        defaults = {k: {"class_path": v} for k, v in DEFAULT_CLASSES.items() if k not in self.classes_given}
        parser.set_defaults({"trainer.default_root_dir": "runs/default", **defaults})

    def _parse_ckpt_path(self) -> None:
        """``--ckpt_path``'s hyperparameters read without running code, the class checked, what differs said."""
        self.config = apply_checkpoint_settings(self.config, self.parser, set(self._model_flags))

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
        cfg = self.config.get(str(self.subcommand), self.config)
        trainer = cfg.get("trainer") or {}
        root = trainer.get("default_root_dir")
        if isinstance(root, str) and root and "://" not in root:  # one folder for all; `a/../b` resolved
            trainer["default_root_dir"] = os.path.normpath(os.path.expanduser(root))
        # a class path in a config file means the class, as on the command line
        for key in ("strategy", "accelerator"):
            value = trainer.get(key)
            if isinstance(value, str) and class_paths_as_classes([f"--trainer.{key}={value}"])[0][-1] == "}":
                trainer[key] = Namespace(class_path=value, init_args=Namespace())
        _enum_defaults_as_values(cfg)
        this_run.folder = trainer.get("default_root_dir")

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        callbacks = [*callbacks, RankOwnTensors()]  # a spawned rank's metric states are its own (ddp_spawn)
        stop = CheckpointOnStopRequest.from_env()
        callbacks += [stop] if stop is not None else []
        if self.subcommand == "fit":  # no finished step lost; a resume says what it cannot continue
            callbacks += [SaveUnsavedSteps(), DataResumeCheck(), ConfiguredOptimizerSettings()]
        fault = FaultInjection.from_env()
        if fault is not None:
            callbacks.append(fault)
            rank_zero_info(
                f"distlab: fault injection armed: {fault.kind} on rank {fault.rank} at step {fault.step}"
            )
        matched = reconcile_trainer_config(config)
        if matched:
            rank_zero_info(f"distlab: matched the launcher: {', '.join(matched)}")
        if config.get("logger") in (None, True) and not config.get("barebones"):
            cfg = self.config.get(str(self.subcommand), self.config)
            config["logger"] = default_loggers(
                config.get("default_root_dir") or "runs/default",
                str(self.subcommand),
                resume=bool(cfg.get("ckpt_path")) or restart_count() > 0,
                evaluated=cfg.get("ckpt_path"),
            )
        return super()._instantiate_trainer(config, callbacks)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as e:  # building from the config: the user's input, or their class's bug
            cause = find_in_chain(e, (ConfigError,))
            if cause is None and user_code_location(e) is not None:
                raise  # a bug in the user's own class (its __init__): its traceback, with the file and line
            parser_said = "Parser key" in str(e) or "Does not validate against" in str(e)  # init_args
            said = parser_error_line(str(e)) if parser_said else f"{type(e).__name__}: {first_line(e)}"
            raise (cause or ConfigError(said)) from None
        check_launch_env(  # any strategy, Lightning's too
            self.trainer.num_nodes,
            self.trainer.num_devices,
            cluster=started_by_cluster(self.trainer.strategy),
        )
        check_process_group_plan(self.trainer)
        install_verified_checkpoint_io(self.trainer.strategy)
        guard_checkpoint_names(self.trainer)
        check_data = getattr(self.datamodule, "check_before_fit", None)
        if callable(check_data):  # a bad corpus, an empty split: refused now, before a folder is written
            check_data(self.trainer)
        fits_data = getattr(self.model, "check_data", None)
        if callable(fits_data):  # the module's own rules about its data (a fit from Python: at its start)
            fits_data(self.datamodule)

    def _prepare_evaluation(self) -> None:
        use_distlab_launcher(self.trainer.strategy)
        prepare_evaluation(self.trainer, self.model, self.config_init[self.subcommand], self.subcommand)

    before_validate = before_test = before_predict = _prepare_evaluation

    def before_fit(self) -> None:
        """A restarted job resumes from its newest checkpoint; a fresh fit must not mix with an earlier run's."""
        fit = self.config_init["fit"]
        if restart_count() > 0 and not fit.get("ckpt_path"):  # torchrun --max-restarts, a SLURM requeue
            fresh_store_after_restart()  # not the first attempt's rendezvous keys (pytorch#167288)
            newest = newest_checkpoint(checkpoint_folders(self.trainer))
            if newest is not None:
                fit["ckpt_path"] = str(newest)
            rank_zero_info(f"distlab: restart {restart_count()} of this job: "
                           + (f"resuming from {newest}" if newest else "no checkpoint yet, starting over"))  # fmt: skip
        use_distlab_launcher(self.trainer.strategy)
        for owner in (self.model, self.trainer.strategy):  # their own refusals, before a file is written
            check_trainer = getattr(owner, "check_trainer", None)
            if callable(check_trainer):
                check_trainer(self.trainer)
        origin = resolve_for_run(self.trainer, self.model, fit, "fit")
        if restart_count() == 0 and is_launching_process():
            folder = run_folder(self.trainer)
            set_by = "--trainer.default_root_dir"
            if self.trainer.loggers and folder.resolve() != Path(self.trainer.default_root_dir).resolve():
                set_by = f"trainer.logger ({type(self.trainer.loggers[0]).__name__}: its save_dir, name and version)"
            configs = [path for _, path in config_files(self._argv or [])]
            check_run_folder_is_free(folder, origin, checkpoint_folders(self.trainer), set_by, configs)
            this_run.created = None if folder.exists() else folder


def use_distlab_launcher(strategy: Any) -> None:
    """Lightning's ``ddp_spawn`` launches with distlab's launcher: a stop signal reaches the ranks (which save), and
    the ranks fork from a preloaded forkserver instead of each importing torch and Lightning (seconds each)."""
    launcher = strategy.launcher
    if type(launcher) is compat.MultiProcessingLauncher:
        method = quick_start_method(compat.start_method(launcher))
        compat.set_launcher(strategy, SpawnLauncher(strategy, start_method=method))


def _enum_defaults_as_values(cfg: Any) -> None:
    """Enum members in the parsed config replaced by their values: jsonargparse fills a class's enum default
    (Lightning's ``Timer(interval=Interval.step)``) and then cannot instantiate the class from it."""
    items = cfg.items() if hasattr(cfg, "items") else enumerate(cfg) if isinstance(cfg, list) else ()
    for key, value in list(items):
        if isinstance(value, enum.Enum) and isinstance(value.value, (str, int, float)):
            cfg[key] = value.value
        elif hasattr(value, "items") or isinstance(value, list):
            _enum_defaults_as_values(value)


def random_seed(env: dict[str, str] | None = None) -> int:
    """A seed in [0, 2**32) for ``seed_everything: true``: random, but the same in every process of one launched job
    (torchrun's run id, SLURM's job and step); PL_GLOBAL_SEED (Lightning's spawned ranks inherit it) wins."""
    env = os.environ if env is None else env
    if env.get("PL_GLOBAL_SEED", "").strip().isdigit():
        return int(env["PL_GLOBAL_SEED"]) % 2**32
    job = env.get("TORCHELASTIC_RUN_ID") or (
        f"{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}" if "SLURM_JOB_ID" in env else None
    )
    if job:
        return int.from_bytes(hashlib.sha256(job.encode()).digest()[:4], "little")
    return secrets.randbelow(2**32)
