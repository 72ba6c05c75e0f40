"""The domains of Lightning's own settings that users put in distlab configs.

Lightning annotates its arguments as plain ``int`` / ``float`` / ``str``: ``patience: -1``,
``save_top_k: -5``, ``flush_logs_every_n_steps: 0`` or ``decay: 1.5`` pass its parser and then do nothing,
the opposite, or crash mid-run. distlab declares their domains here, as its own classes declare theirs in
their signatures (:mod:`distlab.domains`):

- :data:`TRAINER_DOMAINS` - every argument of ``lightning.Trainer``;
- :data:`CLASS_DOMAINS` - every argument of every class exported by ``lightning.pytorch.callbacks``,
  ``lightning.pytorch.loggers`` and ``lightning.pytorch.profilers`` whose annotation does not already say
  which values it takes (a ``bool``, a ``Literal``, a callable). A subclass (a user's own, or Lightning's
  ``RichModelSummary`` of ``ModelSummary``) inherits its bases' entries.

:func:`check_lightning_settings` refuses a value outside its domain in one line, after parsing and before
anything is built or written (``distlab.preflight.check_parsed`` calls it). ``tests/cli/test_lightning_domains.py``
walks the installed Lightning's signatures: an argument with no entry here fails it (so a new Lightning
release's new argument is noticed), and every entry's outside values are fed through the real CLI.

A domain is a type, a :class:`~distlab.domains.Rule` (a check with its own words and the values it
refuses), or :data:`PASSED_ON` (a mapping of options handed to another library, which checks
them when the class is built; the CLI turns that error into one line).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Literal, NamedTuple

import torch

from distlab.domains import (
    CheckpointFileName,
    DeviceText,
    Duration,
    FileName,
    Finite,
    FractionOfEpoch,
    HalfOpenUnitInterval,
    NonEmptyText,
    NonNegative,
    NonNegativeInt,
    Port,
    Positive,
    PositiveInt,
    Rule,
    Text,
    TorchDevice,
    UnitInterval,
    WritableFolder,
    conforms,
    refusal,
)
from distlab.errors import ConfigError, closest

# ---- the Trainer's arguments --------------------------------------------------------------------------
# Class-valued arguments (accelerator, strategy, logger, callbacks, profiler, plugins) are checked by the parser
# (a class path: its own arguments by CLASS_DOMAINS below) and by Lightning's registries when the Trainer is built
# (a name); the CLI turns that error into one line.
LIGHTNING_CHECKS = "checked by the parser (a class path) and by Lightning when the Trainer is built (a name)"

TRAINER_DOMAINS: dict[str, Any] = {
    "accelerator": LIGHTNING_CHECKS,
    "strategy": LIGHTNING_CHECKS,
    "devices": Literal["auto", -1] | PositiveInt | list[NonNegativeInt] | DeviceText,
    "num_nodes": PositiveInt,
    "precision": LIGHTNING_CHECKS,  # a Literal in Lightning's own signature
    "logger": LIGHTNING_CHECKS,
    "callbacks": LIGHTNING_CHECKS,
    "fast_dev_run": bool | NonNegativeInt,
    "max_epochs": Literal[-1] | PositiveInt | None,
    "min_epochs": NonNegativeInt | None,
    "max_steps": Rule(  # (-1, Lightning's "no limit", suits evaluation only: fit needs an end, preflight)
        lambda v: isinstance(v, int) and not isinstance(v, bool) and (v >= 1 or v == -1),
        "an integer >= 1 (-1, no limit, suits validate and test only: a fit needs an end)",
        (0, -2, 1.5, "x", None),
    ),
    "min_steps": NonNegativeInt | None,
    "max_time": Duration | timedelta | dict[str, NonNegativeInt] | None,
    "limit_train_batches": NonNegativeInt | UnitInterval | None,
    "limit_val_batches": NonNegativeInt | UnitInterval | None,
    "limit_test_batches": NonNegativeInt | UnitInterval | None,
    "limit_predict_batches": NonNegativeInt | UnitInterval | None,
    "overfit_batches": NonNegativeInt | UnitInterval,
    "val_check_interval": PositiveInt
    | FractionOfEpoch
    | Duration
    | timedelta
    | dict[str, NonNegativeInt]
    | None,
    "check_val_every_n_epoch": PositiveInt | None,
    "num_sanity_val_steps": Literal[-1] | NonNegativeInt | None,
    "log_every_n_steps": PositiveInt | None,
    "enable_checkpointing": bool | None,
    "enable_progress_bar": bool | None,
    "enable_model_summary": bool | None,
    "accumulate_grad_batches": PositiveInt,
    "gradient_clip_val": NonNegative | None,
    "gradient_clip_algorithm": Literal["norm", "value"] | None,
    "deterministic": bool | Literal["warn"] | None,
    "benchmark": bool | None,
    "inference_mode": bool,
    "use_distributed_sampler": bool,
    "profiler": LIGHTNING_CHECKS,
    "detect_anomaly": bool,
    "barebones": bool,
    "plugins": LIGHTNING_CHECKS,
    "sync_batchnorm": bool,
    "reload_dataloaders_every_n_epochs": NonNegativeInt,
    "default_root_dir": WritableFolder | None,
    "enable_autolog_hparams": bool,
    "model_registry": LIGHTNING_CHECKS,
}


def check_trainer_domains(trainer: Mapping[str, Any]) -> None:
    """Each Trainer argument given must lie in its domain in :data:`TRAINER_DOMAINS`."""
    for key, value in trainer.items():
        domain = TRAINER_DOMAINS.get(key, LIGHTNING_CHECKS)
        if isinstance(domain, str) or _is_class_spec(value):
            continue
        if not conforms(domain, value):
            raise ConfigError(refusal(f"trainer.{key}", value, domain))


# ---- the arguments of Lightning's callbacks, loggers and profilers -----------------------------------------
PASSED_ON = "options handed on to another library, which checks them when the class is built"


def _accumulation_schedule(value: Any) -> bool:
    def whole(x: Any, least: int) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= least

    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(whole(k, 0) for k in value)
        and all(whole(v, 1) for v in value.values())
    )


LOGGER_NAME = (
    FileName | Literal[""] | None
)  # a folder under save_dir: '..' or an absolute path would leave it
CLASS_DOMAINS: dict[str, dict[str, Any]] = {
    # callbacks
    "BackboneFinetuning": {
        "unfreeze_backbone_at_epoch": NonNegativeInt,
        "backbone_initial_ratio_lr": Positive,
        "backbone_initial_lr": Positive | None,
        "initial_denom_lr": Positive,
        "rounding": NonNegativeInt,
    },
    "BatchSizeFinder": {
        "mode": Literal["power", "binsearch"],
        "steps_per_trial": PositiveInt,
        "init_val": PositiveInt,
        "max_trials": PositiveInt,
        "batch_arg_name": NonEmptyText,
        "margin": HalfOpenUnitInterval,
        "max_val": PositiveInt,
    },
    "EarlyStopping": {
        "monitor": NonEmptyText,
        "min_delta": NonNegative,  # a negative one counts every worse value as an improvement
        "patience": NonNegativeInt,
        "mode": Literal["min", "max"],
        "stopping_threshold": Finite | None,
        "divergence_threshold": Finite | None,
    },
    "GradientAccumulationScheduler": {
        "scheduling": Rule(
            _accumulation_schedule,
            "a non-empty mapping {epoch >= 0: batches >= 1}, e.g. {0: 4, 10: 1}",
            outside=({}, {0: 0}, {-1: 2}, "4"),
        ),
    },
    "LearningRateFinder": {
        "min_lr": Positive,
        "max_lr": Positive,
        "num_training_steps": PositiveInt,
        "mode": Literal["exponential", "linear"],
        "early_stop_threshold": Positive | None,
        "attr_name": Text,
    },
    "ModelCheckpoint": {
        "dirpath": WritableFolder | None,
        "filename": CheckpointFileName | None,
        "monitor": NonEmptyText | None,
        "save_top_k": Literal[-1] | NonNegativeInt,
        "mode": Literal["min", "max"],
        "every_n_train_steps": NonNegativeInt | None,  # 0 = not by steps
        "every_n_epochs": NonNegativeInt | None,
        "train_time_interval": timedelta | None,
    },
    "ModelPruning": {
        "pruning_fn": PASSED_ON,  # a name torch.nn.utils.prune knows (Lightning checks), or a callable
        "parameters_to_prune": PASSED_ON,  # (module, name) pairs: Python only
        "parameter_names": list[NonEmptyText] | None,
        "amount": NonNegativeInt | UnitInterval | Callable,
        "pruning_dim": NonNegativeInt | None,
        "pruning_norm": PositiveInt | None,
        "verbose": Literal[0, 1, 2],
    },
    "ModelSummary": {"max_depth": Literal[-1] | NonNegativeInt},
    "OnExceptionCheckpoint": {"dirpath": WritableFolder, "filename": FileName},
    "RichProgressBar": {"refresh_rate": NonNegativeInt, "console_kwargs": PASSED_ON},  # (rich's Console)
    "StochasticWeightAveraging": {
        "swa_lrs": Positive | list[Positive],
        "swa_epoch_start": PositiveInt | FractionOfEpoch,
        "annealing_epochs": PositiveInt,
        "device": TorchDevice | torch.device | None,  # (its default is torch.device("cpu"))
    },
    "SpikeDetection": {
        "window": PositiveInt,
        "warmup": NonNegativeInt,
        "atol": NonNegative | None,
        "rtol": NonNegative | None,
        "exclude_batches_path": WritableFolder | None,
    },
    "Timer": {
        "duration": Duration | timedelta | dict[str, NonNegativeInt] | None,
        "interval": Literal["step", "epoch"],
    },
    "TQDMProgressBar": {"refresh_rate": NonNegativeInt, "process_position": NonNegativeInt},
    "WeightAveraging": {"device": TorchDevice | NonNegativeInt | None},
    "EMAWeightAveraging": {
        "decay": UnitInterval,
        "update_every_n_steps": PositiveInt,
        "update_starting_at_step": NonNegativeInt | None,
        "update_starting_at_epoch": NonNegativeInt | None,
    },
    # loggers (names, versions and prefixes are free text; folders must be writable)
    "CSVLogger": {
        "save_dir": WritableFolder,
        "name": LOGGER_NAME,
        "version": NonNegativeInt | LOGGER_NAME,
        "prefix": Text,
        "flush_logs_every_n_steps": PositiveInt,
    },
    "TensorBoardLogger": {
        "save_dir": WritableFolder,
        "name": LOGGER_NAME,
        "version": NonNegativeInt | LOGGER_NAME,
        "prefix": Text,
        "sub_dir": FileName | None,
    },
    "WandbLogger": {
        "name": LOGGER_NAME,
        "save_dir": WritableFolder,
        "version": LOGGER_NAME,
        "dir": WritableFolder | None,
        "id": LOGGER_NAME,
        "project": LOGGER_NAME,
        "experiment": PASSED_ON,  # a wandb Run object: Python only
        "prefix": Text,
        "checkpoint_name": LOGGER_NAME,
    },
    "MLFlowLogger": {
        "experiment_name": NonEmptyText,
        "run_name": LOGGER_NAME,
        "tracking_uri": LOGGER_NAME,  # (mlflow checks the scheme)
        "tags": PASSED_ON,
        "save_dir": WritableFolder | None,
        "prefix": Text,
        "artifact_location": LOGGER_NAME,
        "run_id": LOGGER_NAME,
    },
    "CometLogger": {
        "api_key": LOGGER_NAME,
        "workspace": LOGGER_NAME,
        "project": LOGGER_NAME,
        "experiment_key": LOGGER_NAME,
        "prefix": LOGGER_NAME,
    },
    "LitLogger": {
        "root_dir": WritableFolder | None,
        "name": LOGGER_NAME,
        "teamspace": LOGGER_NAME,
        "metadata": dict[str, Text] | None,
        "checkpoint_name": LOGGER_NAME,
    },
    # profilers
    "Profiler": {"dirpath": WritableFolder | None, "filename": FileName | None},
    "AdvancedProfiler": {"line_count_restriction": Positive},
    "PyTorchProfiler": {
        "emit_nvtx": Rule(
            ok=lambda v: v is False or (v is True and torch.cuda.is_available()),
            wanted="true or false (true only where torch has CUDA: NVTX ranges mark CUDA work)",
            outside=(2,),
        ),
        "row_limit": Literal[-1] | PositiveInt,
        "sort_by_key": NonEmptyText | None,  # (Lightning checks it names a column)
        "table_kwargs": PASSED_ON,  # (torch.profiler's table)
    },
    "XLAProfiler": {"port": Port},
}


def domains_of(cls: type) -> dict[str, Any]:
    """The declared domains of ``cls``'s arguments: its own entry and its bases' (nearest first), for the
    arguments its signature still has."""
    try:
        names = set(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        return {}
    out: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        if base.__module__.startswith("lightning.") and base.__name__ in CLASS_DOMAINS:
            out.update(CLASS_DOMAINS[base.__name__])
    return {k: v for k, v in out.items() if k in names}


def check_lightning_settings(trainer: Mapping[str, Any]) -> None:
    """Each Lightning callback, logger and profiler the config names must get values inside its declared
    domains (:data:`CLASS_DOMAINS`); one-line ConfigError otherwise."""
    for where, _, cls, init in class_specs(trainer):
        if cls is None:
            continue
        for key, domain in domains_of(cls).items():
            if key not in init:
                continue
            if not isinstance(domain, str) and not conforms(domain, init[key]):  # (a str: PASSED_ON)
                raise ConfigError(refusal(f"{where} ({cls.__name__}).{key}", init[key], domain))


def check_named_components(trainer: Mapping[str, Any]) -> None:
    """An accelerator or profiler given by name must be one Lightning knows, and an accelerator one this machine
    has: the names are read from Lightning's registry and profiler classes (a new one joins by being there),
    before the Trainer is built (Lightning's own error would come after the run folder exists)."""
    from lightning.pytorch import profilers
    from lightning.pytorch.accelerators import AcceleratorRegistry

    accelerator = trainer.get("accelerator")
    if isinstance(accelerator, str) and "." not in accelerator:
        usable = {"auto"}
        for name in sorted(AcceleratorRegistry.available_accelerators()):
            try:
                if AcceleratorRegistry[name]["accelerator"].is_available():
                    usable.add(name)
            except Exception:  # noqa: BLE001 - its library is missing (torch_xla): not usable here
                pass
        if usable & {"cuda", "mps"}:
            usable.add("gpu")
        known = AcceleratorRegistry.available_accelerators() | {"auto", "gpu"}
        name = accelerator.lower()
        if name in ("gpu", "cuda") and name not in usable:
            raise ConfigError(
                f"trainer.accelerator={accelerator}, but this machine has no CUDA GPU that torch can use; use a CPU "
                "preset (configs/trainer/*_cpu.yaml) or --trainer.accelerator=cpu, or install torch's CUDA build"
            )
        if name not in usable:
            why = (
                "not available here: no such device, or its library is not installed"
                if name in known
                else "no accelerator has that name"
            )
            raise ConfigError(
                f"trainer.accelerator={accelerator} is not accepted ({why}); set trainer.accelerator to one of "
                f"{', '.join(sorted(usable))}"
            )
    strategy = trainer.get("strategy")
    if isinstance(strategy, str) and "." not in strategy:
        from lightning.pytorch.strategies import StrategyRegistry

        import distlab.strategies  # noqa: F401 - registers distlab's names

        names = sorted({*StrategyRegistry.available_strategies(), "auto"})
        if strategy not in names:
            ours = [n for n in names if n.startswith(("ddp_optimizer_sync", "fsdp2"))]
            raise ConfigError(
                f"trainer.strategy={strategy} is not accepted (no strategy has that name{closest(strategy, names)}); "
                f"set trainer.strategy to a registered name (distlab's: {', '.join(ours)}; Lightning's: auto, ddp, "
                "ddp_spawn, fsdp, ...) or a strategy class"
            )
    profiler = trainer.get("profiler")
    if isinstance(profiler, str) and "." not in profiler:
        names = sorted(
            n.removesuffix("Profiler").lower()
            for n in profilers.__all__
            if n.endswith("Profiler") and n not in ("Profiler", "PassThroughProfiler")
        )
        if profiler.lower() not in names:
            raise ConfigError(
                f"trainer.profiler={profiler} is not accepted (no profiler has that name); set trainer.profiler to one "
                f"of {', '.join(names)}, or a profiler class"
            )


class ClassSpec(NamedTuple):
    """One component the Trainer config names by class path: where (``trainer.callbacks``), its class name as
    written, the class (None if it does not import), and its init args ({} when none or not a mapping)."""

    where: str
    name: str
    cls: type | None
    init: Mapping[str, Any]


def class_specs(
    trainer: Mapping[str, Any], keys: tuple[str, ...] = ("callbacks", "logger", "profiler")
) -> list[ClassSpec]:
    """Every component under ``trainer.<key>`` given as a class path: the one walk over them that every check uses."""
    out = []
    for key in keys:
        specs = trainer.get(key)
        for spec in specs if isinstance(specs, list) else [specs]:
            if not hasattr(spec, "get") or not spec.get("class_path"):
                continue
            path, init = str(spec.get("class_path")), spec.get("init_args")
            out.append(
                ClassSpec(
                    f"trainer.{key}",
                    path.rsplit(".", 1)[-1],
                    class_named(path),
                    init if hasattr(init, "get") else {},
                )
            )
    return out


def component_class(key: str, value: Any) -> tuple[type | None, dict[str, Any]]:
    """(the class, the preset's init args) that ``trainer.<key>`` names: a class spec, a dotted class path, or a
    registered name (a strategy in Lightning's StrategyRegistry, a profiler by its short name: ``simple``); (None,
    {}) for anything else. The one resolver of names that checks and error lines use."""
    if hasattr(value, "get"):
        return class_named(str(value.get("class_path"))), {}
    if not isinstance(value, str) or not value:
        return None, {}
    if "." in value:
        return class_named(value), {}
    if key == "strategy":
        from lightning.pytorch.strategies import StrategyRegistry

        if value in StrategyRegistry:
            return StrategyRegistry[value]["strategy"], dict(StrategyRegistry[value]["init_params"])
    if key == "profiler":
        from lightning.pytorch import profilers

        found = (getattr(profilers, n) for n in profilers.__all__ if n.lower() == f"{value.lower()}profiler")
        return next(found, None), {}
    return None, {}


def class_named(class_path: str) -> type | None:
    """The class a (parsed, so importable) ``class_path`` names, or None."""
    import importlib

    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return cls if isinstance(cls, type) else None


def _is_class_spec(value: Any) -> bool:
    from jsonargparse import Namespace

    return isinstance(value, Namespace) or (isinstance(value, list) and any(_is_class_spec(v) for v in value))
