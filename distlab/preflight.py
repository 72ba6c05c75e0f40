"""The one validation step between parsing a command line and building anything from it.

Each parameter's own domain is checked by the parser (:mod:`distlab.domains`). What needs more than one
value, the environment, or the file system is checked here, in two places of the CLI and in this order:

1. :func:`check_parsed` - after parsing, before any object, folder or process exists: the Trainer's
   arguments and those of Lightning's callbacks, loggers and profilers against their domains
   (:mod:`distlab.lightning_domains`), rules across fields (:data:`CROSS_FIELD_RULES`), the run folder's
   writability, and what the launch environment says (``WORLD_SIZE`` with no launcher, a
   ``MASTER_PORT`` that is no port, ``num_nodes`` that nothing will start).
2. :func:`check_before_run` - after the Trainer is built, before its first step writes anything: every
   checkpoint folder can be written, and a resume can continue (its step is below ``max_steps``; ``last``
   names a checkpoint that exists).

Everything here raises :class:`~distlab.errors.ConfigError` with one line: what, the value seen, what to set.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from distlab.domains import (
    CKPT_ALIASES,
    unwritable_reason,
)
from distlab.errors import ConfigError
from distlab.lightning_domains import (
    check_lightning_settings,
    check_named_components,
    check_trainer_domains,
    class_named,
    class_specs,
    component_class,
)
from distlab.metric_direction import mode_against_the_metric


# ---- rules across fields --------------------------------------------------------------------------------
# Each rule takes (subcommand, parsed config) and raises one ConfigError; a new rule joins by being listed in
# CROSS_FIELD_RULES. They read the parsed config only: nothing is built, read from disk or written yet.
def _spec(cfg: Mapping[str, Any], key: str) -> tuple[type | None, Mapping[str, Any]]:
    """(the class a config section names, or None; its init args) for ``model`` / ``data``."""
    spec = cfg.get(key)
    if spec is None or not hasattr(spec, "get"):
        return None, {}
    init = spec.get("init_args")
    return _class(spec.get("class_path")), (init if init is not None else {})


def _class(class_path: str | None) -> type | None:
    """The class a config section names (the parser already checked that it imports), or None."""
    return class_named(class_path) if class_path else None


def _is(cls: type | None, base: type) -> bool:
    return cls is not None and issubclass(cls, base)


def _explicit(cls: type | None, init: Mapping[str, Any], name: str) -> bool:
    """Whether ``name`` was set to something other than its default in ``cls``'s signature."""
    import inspect

    if cls is None or name not in init:
        return False
    param = inspect.signature(cls.__init__).parameters.get(name)
    plain = lambda v: tuple(v) if isinstance(v, (list, tuple)) else v  # noqa: E731 - a list given for a tuple default
    return param is not None and plain(init[name]) != plain(param.default)


def _endless_data(cfg: Mapping[str, Any]) -> bool:
    """The training data is a stream with no end (distlab's text data): epochs never end."""
    from distlab.data.datamodule import TextDataModule

    return _is(_spec(cfg, "data")[0], TextDataModule)


def _fit_has_an_end(subcommand: str, cfg: Mapping[str, Any]) -> None:
    trainer = cfg.get("trainer") or {}
    min_epochs, max_epochs = trainer.get("min_epochs"), trainer.get("max_epochs")
    if (
        subcommand == "fit"
        and isinstance(min_epochs, int)
        and isinstance(max_epochs, int)
        and 0 < max_epochs < min_epochs
    ):
        raise ConfigError(
            f"trainer.min_epochs={min_epochs} is beyond trainer.max_epochs={max_epochs}: the run stops at max_epochs "
            f"anyway; set trainer.min_epochs <= {max_epochs} (or leave it unset)"
        )
    if subcommand == "fit" and not trainer.get("fast_dev_run"):
        max_steps = trainer.get("max_steps")
        if max_steps is None or max_steps < 1:
            raise ConfigError(
                f"trainer.max_steps must be a positive integer (the training stream is endless), got {max_steps}"
            )
        min_steps = trainer.get("min_steps")
        if min_steps is not None and min_steps > max_steps:
            raise ConfigError(
                f"trainer.min_steps={min_steps} is beyond trainer.max_steps={max_steps}: the run stops at max_steps "
                f"anyway; set trainer.min_steps <= {max_steps} (or leave it unset)"
            )


def _model_and_data_fit_together(subcommand: str, cfg: Mapping[str, Any]) -> None:
    """distlab's own modules train on distlab's own data modules of their kind: a GPT needs token batches, the
    image classifier image batches (any other pairing fails inside the first step)."""
    from distlab.data.datamodule import TextDataModule
    from distlab.data.digits import DigitsDataModule
    from distlab.modules.classifier import ImageClassifier
    from distlab.modules.gpt_module import GPTLightningModule

    pairs = {GPTLightningModule: TextDataModule, ImageClassifier: DigitsDataModule}
    model_cls, _ = _spec(cfg, "model")
    data_cls, _ = _spec(cfg, "data")
    shipped_data = (TextDataModule, DigitsDataModule)
    for module, data in pairs.items():
        if _is(model_cls, module) and _is(data_cls, shipped_data) and not _is(data_cls, data):
            raise ConfigError(
                f"model {model_cls.__name__} trains on {data.__name__} batches, but data is {data_cls.__name__}; "
                f"set --data {data.__name__} (or your own data module of that kind)"
            )


def _window_fits_context(subcommand: str, cfg: Mapping[str, Any]) -> None:
    from distlab.modules.gpt_module import GPTLightningModule

    model_cls, model = _spec(cfg, "model")
    _, data = _spec(cfg, "data")
    if _is(model_cls, GPTLightningModule) and _endless_data(cfg):
        seq, ctx = data.get("seq_len", 0), model.get("sequence_len", 0)
        if seq > ctx:
            raise ConfigError(
                f"data.seq_len={seq} exceeds the model context model.sequence_len={ctx}; lower data.seq_len or "
                "raise model.sequence_len"
            )


def _vocabulary_holds_tokens(subcommand: str, cfg: Mapping[str, Any]) -> None:
    from distlab.data.tokenizer import ByteTokenizer
    from distlab.modules.gpt_module import GPTLightningModule

    model_cls, model = _spec(cfg, "model")
    need = ByteTokenizer.vocab_size
    if _is(model_cls, GPTLightningModule) and _endless_data(cfg) and model.get("vocab_size", need) < need:
        raise ConfigError(
            f"model.vocab_size={model['vocab_size']} is smaller than the byte tokenizer's {need} token ids "
            f"(256 bytes + the document separator); set model.vocab_size >= {need}"
        )


def _classes_cover_labels(subcommand: str, cfg: Mapping[str, Any]) -> None:
    """The digits' labels must each have a class (the module's own ``check_data`` says it; a fit from Python hears
    the same at its start)."""
    from distlab.data.digits import N_DIGIT_CLASSES, DigitsDataModule
    from distlab.modules.classifier import ImageClassifier, check_classes_cover_digits

    model_cls, model = _spec(cfg, "model")
    n = model.get("n_classes", N_DIGIT_CLASSES)
    if _is(model_cls, ImageClassifier) and _is(_spec(cfg, "data")[0], DigitsDataModule):
        check_classes_cover_digits(n)


# Settings of distlab's modules that only the Muon optimizer reads (ignored under optimizer: adamw).
MUON_ONLY = ("muon_momentum", "ns_dtype", "muon_lr")


def schedule_ignores(schedule: str) -> list[str]:
    """The settings of :func:`distlab.modules.schedule.lr_multiplier` that ``schedule`` does not read, found by
    running it: two values of the setting give the same multiplier at every step of a 100-step run."""
    import inspect

    from distlab.modules.schedule import lr_multiplier

    probes = {"warmdown_ratio": (0.1, 0.6), "min_lr_ratio": (0.0, 0.5)}
    settings = [n for n in inspect.signature(lr_multiplier).parameters if n in probes]
    inert = []
    for name in settings:
        a, b = ({name: v} for v in probes[name])
        if all(
            lr_multiplier(t, 100, 0, schedule, **a) == lr_multiplier(t, 100, 0, schedule, **b)
            for t in range(100)
        ):
            inert.append(name)
    return inert


def _head_dim_takes_effect(model_cls: type | None, model: Mapping[str, Any]) -> None:
    """An explicit ``head_dim`` must be the size the heads get: with ``n_head`` also set, the heads are
    ``n_embd / n_head`` wide, whether ``n_embd`` was given or derived from ``depth * aspect_ratio``."""
    from distlab.models.gpt import GPTConfig
    from distlab.modules.gpt_module import GPTLightningModule

    width, heads, head_dim = model.get("n_embd"), model.get("n_head"), model.get("head_dim")
    how = ""
    sizes = (model.get("depth"), model.get("aspect_ratio"), head_dim)
    if (
        width is None
        and _is(model_cls, GPTLightningModule)
        and all(isinstance(v, int) and v > 0 for v in sizes)
    ):
        width = GPTConfig.derived_width(*sizes)
        how = " (depth x aspect_ratio, rounded up to head_dim)"
    if (
        all(isinstance(v, int) and v > 0 for v in (width, heads, head_dim))
        and width % heads == 0
        and width // heads != head_dim
        and _explicit(model_cls, model, "head_dim")
    ):
        raise ConfigError(
            f"model.head_dim={head_dim} has no effect: model.n_embd={width}{how} and model.n_head={heads} make heads "
            f"of {width // heads}; set model.head_dim={width // heads}, or leave n_head unset (heads = n_embd / "
            "head_dim)"
        )


def _options_take_effect(subcommand: str, cfg: Mapping[str, Any]) -> None:
    """A setting that the rest of the config makes inert is refused (it silently would not do what was asked)."""
    model_cls, model = _spec(cfg, "model")
    if model.get("optimizer") == "adamw":
        inert = [f"model.{k}={model[k]!r}" for k in MUON_ONLY if _explicit(model_cls, model, k)]
        if inert:
            raise ConfigError(
                f"{', '.join(inert)} only apply to Muon, but model.optimizer='adamw'; remove them or set "
                "model.optimizer=muon"
            )
    schedule = model.get("schedule")
    if isinstance(schedule, str) and model_cls is not None:
        inert = [
            f"model.{k}={model[k]!r}" for k in schedule_ignores(schedule) if _explicit(model_cls, model, k)
        ]
        if inert:
            from typing import get_args

            from distlab.modules.schedule import ScheduleName

            ignored = set(schedule_ignores(schedule))
            readers = [
                f"{other}: {' and '.join(sorted(ignored - set(schedule_ignores(other))))}"
                for other in get_args(ScheduleName)
                if ignored - set(schedule_ignores(other))
            ]
            raise ConfigError(
                f"{', '.join(inert)} {'have' if len(inert) > 1 else 'has'} no effect under model.schedule={schedule!r}; "
                f"remove {'them' if len(inert) > 1 else 'it'}, or choose a schedule that reads "
                f"{'them' if len(inert) > 1 else 'it'} ({'; '.join(readers)})"
            )
    _head_dim_takes_effect(model_cls, model)
    data_cls, data = _spec(cfg, "data")
    if (
        data_cls is not None
        and "extensions" in data
        and data.get("paths") is None
        and _explicit(data_cls, data, "extensions")
    ):
        raise ConfigError(
            f"data.extensions={_shown_list(data['extensions'])} picks files from the folders in data.paths, and "
            "data.paths is unset (the embedded corpus: Python's standard library, .py files only); set data.paths to "
            "your files or folders, or remove data.extensions"
        )
    trainer = cfg.get("trainer") or {}
    strategy = trainer.get("strategy")
    if hasattr(strategy, "get") and strategy.get("class_path"):
        cls, init = _class(strategy.get("class_path")), strategy.get("init_args") or {}
        if "reproducible" in init and not init.get("reproducible") and _explicit(cls, init, "micro_shards"):
            raise ConfigError(
                f"trainer.strategy.micro_shards={init['micro_shards']} is read only in reproducible mode, which is off; "
                "set trainer.strategy.reproducible=true, or remove micro_shards"
            )
    import importlib.util

    if trainer.get("model_registry") and importlib.util.find_spec("litmodels") is None:
        raise ConfigError(
            f"trainer.model_registry={trainer['model_registry']!r} uploads checkpoints through the litmodels package, "
            "which is not installed, so nothing would be uploaded; pip install litmodels, or remove model_registry"
        )
    if trainer.get("gradient_clip_algorithm") is not None and not trainer.get("gradient_clip_val"):
        raise ConfigError(
            f"trainer.gradient_clip_algorithm={trainer['gradient_clip_algorithm']!r} clips nothing without "
            "trainer.gradient_clip_val; set trainer.gradient_clip_val, or remove the algorithm"
        )


# Trainer switches and what barebones mode needs each to be (Lightning's Trainer refuses any other value, one at a
# time): (accepted, the value to set). In barebones mode every one of them is off.
BAREBONES_OFF: dict[str, tuple[Callable[[Any], bool], str]] = {
    "enable_checkpointing": (lambda v: not v, "false"),
    "logger": (lambda v: v is None or v is False, "false"),
    "enable_progress_bar": (lambda v: not v, "false"),
    "log_every_n_steps": (lambda v: v in (None, 0), "null"),
    "enable_model_summary": (lambda v: not v, "false"),
    "num_sanity_val_steps": (lambda v: v in (None, 0), "0"),
    "fast_dev_run": (lambda v: v is False or v == 0, "false"),
    "detect_anomaly": (lambda v: not v, "false"),
    "profiler": (lambda v: v is None, "null"),
}
# Callbacks a switch turned off forbids (Lightning's callback connector refuses them mid-build).
SWITCHED_CALLBACKS = {"enable_checkpointing": "Checkpoint", "enable_progress_bar": "ProgressBar"}


def _switches_agree(subcommand: str, cfg: Mapping[str, Any]) -> None:
    """Trainer switches that Lightning refuses together are refused at once, every conflict in one line: barebones
    mode with any feature it turns off, a checkpoint or progress-bar callback with its switch off."""
    import lightning.pytorch.callbacks as lcb

    trainer = cfg.get("trainer") or {}
    barebones = bool(trainer.get("barebones"))
    off = {k for k in SWITCHED_CALLBACKS if barebones or trainer.get(k) is False}
    kinds = {k: getattr(lcb, base) for k, base in SWITCHED_CALLBACKS.items()}
    clashing = [
        (k, name)
        for _, name, cls, _ in class_specs(trainer, ("callbacks",))
        for k in off
        if cls is not None and issubclass(cls, kinds[k])
    ]
    if barebones:
        given = [
            f"trainer.{k}={trainer[k]!r}"
            for k, (ok, _) in BAREBONES_OFF.items()
            if k in trainer and not ok(trainer[k])
        ]
        fixes = [
            f"--trainer.{k}={to}"
            for k, (ok, to) in BAREBONES_OFF.items()
            if k in trainer and not ok(trainer[k])
        ]
        given += [f"trainer.callbacks {name}" for _, name in clashing]
        if given:
            remove = (
                " and remove " + ", ".join(name for _, name in clashing) + " from trainer.callbacks"
                if clashing
                else ""
            )
            raise ConfigError(
                f"trainer.barebones=true turns off logging, checkpoints, the progress bar, the model summary and "
                f"sanity checks, but this config sets {', '.join(given)}; to measure raw speed set "
                f"{' '.join(fixes) or 'nothing more'}{remove}, or drop trainer.barebones"
            )
    if clashing:
        k, name = clashing[0]
        raise ConfigError(
            f"trainer.{k}=false, but trainer.callbacks holds {name}, which needs it on; remove {name} from "
            f"trainer.callbacks, or set trainer.{k}=true"
        )


def _epoch_validation_never_runs(subcommand: str, cfg: Mapping[str, Any]) -> str | bool:
    """Whether a fit on the endless stream (its epoch 0 never ends) would never validate: a string saying the
    setting chosen on purpose (refused), True for Lightning's defaults (a note says so), else False."""
    trainer = cfg.get("trainer") or {}
    interval, every = trainer.get("val_check_interval"), trainer.get("check_val_every_n_epoch")
    by_steps = isinstance(interval, int) and not isinstance(interval, bool)
    if (
        subcommand != "fit"
        or not _endless_data(cfg)
        or every is None
        or trainer.get("limit_val_batches") == 0
        or any(c.name == "RankZeroValidation" for c in class_specs(trainer, ("callbacks",)))
    ):
        return False
    if isinstance(every, int) and every != 1:  # Lightning validates in epochs every-1, 2*every-1, ...: never
        return f"trainer.check_val_every_n_epoch={every} validates only after epoch {every - 1} ends"
    if isinstance(interval, float):
        return f"trainer.val_check_interval={interval} is a share of an epoch"
    return not by_steps


def _validation_is_reached(subcommand: str, cfg: Mapping[str, Any]) -> None:
    """A callback that watches a validation metric must see one: not if validation is off, beyond max_steps, or
    at the end of an epoch that never ends (an endless stream). RankZeroValidation validates every_n_steps and at
    max_steps whatever Lightning's loop would do."""
    trainer = cfg.get("trainer") or {}
    callbacks = class_specs(trainer, ("callbacks",))
    watching = [f"{c.name}(monitor={c.init['monitor']!r})" for c in callbacks if c.init.get("monitor")]
    chosen = _epoch_validation_never_runs(subcommand, cfg)
    if isinstance(chosen, str):
        raise ConfigError(
            f"{chosen}, and the training data is an endless stream whose epoch never ends, so validation would never "
            "run; set trainer.val_check_interval to a step count with check_val_every_n_epoch: null, or "
            "trainer.limit_val_batches=0 to train without validation"
        )
    at_epoch_end = [
        c.name for c in callbacks if c.init.get("check_on_train_epoch_end") is True and c.init.get("monitor")
    ]
    if subcommand == "fit" and _endless_data(cfg) and at_epoch_end:
        raise ConfigError(
            f"{at_epoch_end[0]}(check_on_train_epoch_end=true) checks its metric at the end of each training epoch, "
            "and the training data is an endless stream whose epoch never ends, so it would never check; leave "
            "check_on_train_epoch_end unset (it then checks after each validation)"
        )
    if subcommand != "fit" or not watching:
        return
    if trainer.get("limit_val_batches") == 0:
        raise ConfigError(
            f"trainer.limit_val_batches=0 turns validation off, but {watching[0]} watches a validation metric it would "
            "never see (no best checkpoint, no early stop); remove limit_val_batches=0 or the monitor"
        )
    if any(c.name == "RankZeroValidation" for c in callbacks):
        return
    interval, max_steps = trainer.get("val_check_interval"), trainer.get("max_steps")
    by_steps = isinstance(interval, int) and not isinstance(interval, bool)
    accumulate = trainer.get("accumulate_grad_batches")
    accumulate = accumulate if isinstance(accumulate, int) and accumulate > 1 else 1
    if (  # val_check_interval counts training batches, max_steps optimizer steps (accumulate batches each)
        trainer.get("check_val_every_n_epoch") is None
        and by_steps
        and isinstance(max_steps, int)
        and 0 < max_steps * accumulate < interval
    ):
        batches = (
            f" x accumulate_grad_batches={accumulate} = {max_steps * accumulate} batches"
            if accumulate > 1
            else ""
        )
        raise ConfigError(
            f"trainer.val_check_interval={interval} is beyond trainer.max_steps={max_steps}{batches}: validation would "
            f"never run and {watching[0]} would never see its metric; set trainer.val_check_interval <= "
            f"{max_steps * accumulate}"
        )
    if _endless_data(cfg) and not by_steps:
        raise ConfigError(
            f"validation at the end of each epoch never runs on an endless data stream, and {watching[0]} would never "
            "see its metric; set trainer.val_check_interval to a step count (with check_val_every_n_epoch: null), or "
            "add distlab.callbacks.RankZeroValidation"
        )


def _evaluation_has_batches(subcommand: str, cfg: Mapping[str, Any]) -> None:
    trainer = cfg.get("trainer") or {}
    key = {
        "validate": "limit_val_batches",
        "test": "limit_test_batches",
        "predict": "limit_predict_batches",
    }.get(subcommand)
    if key and trainer.get(key) == 0:
        raise ConfigError(f"{subcommand} with trainer.{key}=0 evaluates nothing; remove trainer.{key}")


def _limits_suit_the_data(subcommand: str, cfg: Mapping[str, Any]) -> None:
    trainer = cfg.get("trainer") or {}
    if _endless_data(cfg) and (trainer.get("min_epochs") or 0) > 0:
        raise ConfigError(
            f"trainer.min_epochs={trainer['min_epochs']}: the text data is an endless stream, whose first epoch never "
            "ends, so it would never be met; set trainer.min_steps instead"
        )
    for key, whole in (("limit_train_batches", 1.0), ("overfit_batches", 0.0)):
        value = trainer.get(key)
        if _endless_data(cfg) and isinstance(value, float) and value != whole:
            raise ConfigError(
                f"trainer.{key}={value} is a fraction of an epoch, and the text data is an endless stream; "
                "set a number of batches (an integer)"
                + (" or trainer.max_steps" if key == "limit_train_batches" else "")
            )


def _precision_fits_the_device(subcommand: str, cfg: Mapping[str, Any]) -> None:
    import torch

    trainer = cfg.get("trainer") or {}
    precision, accelerator = str(trainer.get("precision")), trainer.get("accelerator", "auto")
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if precision in ("16-mixed", "16") and on_cpu:
        raise ConfigError(
            f"trainer.precision={precision!r} is float16 with a gradient scaler, for GPUs; on the CPU Lightning would "
            "quietly switch to bf16-mixed: set trainer.precision=bf16-mixed (or 32-true)"
        )
    devices = trainer.get("devices")
    if isinstance(devices, str) and "," in devices:  # '0,1': device indices as text, as Lightning reads them
        parts = [p.strip() for p in devices.split(",") if p.strip()]
        devices = [int(p) for p in parts] if all(p.isdigit() for p in parts) else devices
    if isinstance(devices, (list, tuple)) and len(set(devices)) < len(devices):
        twice = sorted({d for d in devices if list(devices).count(d) > 1})
        raise ConfigError(
            f"trainer.devices={_shown(trainer.get('devices'))} lists device {', '.join(map(str, twice))} more than "
            "once: two ranks "
            f"would share one device; list each index once (e.g. {sorted(set(devices))}), or give a count"
        )
    if on_cpu and (isinstance(devices, (list, tuple)) or devices in (-1, "-1")):
        count = (
            f" ({len(devices)} for {list(devices)})" if isinstance(devices, (list, tuple)) and devices else ""
        )
        raise ConfigError(
            f"trainer.devices={list(devices) if isinstance(devices, (list, tuple)) else devices} "
            f"{'lists device indices' if isinstance(devices, (list, tuple)) else 'means every device'}, which is for "
            f"GPUs; on the CPU set trainer.devices to a number of processes{count}, or auto"
        )
    strategy = _strategy_class(trainer.get("strategy"))
    if on_cpu and strategy is not None:
        from lightning.pytorch import strategies

        gpu_only = [getattr(strategies, n, None) for n in ("FSDPStrategy", "DeepSpeedStrategy")]
        if any(isinstance(c, type) and issubclass(strategy, c) for c in gpu_only):
            raise ConfigError(
                f"trainer.strategy={_shown(trainer.get('strategy'))} is Lightning's {strategy.__name__}, which runs on "
                "CUDA GPUs only, and this run is on the CPU; set trainer.strategy=fsdp2 (distlab's FSDP2 sharding, CPU "
                "gloo too) or ddp_optimizer_sync"
            )
    if precision.startswith("transformer-engine") and on_cpu:
        raise ConfigError(
            f"trainer.precision={precision!r} is NVIDIA Transformer Engine's FP8, for Hopper and newer GPUs; on the "
            "CPU set trainer.precision=bf16-mixed (or 32-true)"
        )
    if precision in ("16-true", "half") and on_cpu:
        raise ConfigError(
            f"trainer.precision={precision!r} keeps the weights in float16 with no gradient scaler: the optimizer's eps "
            "and small updates underflow to 0 there and the weights turn NaN within steps; on the CPU set "
            "trainer.precision=bf16-mixed (or 32-true)"
        )


def _strategy_class(strategy: Any) -> type | None:
    """The class ``trainer.strategy`` names (a registered name or a class spec), or None."""
    return component_class("strategy", strategy)[0]


def _shown_list(value: Any) -> str:
    return "[" + ", ".join(map(str, value)) + "]" if isinstance(value, (list, tuple)) else str(value)


def _shown(value: Any) -> str:
    """A config value as the user wrote it: a class spec by its class name."""
    return str(value.get("class_path")).rsplit(".", 1)[-1] if hasattr(value, "get") else str(value)


def _data_paths_are_distinct(subcommand: str, cfg: Mapping[str, Any]) -> None:
    paths = _spec(cfg, "data")[1].get("paths") or []
    seen: dict[str, str] = {}
    for raw in paths:
        key = str(Path(str(raw)).expanduser().resolve())
        if key in seen:
            raise ConfigError(
                f"data.paths lists {seen[key]!r} twice (also as {raw!r}); its text would count double"
            )
        seen[key] = raw
    for key, raw in seen.items():  # a folder and something inside it: the inner files would be read twice
        outer = next(
            (o for o in seen if o != key and Path(o) in Path(key).parents and Path(o).is_dir()), None
        )
        if outer is not None:
            raise ConfigError(
                f"data.paths lists {raw!r}, which is inside {seen[outer]!r}, also listed: its text would count double; "
                f"keep only {seen[outer]!r} (or only the files you want)"
            )


def _callbacks_suit_the_strategy(subcommand: str, cfg: Mapping[str, Any]) -> None:
    """Lightning's weight averaging (WeightAveraging, EMAWeightAveraging, StochasticWeightAveraging) keeps a whole,
    unsharded copy of the module made before the strategy shards it; Lightning says sharded models do not work with
    it (it checks only its own FSDP and DeepSpeed, so under FSDP2 / ModelParallel the fit fails later, or pickles
    the copy into each spawned rank). Refused under a sharding strategy, before anything starts."""
    if subcommand != "fit":
        return
    trainer = cfg.get("trainer") or {}
    strategy = _strategy_class(trainer.get("strategy"))
    from lightning.pytorch import callbacks, strategies

    sharding = tuple(
        c
        for n in ("ModelParallelStrategy", "FSDPStrategy", "DeepSpeedStrategy")
        if isinstance(c := getattr(strategies, n, None), type)
    )
    if strategy is None or not issubclass(strategy, sharding):
        return
    averaging = tuple(
        c
        for n in ("WeightAveraging", "StochasticWeightAveraging")
        if isinstance(c := getattr(callbacks, n, None), type)
    )
    for spec in class_specs(trainer, ("callbacks",)):
        if spec.cls is not None and issubclass(spec.cls, averaging):
            raise ConfigError(
                f"trainer.callbacks has {spec.name}, Lightning's weight averaging, which keeps an unsharded copy of the "
                f"whole module and does not work with a sharded model, and trainer.strategy={_shown(trainer.get('strategy'))} "
                "shards it; drop the callback, or train with trainer.strategy=ddp_optimizer_sync (replicated weights)"
            )


def _model_fits_in_memory(subcommand: str, cfg: Mapping[str, Any]) -> None:
    """A model too large for this machine's memory is refused before it is built: built, it allocates layer after
    layer until the kernel kills the process, with no word. A module class joins by defining
    ``parameter_count(init_args) -> int`` (GPTLightningModule counts on the meta device; nothing is allocated)."""
    cls, init = _spec(cfg, "model")
    count = getattr(cls, "parameter_count", None)
    free = free_memory_bytes()
    if not callable(count) or free is None:
        return
    params = count(init)
    trainer = cfg.get("trainer") or {}
    local = _processes_on_this_machine(trainer)
    # fp32 weights built in every process; a fit on the CPU adds gradients and optimizer state (<= 12 bytes a
    # parameter: AdamW's two moments; Muon keeps one), sharded across the processes under FSDP2
    need = 4 * params * local
    on_cpu = str(trainer.get("accelerator", "auto")) == "cpu" or not _cuda_present()
    if subcommand == "fit" and on_cpu:
        sharded = "fsdp" in (getattr(_strategy_class(trainer.get("strategy")), "__name__", "") or "").lower()
        need += 12 * params * (1 if sharded else local)
    if need > free:
        what = "training it" if subcommand == "fit" and on_cpu else "building it"
        copies = f" in each of {local} processes" if local > 1 else ""
        raise ConfigError(
            f"the model is too large for this machine: {cls.__name__} with these settings has {params / 1e6:,.0f}M "
            f"parameters, {what}{copies} needs about {_bytes(need)} and {_bytes(free)} of memory is free; lower its "
            "size (" + ", ".join(f"model.{k}" for k in getattr(cls, "SIZE_SETTINGS", ())) + ")"
        )


def _processes_on_this_machine(trainer: Mapping[str, Any]) -> int:
    from distlab.launch import launcher_world

    launched = launcher_world()
    if launched is not None:
        return max(1, launched[2])
    devices = trainer.get("devices")
    accelerator = str(trainer.get("accelerator", "auto"))
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not _cuda_present())
    return devices if on_cpu and isinstance(devices, int) and devices > 1 else 1


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count()


def _cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def free_memory_bytes() -> int | None:
    """Memory this machine can still give (available RAM + free swap), from /proc/meminfo; None elsewhere."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line
        )
        return sum(int(fields[k].split()[0]) * 1024 for k in ("MemAvailable", "SwapFree"))
    except (OSError, KeyError, ValueError):
        return None


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return ""


def _ranks_get_their_share(subcommand: str, cfg: Mapping[str, Any]) -> None:
    """A data module that leaves dealing its samples out to Lightning's sampler (``deals_by_rank = False``) with
    ``use_distributed_sampler: false`` on several processes: every rank would train on the same batches."""
    trainer = cfg.get("trainer") or {}
    data_cls = _spec(cfg, "data")[0]
    devices, nodes = trainer.get("devices"), trainer.get("num_nodes") or 1
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)
    several = (isinstance(devices, int) and isinstance(nodes, int) and devices * nodes > 1) or (
        isinstance(nodes, int) and nodes > 1
    )
    if (
        subcommand == "fit"
        and trainer.get("use_distributed_sampler") is False
        and getattr(data_cls, "deals_by_rank", None) is False
        and several
    ):
        raise ConfigError(
            f"trainer.use_distributed_sampler=false, and {data_cls.__name__} leaves each rank's share of the samples to "
            f"Lightning's sampler: the {devices} x {nodes} processes would all train on the same batches; remove "
            "trainer.use_distributed_sampler"
        )


CROSS_FIELD_RULES: tuple[Callable[[str, Mapping[str, Any]], None], ...] = (
    _fit_has_an_end,
    _ranks_get_their_share,
    _model_and_data_fit_together,
    _window_fits_context,
    _vocabulary_holds_tokens,
    _classes_cover_labels,
    _options_take_effect,
    _switches_agree,
    _validation_is_reached,
    _evaluation_has_batches,
    _limits_suit_the_data,
    _precision_fits_the_device,
    _data_paths_are_distinct,
    _model_fits_in_memory,
    _callbacks_suit_the_strategy,
)


# ---- the launch environment ------------------------------------------------------------------------------
def _check_socket_interfaces(env: Mapping[str, str]) -> None:
    """``GLOO_SOCKET_IFNAME`` (left over from a cluster's shell) must name network interfaces this machine has: gloo
    would fail on every rank with an ``enforce fail`` naming neither the variable nor the interfaces there are."""
    import socket

    value = env.get("GLOO_SOCKET_IFNAME")
    if not value:
        return
    try:
        here = sorted(name for _, name in socket.if_nameindex())
    except OSError:  # the system does not list them: not ours to judge
        return
    missing = [name for name in value.split(",") if name.strip() and name.strip() not in here]
    if missing:
        raise ConfigError(
            f"GLOO_SOCKET_IFNAME={value!r} names {', '.join(missing)}, a network interface this machine does not have "
            f"(it has {', '.join(here)}); unset it (left over from another machine's shell?), or set it to one of those"
        )


def check_launch_env(trainer: Mapping[str, Any], env: Mapping[str, str] | None = None) -> None:
    """What the environment says about the launch must agree with what will start: never a wait with no end,
    never one process where the environment asked for several."""
    from distlab.launch import launcher_world

    env = os.environ if env is None else env
    _check_socket_interfaces(env)
    port = env.get("MASTER_PORT")
    if port is not None and not (port.strip().isdigit() and 1 <= int(port) <= 65535):
        raise ConfigError(
            f"MASTER_PORT={port!r} is not a port number (1-65535); unset MASTER_PORT (a free port is picked) or set one"
        )
    launched = launcher_world(env) is not None
    world = env.get("WORLD_SIZE")
    address = env.get("MASTER_ADDR")
    for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK"):
        if key in env and not env[key].strip():  # torch reads an empty one as unset, after every rank started
            raise ConfigError(
                f"{key} is set but empty ({key}=''; an unset shell variable?); set it to a value, or unset {key}"
            )
    if address:
        import socket

        try:
            socket.getaddrinfo(address.strip(), None)
        except (OSError, UnicodeError) as e:
            raise ConfigError(
                f"MASTER_ADDR={address!r} cannot be resolved ({getattr(e, 'strerror', None) or e}); set the address of "
                "the node that runs rank 0 (an IP or a host name this machine resolves), or unset it for one node"
            ) from None
    _check_ranks_below_sizes(trainer, env, launched)
    _check_slurm_step(env)
    _check_slurm_tasks_cover_the_processes(trainer, env)
    if not launched:
        _check_cpu_ranks_fit_the_machine(trainer)
    threads = env.get("OMP_NUM_THREADS")
    if threads is not None and not re.fullmatch(r"\s*[1-9]\d*(\s*,\s*[1-9]\d*)*\s*", threads):
        raise ConfigError(
            f"OMP_NUM_THREADS={threads!r} is not a thread count (OpenMP would ignore it with a warning); set a positive "
            "integer, e.g. OMP_NUM_THREADS=4, or unset it"
        )
    if (
        address
        and not launched
        and (trainer.get("num_nodes") or 1) == 1
        and trainer.get("devices") not in (1, "1")
    ):
        reason = _not_this_machine(address.strip())
        if reason:
            raise ConfigError(
                f"MASTER_ADDR={address!r} {reason}, and with num_nodes=1 and no launcher every rank starts on this "
                "machine and would wait for rank 0 there; unset MASTER_ADDR (127.0.0.1 is used) or launch with torchrun"
            )
    if world is not None and "LOCAL_RANK" not in env and not launched:
        if not (world.strip().isdigit() and int(world) >= 1):
            raise ConfigError(f"WORLD_SIZE={world!r} is not a process count; unset WORLD_SIZE")
        if int(world) > 1:
            raise ConfigError(
                f"WORLD_SIZE={world} is set, but no launcher (torchrun, srun) started this process: it would train "
                f"alone; launch it with torchrun --nproc_per_node={world} -m distlab ..., or unset WORLD_SIZE"
            )
    for key in ("LOCAL_RANK", "RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        if key in env and world is None and not launched:
            raise ConfigError(
                f"{key}={env[key]} is set, but no WORLD_SIZE and no launcher (torchrun, srun): Lightning would take "
                f"this process for one of several started elsewhere and wait for the others; unset {key}"
            )
    nodes = trainer.get("num_nodes") or 1
    node_known = ("NODE_RANK" in env or "GROUP_RANK" in env) and "MASTER_ADDR" in env
    started = env.get("WORLD_SIZE", "").strip()
    if (
        "TORCHELASTIC_RUN_ID" in env
        and isinstance(nodes, int)
        and nodes > 1
        and started.isdigit()
        and int(started) < nodes
    ):
        raise ConfigError(
            f"torchrun started {started} process(es) in all, and the trainer asks for trainer.num_nodes={nodes}; "
            f"launch torchrun --nnodes={nodes} on each node, or set trainer.num_nodes to the nodes torchrun starts"
        )
    if isinstance(nodes, int) and nodes > 1 and not launched and node_known and _is_loopback(address or ""):
        raise ConfigError(
            f"trainer.num_nodes={nodes} with MASTER_ADDR={address}: a loopback address, which no other node can reach, "
            f"so this node would wait forever; set MASTER_ADDR to rank 0's node address (an IP or host name every "
            "node resolves); to try two nodes on one machine, use torchrun --nnodes (docs/guide.md)"
        )
    if isinstance(nodes, int) and nodes > 1 and not launched and not node_known:
        raise ConfigError(
            f"trainer.num_nodes={nodes} but nothing says which node this is and where rank 0 is, so the job would wait "
            f"forever for the others; launch with torchrun --nnodes={nodes} (or srun), or set NODE_RANK and MASTER_ADDR "
            "on each node"
        )
    devices = trainer.get("devices")
    if devices in ("auto", None):  # what Lightning resolves "auto" to: every GPU, else one CPU process
        import torch

        gpu = trainer.get("accelerator") != "cpu" and torch.cuda.is_available()
        devices = torch.cuda.device_count() if gpu else 1
    if (
        world is not None
        and "LOCAL_RANK" in env
        and not launched
        and isinstance(devices, int)
        and isinstance(nodes, int)
    ):
        if world.strip().isdigit() and int(world) != devices * nodes:
            raise ConfigError(
                f"WORLD_SIZE={world} (with LOCAL_RANK={env['LOCAL_RANK']}) says this process is one of {world}, but the "
                f"trainer runs devices={devices} x num_nodes={nodes}; unset WORLD_SIZE and LOCAL_RANK (left over from "
                "another job?), or launch with torchrun"
            )


# CPU ranks Lightning may start on one machine per core: beyond that they only wait on each other (2-core CI runs
# 8 ranks), and a mistyped count (64) spends minutes importing before the first step.
CPU_RANKS_PER_CORE = 4


def _check_cpu_ranks_fit_the_machine(trainer: Mapping[str, Any]) -> None:
    """A CPU run that Lightning launches itself starts ``devices`` processes here: refuse a count far above the
    cores (a typo, or a GPU count on a CPU machine) before one of them starts."""
    import torch

    devices, accelerator = trainer.get("devices"), str(trainer.get("accelerator") or "auto")
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    count = (
        int(devices)
        if isinstance(devices, int) or (isinstance(devices, str) and devices.strip().isdigit())
        else 1
    )
    cores = os.cpu_count() or 1
    limit = max(8, CPU_RANKS_PER_CORE * cores)
    if on_cpu and count > limit:
        raise ConfigError(
            f"trainer.devices={devices} would start {count} CPU processes on this machine, which has {cores} cores "
            f"(at most {limit} are started: more only wait on each other); set trainer.devices to at most {limit} "
            "(about one per core runs fastest), or launch across machines with torchrun / srun and trainer.num_nodes"
        )


def _check_slurm_tasks_cover_the_processes(trainer: Mapping[str, Any], env: Mapping[str, str]) -> None:
    """Inside a SLURM job, Lightning takes the world size from SLURM's tasks: processes the trainer would start
    beyond them (a spawn preset's devices=2 in a one-task job) would each see a world of SLURM's size and train
    alone, writing over each other's files."""
    from distlab.launch import _count

    if (
        "SLURM_NTASKS" not in env
        or "TORCHELASTIC_RUN_ID" in env
        or env.get("SLURM_JOB_NAME")
        in ("bash", "interactive")  # Lightning leaves these to the user's own launch
    ):
        return
    tasks = _count(env, "SLURM_NTASKS")
    devices, nodes = trainer.get("devices"), trainer.get("num_nodes") or 1
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)
    if not (isinstance(devices, int) and isinstance(nodes, int)) or devices < 1 or devices * nodes <= tasks:
        return
    raise ConfigError(
        f"this process runs in a SLURM job of {tasks} task(s) (SLURM_NTASKS={env['SLURM_NTASKS']}), and Lightning takes "
        f"the world size from SLURM, so the trainer's devices={devices} x num_nodes={nodes} processes would each train "
        f"alone; ask SLURM for {devices} tasks per node and start them with srun (#SBATCH --ntasks-per-node={devices}), "
        "or, to let distlab start them itself on this node, set SLURM_JOB_NAME=interactive"
    )


def _check_slurm_step(env: Mapping[str, str]) -> None:
    """A SLURM job of several tasks runs its batch script once: only ``srun`` starts the tasks (and gives each a step,
    SLURM_STEP_ID). distlab started from the batch script itself would be taken (by Lightning too) for task 0 of
    an srun step and wait forever for the others."""
    from distlab.launch import slurm_batch_script_of

    tasks = slurm_batch_script_of(env)
    if tasks:
        raise ConfigError(
            f"this process runs in the batch script of a SLURM job of {tasks} tasks (SLURM_NTASKS={env['SLURM_NTASKS']}), "
            "but no srun started it (SLURM_STEP_ID is unset), so nothing starts the other ranks and rank 0 would wait "
            "forever; start one process per task with srun (srun distlab fit ...), or one torchrun per node as "
            "scripts/slurm.sbatch does"
        )


# (a rank variable, the count it must stay below): what a launcher sets together; a contradiction means variables
# left over from another job, or a launch line with a typo.
RANK_AND_SIZE = (
    ("RANK", "WORLD_SIZE"),
    ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
    (
        "NODE_RANK",
        "trainer.num_nodes",
    ),  # checked without a launcher only (a launcher's count is reconciled later)
)


def _check_ranks_below_sizes(trainer: Mapping[str, Any], env: Mapping[str, str], launched: bool) -> None:
    for rank_key, size_key in RANK_AND_SIZE:
        rank = env.get(rank_key)
        if rank is None or (launched and size_key.startswith("trainer.")):
            continue
        if not rank.strip().isdigit():
            raise ConfigError(
                f"{rank_key}={rank!r} is not a rank (an integer >= 0); unset it, or let the launcher set it"
            )
        size: Any = (trainer.get("num_nodes") or 1) if size_key.startswith("trainer.") else env.get(size_key)
        if isinstance(size, str):
            if not size.strip().isdigit():
                raise ConfigError(
                    f"{size_key}={size!r} is not a process count; unset it, or let the launcher set it"
                )
            size = int(size)
        if isinstance(size, int) and int(rank) >= size:
            raise ConfigError(
                f"{rank_key}={rank} is not below {size_key}={size}: ranks count from 0; unset {rank_key} (left over "
                f"from another job?) or set {size_key} to the number of {'nodes' if 'num_nodes' in size_key else 'processes'}"
            )


def _is_loopback(address: str) -> bool:
    import ipaddress
    import socket

    try:
        return any(
            ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(address.strip(), None)
        )
    except (OSError, UnicodeError, ValueError):
        return False


def _not_this_machine(address: str) -> str | None:
    """Why ``address`` is not an address of this machine (rank 0 binds there), or None when it is."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None  # said by the resolution check
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind((sockaddr[0], 0))
            return None
        except OSError as e:
            if e.errno != errno.EADDRNOTAVAIL:
                return None  # some other reason: let the rendezvous say it
    return "is not an address of this machine"


# ---- step 1: after parsing ------------------------------------------------------------------------------
# Hooks in which a callback acts while a fit on the endless stream runs (batch by batch, or after a validation).
_STREAM_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_validation_start",
    "on_validation_batch_end",
    "on_validation_end",
)


def _acts_only_at_epoch_ends(subcommand: str, cfg: Mapping[str, Any]) -> list[str]:
    """Callbacks (Lightning's or the user's) that act only at a training epoch's start or end: on the endless stream
    only the first epoch's start ever comes. Read from the hooks each class overrides, so a new callback joins."""
    import lightning as L

    if subcommand != "fit" or not _endless_data(cfg):
        return []
    out = []
    for c in class_specs(cfg.get("trainer") or {}, ("callbacks",)):
        if c.cls is None or not issubclass(c.cls, L.Callback):
            continue
        overrides = {
            h
            for h in dir(L.Callback)
            if h.startswith("on_") and getattr(c.cls, h) is not getattr(L.Callback, h)
        }
        epoch_hooks = sorted(overrides & {"on_train_epoch_start", "on_train_epoch_end"})
        if epoch_hooks and not overrides & set(_STREAM_HOOKS):
            out.append(
                f"{c.name} acts at training-epoch boundaries only ({', '.join(epoch_hooks)}), and the text stream's "
                "one epoch never ends: nothing it does after the first epoch's start happens in this fit"
            )
            continue
        # a setting that chooses epochs as the cadence: Timer(interval='epoch'), save_on_train_epoch_end=true, ...
        chosen = [
            f"{k}={_shown(v)}"
            for k, v in c.init.items()
            if (("epoch" in k and v is True) or str(getattr(v, "value", v)) == "epoch")
            and _explicit(c.cls, c.init, k)
        ]
        if chosen and not (c.name == "EarlyStopping" and c.init.get("monitor")):  # (that one is refused)
            out.append(
                f"{c.name}({', '.join(chosen)}) acts at the end of a training epoch, and the text stream's one epoch "
                "never ends: it acts at most when the fit ends; leave it unset (or 'step') to act during the fit"
            )
    return out


# The loops each subcommand runs, by the stage names of Lightning's limit_<stage>_batches.
STAGES_RUN = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",)}


def _limits_of_other_stages(subcommand: str, cfg: Mapping[str, Any]) -> list[str]:
    """``validate --trainer.limit_test_batches=1``: a limit on a loop this subcommand does not run changes nothing."""
    import lightning as L

    trainer, run = cfg.get("trainer") or {}, STAGES_RUN.get(subcommand, ())
    defaults = inspect.signature(L.Trainer.__init__).parameters
    out = []
    for stage in ("train", "val", "test", "predict"):
        key = f"limit_{stage}_batches"
        if run and stage not in run and key in trainer and trainer[key] != defaults[key].default:
            out.append(
                f"trainer.{key}={trainer[key]} has no effect on {subcommand}, which runs the "
                f"{' and '.join(run)} loop{'s' if len(run) > 1 else ''}; set "
                f"{' or '.join(f'trainer.limit_{r}_batches' for r in run)} to limit it"
            )
    return out


def _settings_rank_zero_validation_replaces(subcommand: str, cfg: Mapping[str, Any]) -> list[str]:
    """RankZeroValidation runs the validation itself on its own cadence: Lightning's val_check_interval and sanity
    check no longer apply in a fit."""
    import lightning as L

    trainer = cfg.get("trainer") or {}
    rzv = next((c for c in class_specs(trainer, ("callbacks",)) if c.name == "RankZeroValidation"), None)
    if subcommand != "fit" or rzv is None:
        return []
    defaults = inspect.signature(L.Trainer.__init__).parameters
    every = rzv.init.get("every_n_steps")
    return [
        f"trainer.{key}={trainer[key]} has no effect with RankZeroValidation, which validates on its own cadence "
        f"(every_n_steps={every}) and runs no sanity check; set its every_n_steps instead"
        for key in ("val_check_interval", "num_sanity_val_steps")
        if key in trainer
        and trainer[key] not in (None, 0, defaults[key].default)  # (0 sanity steps: what it does anyway)
    ]


def _checkpoint_saves_between_validations(subcommand: str, cfg: Mapping[str, Any]) -> list[str]:
    """A ModelCheckpoint that monitors a validation metric every N training steps, where validation runs on another
    cadence: a save between two validations finds the metric missing (Lightning defers it to the next validation,
    or skips it with a warning) or stale."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    trainer = cfg.get("trainer") or {}
    specs = class_specs(trainer, ("callbacks",))
    rzv = next((c for c in specs if c.name == "RankZeroValidation"), None)
    if subcommand != "fit":
        return []
    if rzv is not None:
        every, source = (
            rzv.init.get("every_n_steps"),
            f"RankZeroValidation's every_n_steps={rzv.init.get('every_n_steps')}",
        )
    elif _endless_data(cfg) and trainer.get("accumulate_grad_batches") in (None, 1):
        every, source = (
            trainer.get("val_check_interval"),
            f"trainer.val_check_interval={trainer.get('val_check_interval')}",
        )
    else:
        return []
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        return []
    out = []
    for c in specs:
        monitor, n = c.init.get("monitor"), c.init.get("every_n_train_steps")
        if (
            _is(c.cls, ModelCheckpoint)
            and isinstance(monitor, str)
            and monitor.startswith("val")
            and isinstance(n, int)
            and n > 0
            and n % every
        ):
            out.append(
                f"ModelCheckpoint(monitor={monitor!r}, every_n_train_steps={n}): {monitor} comes from the validation, "
                f"which runs every {every} steps ({source}), so a save between two validations waits for the next "
                f"one or is skipped; set every_n_train_steps to a multiple of {every}"
            )
    return out


def _width_given_over_aspect_ratio(cfg: Mapping[str, Any]) -> list[str]:
    """``aspect_ratio`` only derives the width (``n_embd = depth x aspect_ratio``): beside an explicit ``n_embd`` it
    does nothing (said, not refused: a recipe's aspect_ratio with a width typed over it is a normal thing to run)."""
    from distlab.modules.gpt_module import GPTLightningModule

    model_cls, model = _spec(cfg, "model")
    width = model.get("n_embd")
    if (
        not _is(model_cls, GPTLightningModule)
        or width is None
        or not _explicit(model_cls, model, "aspect_ratio")
    ):
        return []
    return [
        f"model.aspect_ratio={model['aspect_ratio']} has no effect: model.n_embd={width} is set, and aspect_ratio "
        "only derives the width when n_embd is not (n_embd = depth x aspect_ratio)"
    ]


def _modes_against_their_metrics(subcommand: str, cfg: Mapping[str, Any]) -> list[str]:
    """A callback named in the config that takes ``monitor`` and ``mode`` (Lightning's ModelCheckpoint and
    EarlyStopping, a user's own) whose mode, given or its default, goes against the way the metric's name says it
    improves: it would keep the worst checkpoints or stop on improvement, with no word. distlab's own callbacks say
    it themselves (from Python too)."""
    out = []
    for spec in class_specs(cfg.get("trainer") or {}, ("callbacks",)):
        if spec.cls is None or spec.cls.__module__.startswith("distlab."):
            continue
        params = inspect.signature(spec.cls.__init__).parameters
        if "monitor" not in params or "mode" not in params:
            continue
        monitor, mode = (spec.init.get(k, params[k].default) for k in ("monitor", "mode"))
        note = mode_against_the_metric(spec.name, monitor, mode)
        if note:
            out.append(note)
    return out


def _cadences_beyond_the_run(subcommand: str, cfg: Mapping[str, Any]) -> list[str]:
    """A callback's step cadence (``every_n_steps``, ``every_n_train_steps``) beyond ``max_steps``: what it does every
    N steps never comes round in this fit (CheckpointOnStopRequest would never look for its file). Any callback
    class named in the config, Lightning's, distlab's or the user's."""
    max_steps = (cfg.get("trainer") or {}).get("max_steps")
    if subcommand != "fit" or not isinstance(max_steps, int) or max_steps <= 0:
        return []
    out = []
    for spec in class_specs(cfg.get("trainer") or {}, ("callbacks",)):
        for arg in ("every_n_steps", "every_n_train_steps"):
            n = spec.init.get(arg)
            if isinstance(n, int) and not isinstance(n, bool) and n > max_steps:
                out.append(
                    f"{spec.name}({arg}={n}) is beyond trainer.max_steps={max_steps}: what it does every {n} steps never "
                    f"comes round in this run (only what it does at the end, if anything); set {arg} <= {max_steps}"
                )
    return out


def _no_model_checkpoint(subcommand: str, cfg: Mapping[str, Any]) -> list[str]:
    """A Checkpoint callback that is not a ModelCheckpoint (OnExceptionCheckpoint) stops Lightning from adding its
    own ModelCheckpoint: no checkpoint is written while the fit runs."""
    from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint

    trainer = cfg.get("trainer") or {}
    checkpoints = [c for c in class_specs(trainer, ("callbacks",)) if _is(c.cls, Checkpoint)]
    if (
        subcommand != "fit"
        or trainer.get("enable_checkpointing") is False
        or not checkpoints
        or any(_is(c.cls, ModelCheckpoint) for c in checkpoints)
    ):
        return []
    return [
        f"{checkpoints[0].name} is a Checkpoint callback, so Lightning adds no ModelCheckpoint of its own: nothing is "
        "saved while this fit runs (only at its end, as last.ckpt); add a ModelCheckpoint to save during the fit"
    ]


def _schedules_overlap(subcommand: str, cfg: Mapping[str, Any]) -> list[str]:
    """A warmup that runs into the linear schedule's warmdown: the learning rate jumps down where they meet."""
    max_steps = (cfg.get("trainer") or {}).get("max_steps")
    model = _spec(cfg, "model")[1]
    warmup, ratio = model.get("warmup_steps"), model.get("warmdown_ratio")
    if (
        subcommand != "fit"
        or model.get("schedule") != "linear"
        or not isinstance(max_steps, int)
        or not isinstance(warmup, int)
        or not isinstance(ratio, (int, float))
        or not 0 < warmup <= max_steps
    ):
        return []
    warmdown = max(1, round(ratio * max_steps))
    if warmup <= max_steps - warmdown:
        return []
    return [
        f"model.warmup_steps={warmup} runs into the warmdown (the last {warmdown} of trainer.max_steps={max_steps} "
        f"steps at model.warmdown_ratio={ratio}): the learning rate drops from its warmup to the warmdown's at step "
        f"{warmup}; lower warmup_steps or warmdown_ratio so that they fit"
    ]


def notes(subcommand: str, cfg: Mapping[str, Any], env: Mapping[str, str] | None = None) -> list[str]:
    """What the config does that a user may not expect but that is not wrong (said in one line each, not refused:
    a recipe shrunk for a quick check - ``--trainer.max_steps=4`` - is a normal thing to run)."""
    from distlab.launch import launcher_world

    env = os.environ if env is None else env
    trainer = cfg.get("trainer") or {}
    model = _spec(cfg, "model")[1]
    max_steps, warmup = trainer.get("max_steps"), model.get("warmup_steps")
    out = []
    if (
        subcommand == "fit"
        and isinstance(max_steps, int)
        and isinstance(warmup, int)
        and warmup > max_steps > 0
    ):
        out.append(
            f"model.warmup_steps={warmup} is beyond trainer.max_steps={max_steps}: the learning rate never reaches its "
            "peak in this run"
        )
    out += _schedules_overlap(subcommand, cfg)
    out += _acts_only_at_epoch_ends(subcommand, cfg)
    out += _no_model_checkpoint(subcommand, cfg)
    out += _modes_against_their_metrics(subcommand, cfg)
    out += _cadences_beyond_the_run(subcommand, cfg)
    out += _limits_of_other_stages(subcommand, cfg)
    out += _settings_rank_zero_validation_replaces(subcommand, cfg)
    out += _checkpoint_saves_between_validations(subcommand, cfg)
    out += _width_given_over_aspect_ratio(cfg)
    every = trainer.get("log_every_n_steps")
    if (
        subcommand == "fit"
        and isinstance(max_steps, int)
        and isinstance(every, int)
        and every > max_steps > 0
    ):
        out.append(
            f"trainer.log_every_n_steps={every} is beyond trainer.max_steps={max_steps}: no training loss is logged in "
            f"this run (metrics.csv, the loss curve); set trainer.log_every_n_steps <= {max_steps} to see it"
        )
    if _epoch_validation_never_runs(subcommand, cfg) is True:
        out.append(
            "validation runs at the end of each epoch (Lightning's default), and the text stream's epoch never ends: "
            "this fit will not validate; set trainer.val_check_interval to a step count with "
            "check_val_every_n_epoch: null (as the recipes in configs/ do)"
        )
    strategy = trainer.get("strategy")
    strategy_name = str(strategy.get("class_path") if hasattr(strategy, "get") else strategy).lower()
    if (
        subcommand == "fit"
        and str(trainer.get("devices")) == "auto"
        and any(kind in strategy_name for kind in ("ddp", "fsdp"))
        and launcher_world(env) is None
        and (not _cuda_present() or _cuda_count() <= 1)
    ):  # a torchrun preset run as plain `distlab fit`: auto finds one process
        out.append(
            f"trainer.devices=auto with strategy {strategy_name.rsplit('.', 1)[-1]} and no launcher: this fit runs ONE "
            "process; for several, start it with torchrun --nproc_per_node=N -m distlab fit ..., or set "
            "trainer.devices=N (CPU ranks are spawned)"
        )
    nodes = trainer.get("num_nodes") or 1
    if isinstance(nodes, int) and nodes > 1 and launcher_world(env) is None and "NODE_RANK" in env:
        out.append(
            f"node NODE_RANK={env['NODE_RANK']} of trainer.num_nodes={nodes}: waiting at "
            f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '(a port Lightning picks)')} until every other node "
            "starts the same command with its own NODE_RANK and the same MASTER_ADDR/MASTER_PORT (nothing is printed "
            "while it waits; Ctrl-C stops it)"
        )
    return out


def check_parsed(subcommand: str, cfg: Mapping[str, Any], env: Mapping[str, str] | None = None) -> None:
    """Everything that can be said from the parsed config alone; nothing exists yet."""
    trainer = cfg.get("trainer") or {}
    check_trainer_domains(trainer)
    check_lightning_settings(trainer)
    check_named_components(trainer)
    root = trainer.get("default_root_dir")
    if root is not None:
        check_writable(
            root, "trainer.default_root_dir", "set trainer.default_root_dir to a folder you can write"
        )
    for rule in CROSS_FIELD_RULES:
        rule(subcommand, cfg)
    check_launch_env(trainer, env)


def check_writable(path: str | os.PathLike, what: str, fix: str) -> None:
    """A folder (or a file to be created) this process must be able to write (one-line ConfigError)."""
    if not str(path).strip():
        raise ConfigError(f"{what}='' names no folder; {fix}")
    problem = unwritable_reason(path)
    if problem:
        raise ConfigError(f"{what} {str(path)!r} cannot be written: {problem}; {fix}")


# ---- step 2: after building, before the first step --------------------------------------------------------
# The loader each subcommand runs on (the data module's, else the LightningModule's own).
LOADER_OF = {
    "fit": "train_dataloader",
    "validate": "val_dataloader",
    "test": "test_dataloader",
    "predict": "predict_dataloader",
}


def check_hook_signatures(objects: list[Any]) -> None:
    """Each ``on_*`` hook a user's callback, module or data module overrides must take the arguments Lightning
    passes it (the base class's hook says which); else the first call would fail mid-run as a TypeError. One line
    naming the hook, its file and line, and the arguments it must take."""
    import lightning as L

    for obj in objects:
        base = next(
            (b for b in (L.Callback, L.LightningModule, L.LightningDataModule) if isinstance(obj, b)), None
        )
        if base is None:
            continue
        for name in dir(base):
            mine, theirs = getattr(type(obj), name, None), getattr(base, name, None)
            if not name.startswith("on_") or mine is theirs or not callable(mine) or not callable(theirs):
                continue
            try:
                wanted = [p for p in inspect.signature(theirs).parameters if p != "self"]
                inspect.signature(getattr(obj, name)).bind(*wanted)
            except TypeError:
                code = getattr(mine, "__code__", None)
                where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
                raise ConfigError(
                    f"{type(obj).__name__}.{name}{where} does not take the arguments Lightning passes it; define it as "
                    f"{name}(self, {', '.join(wanted)})"
                ) from None
            except ValueError:  # no signature to read (a builtin): not ours to judge
                continue


def check_loaders(subcommand: str, model: Any, datamodule: Any) -> None:
    """The subcommand's data must exist: Lightning's base classes only raise "must be implemented" mid-run."""
    import lightning as L

    hook = LOADER_OF.get(subcommand)

    def defines(obj: Any, base: type) -> bool:
        return obj is not None and getattr(type(obj), hook, None) is not getattr(base, hook, None)

    if hook and not (defines(datamodule, L.LightningDataModule) or defines(model, L.LightningModule)):
        owners = " nor ".join(type(o).__name__ for o in (datamodule, model) if o is not None)
        raise ConfigError(
            f"{subcommand} runs on {hook}(), and neither {owners} defines one; use a data module that provides it "
            f"(distlab's data modules provide train/val/test, not predict)"
        )


def check_token_ids(model: Any, datamodule: Any) -> None:
    """The module's own refusal of data it cannot train on (distlab's GPT: token ids beyond its vocabulary, or
    batches of another kind), asked before anything is written; a module without ``check_data`` is not judged."""
    check = getattr(model, "check_data", None)
    if callable(check):
        check(datamodule)


def check_evaluates_trained_weights(subcommand: str, model: Any) -> None:
    """``validate`` / ``test`` / ``predict`` without ``--ckpt_path`` run on the weights the module's ``__init__``
    builds: for distlab's own modules that is a random initialisation (refused: the numbers would mean nothing);
    a user's module may load pretrained weights there (said in a note)."""
    name = type(model).__name__
    if type(model).__module__.startswith("distlab."):
        raise ConfigError(
            f"distlab {subcommand} without --ckpt_path would run {name}'s freshly initialised (untrained) weights; "
            "pass --ckpt_path to a checkpoint distlab fit wrote (e.g. runs/x/checkpoints/last.ckpt)"
        )
    from lightning.pytorch.utilities import rank_zero_info

    rank_zero_info(f"distlab: note: no --ckpt_path: {subcommand} runs on the weights {name}.__init__ builds")


def check_seed_env(env: Any = None) -> None:
    """``PL_GLOBAL_SEED``, which Lightning's seed_everything reads when no seed is given, must be a seed."""
    seed = (os.environ if env is None else env).get("PL_GLOBAL_SEED")
    if seed is not None and not (seed.strip().isdigit() and int(seed) < 2**32):
        raise ConfigError(
            f"PL_GLOBAL_SEED={seed!r} (the environment variable Lightning reads a seed from) is not a seed; set an "
            "integer in [0, 2**32), or unset it (and give seed_everything instead)"
        )


def newest_checkpoint(folders: list[Path]) -> Path | None:
    """What a restarted job continues from: of every ``*.ckpt`` in ``folders`` (files and FSDP2 folders), the one
    saved at the highest step, the newest file among equals; one that cannot be read (cut short by the crash) is
    passed over. None when there is none."""
    from distlab.checkpoint import checkpoint_step

    found = []
    for path in (p for folder in folders if folder.is_dir() for p in folder.glob("*.ckpt")):
        try:
            step = checkpoint_step(path)
        except Exception:  # noqa: BLE001 - a checkpoint the crash cut short: an earlier one continues the job
            continue
        if step is not None:
            found.append((step, path.stat().st_mtime, str(path)))
    return Path(max(found)[2]) if found else None


def check_room_for_a_checkpoint(model: Any, folders: list[Path]) -> None:
    """Each checkpoint folder's disk holds at least one checkpoint of this model (weights and optimizer state:
    about 3x the weights): a full disk was found only at the first save, after the steps before it were spent."""
    import shutil

    from distlab.errors import file_size_limit

    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    need = 3 * weights + (1 << 20)
    limit = file_size_limit()
    if (
        limit is not None and limit < 2 * weights
    ):  # Python ignores SIGXFSZ: the first save would fail with EFBIG
        shown = f"{limit // 1024} KiB" if limit < 1 << 30 else f"{limit / (1 << 30):.1f} GiB"
        raise ConfigError(
            f"this process may write files of at most {shown} (its file-size limit: ulimit -f {limit // 1024}), and "
            f"one checkpoint of this model (its weights and optimizer state) takes more than {_bytes(2 * weights)}; "
            "raise the limit (ulimit -f unlimited) and run again"
        )
    for folder in folders:
        existing = folder
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        try:
            free = shutil.disk_usage(existing).free
        except OSError:
            continue
        if free < need:
            raise ConfigError(
                f"the disk holding the checkpoint folder {folder} has {_bytes(free)} free, and one checkpoint of this "
                f"model (its weights and optimizer state) takes about {_bytes(need)}; free space there, or set "
                "trainer.default_root_dir (or the ModelCheckpoint's dirpath) to a folder on another disk"
            )


def _run_files_writable(trainer: Any) -> None:
    """A resume appends to the run's metrics.csv and rewrites its config.yaml and hparams.yaml: each that exists
    must be writable (a read-only or immutable one failed after the first step, as an internal error)."""
    from distlab.run_files import run_folder

    if not getattr(trainer, "loggers", None):
        return
    folder = run_folder(trainer)
    for name in ("metrics.csv", "config.yaml", "hparams.yaml"):
        path = folder / name
        if path.is_file() and not os.access(path, os.W_OK):
            raise ConfigError(
                f"{path} cannot be written (read-only or immutable), and this fit appends to it or rewrites it; make it "
                "writable (chmod u+w / chattr -i), or set trainer.default_root_dir to another folder"
            )


def check_before_run(trainer: Any, subcommand: str, ckpt_path: str | None, folders: list[Path]) -> str | None:
    """Before the first step: the checkpoint folders can be written (fit), and ``--ckpt_path`` names a checkpoint
    that exists and can continue (``last`` / ``best`` / ``hpc`` / ``registry`` resolved as Lightning would, a
    resume below ``max_steps``). ``folders``: where the ModelCheckpoint callbacks write. Returns the checkpoint
    path ``last`` resolves to (or ``ckpt_path``)."""
    if subcommand == "fit":
        for folder in folders:
            check_writable(
                folder,
                "the checkpoint folder",
                "make it writable, or set trainer.default_root_dir (or the ModelCheckpoint's dirpath) to a folder you "
                "can write",
            )
        _run_files_writable(trainer)
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        found = sorted(
            (p for folder in folders if folder.is_dir() for p in folder.glob("last*.ckpt")),
            key=lambda p: p.stat().st_mtime,
        )
        if not found:
            shown = (
                ", ".join(dict.fromkeys(str(f) for f in folders))
                or "(no checkpoint folder: no ModelCheckpoint callback)"
            )
            newest = newest_checkpoint(folders)
            raise ConfigError(
                f"--ckpt_path last: no last*.ckpt in {shown}; give the checkpoint's path"
                + (f" (the newest there: {newest})" if newest else "")
                + (", or drop --ckpt_path to start from scratch" if subcommand == "fit" else "")
            )
        ckpt_path = str(found[-1])
    elif ckpt_path == "best":
        raise ConfigError(
            "--ckpt_path best means the best checkpoint a ModelCheckpoint saved earlier in this same process, and a "
            "new distlab command has none; give the checkpoint's path (e.g. runs/x/checkpoints/best-step=100.ckpt)"
        )
    elif ckpt_path == "hpc":
        root = Path(str(trainer.default_root_dir))
        if not list(root.glob("hpc_ckpt_*.ckpt")):
            raise ConfigError(
                f"--ckpt_path hpc: no hpc_ckpt_*.ckpt in trainer.default_root_dir={str(root)!r} (Lightning's SLURM "
                "auto-requeue writes them there); give the checkpoint's path"
            )
        return ckpt_path
    elif ckpt_path == "registry":
        import importlib.util

        if importlib.util.find_spec("litmodels") is None:
            raise ConfigError(
                "--ckpt_path registry loads from Lightning's model registry, which needs the litmodels package (not "
                "installed); give the checkpoint's path"
            )
        return ckpt_path
    if subcommand != "fit":
        return ckpt_path
    from distlab.checkpoint import checkpoint_step

    step = checkpoint_step(ckpt_path)
    if step is not None and trainer.max_steps > 0 and step >= trainer.max_steps:
        if trainer.fast_dev_run:
            raise ConfigError(
                f"trainer.fast_dev_run runs {trainer.max_steps} step(s) from the start, and {ckpt_path!r} is already at "
                f"step {step}; drop --ckpt_path to check that everything runs, or drop fast_dev_run to resume"
            )
        raise ConfigError(
            f"{ckpt_path!r} is at step {step}, and trainer.max_steps={trainer.max_steps}: nothing left to train; "
            f"set trainer.max_steps above {step} to continue it"
        )
    _keeps_a_newer_last(ckpt_path, step, folders)
    return ckpt_path


def _keeps_a_newer_last(ckpt_path: str, step: int | None, folders: list[Path]) -> None:
    """A resume from an older checkpoint (a best-step file) into the folder it lives in would replace that folder's
    newer ``last.ckpt`` at its first save: the steps after ``step`` would be lost without a word."""
    from distlab.checkpoint import checkpoint_step

    ckpt = Path(ckpt_path).expanduser().resolve()
    for folder in folders:
        last = folder / "last.ckpt"
        if step is None or not last.is_file() or ckpt.parent != folder.resolve() or ckpt == last.resolve():
            continue
        newer = checkpoint_step(str(last))
        if newer is not None and newer > step:
            raise ConfigError(
                f"resuming from {ckpt.name} (step {step}) in its own folder would replace {last} (step {newer}) at the "
                f"first save; resume from last.ckpt, or set trainer.default_root_dir to a new folder to branch off "
                f"from step {step}"
            )


# What a fit writes in its run folder: a folder holding any of them belongs to a run.
# (``*.ckpt`` at the top: a run folder pointed at another run's checkpoints folder)
RUN_FILES = ("config.yaml", "metrics.csv", "hparams.yaml", "checkpoints/*.ckpt", "*.ckpt")


def earlier_run_files(run_folder: Path, checkpoint_folders: list[Path] = ()) -> list[Path]:
    """The files of an earlier fit in ``run_folder`` (config, metrics, checkpoints) and in checkpoint folders
    elsewhere."""
    found = {p for pattern in RUN_FILES for p in run_folder.glob(pattern)} if run_folder.is_dir() else set()
    found |= {p for folder in checkpoint_folders if folder.is_dir() for p in folder.glob("*.ckpt")}
    return sorted(found)


def check_run_folder_is_free(
    run_folder: Path,
    ckpt_path: str | None,
    checkpoint_folders: list[Path] = (),
    set_by: str = "--trainer.default_root_dir",
    config_files: list[str] = (),
) -> None:
    """A fresh fit must not write into an earlier run's folder (its config and metrics would be overwritten, its
    checkpoints mixed with the new ones); a resume may continue in the folder its checkpoint came from, or in an
    empty one. ``set_by``: the setting that chose the folder; ``config_files``: the --config files given (one of
    them may be the config.yaml the run would write over)."""
    for folder in (run_folder, *checkpoint_folders):
        shard = _prepared_data_in(folder)
        if shard is not None:  # the dataset's folder: the run's files would mix with its shards
            what = set_by if folder == run_folder else "the ModelCheckpoint's dirpath"
            raise ConfigError(
                f"{folder} holds prepared data ({shard.name}, written by distlab prepare): the run's files would mix "
                f"with its shards; set {what} to a folder of its own (give the data as data.paths={folder})"
            )
    recipe = next(
        (c for c in config_files if Path(c).expanduser().resolve() == (run_folder / "config.yaml").resolve()),
        None,
    )
    resumed_here = ckpt_path is not None and (
        ckpt_path in CKPT_ALIASES or run_folder.resolve() in Path(ckpt_path).expanduser().resolve().parents
    )
    if recipe is not None and not resumed_here:
        # (a resume in its own folder may read the run's config.yaml: the rewritten one holds it, with the changes)
        raise ConfigError(
            f"--config {recipe} is the config.yaml a fit writes into its run folder {run_folder} (the resolved config of "
            f"the run): it would be overwritten; set {set_by} to another folder, e.g. {run_folder / 'run'}"
        )
    found = earlier_run_files(run_folder, checkpoint_folders)
    if not found:
        return
    if ckpt_path is None:
        newest = next((p for p in reversed(found) if p.suffix == ".ckpt"), found[-1])
        hint = f"resume with --ckpt_path {newest}, or " if newest.suffix == ".ckpt" else ""
        elsewhere = next(
            (f for f in checkpoint_folders if f in newest.parents and run_folder not in f.parents), None
        )
        if (
            elsewhere is not None
        ):  # a ModelCheckpoint's own dirpath, outside the run folder, holds another run
            raise ConfigError(
                f"the ModelCheckpoint's dirpath {elsewhere} already holds checkpoints of another run "
                f"({newest.name}); {hint}set the callback's dirpath to a folder of this run (or leave it unset)"
            )
        raise ConfigError(
            f"{run_folder} already holds an earlier run ({_shown_in(newest, run_folder)}); {hint}set another "
            f"{set_by}, or delete the folder"
        )
    ckpt = Path(ckpt_path).expanduser().resolve()
    if ckpt_path not in CKPT_ALIASES and run_folder.resolve() not in ckpt.parents:
        raise ConfigError(
            f"{run_folder} holds another run ({_shown_in(found[0], run_folder)}), and the checkpoint {ckpt_path!r} "
            "comes from elsewhere: resuming there would overwrite that run's config and mix the checkpoints; resume "
            "in the checkpoint's own run folder or in a new --trainer.default_root_dir"
        )


def _prepared_data_in(folder: Path) -> Path | None:
    """A token shard of distlab prepare's in ``folder`` (its header's magic read), or None."""
    import numpy as np

    from distlab.data.corpus import BIN_MAGIC

    for path in sorted(folder.glob("*.bin")) if folder.is_dir() else []:
        try:
            if np.fromfile(path, dtype=np.int32, count=1).tolist() == [BIN_MAGIC]:
                return path
        except (OSError, ValueError):
            continue
    return None


def _holds_training(path: Path) -> bool:
    """Whether an earlier run's file records training: a checkpoint, or metrics with at least one row (a fit that
    was refused or crashed before its first logged step leaves only its config and hyperparameters)."""
    if path.suffix == ".ckpt":
        return True
    if path.name == "metrics.csv":
        with open(path, encoding="utf-8", errors="replace") as f:
            return sum(1 for line in f if line.strip()) > 1
    return False


def _shown_in(path: Path, folder: Path) -> str:
    return str(path.relative_to(folder)) if folder in path.parents else str(path)


def is_launching_process(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process starts the job (not a rank another process or launcher started): it alone checks
    the run folder, before any rank writes to it."""
    env = os.environ if env is None else env
    return all(env.get(k, "0") in ("", "0") for k in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "RANK"))
