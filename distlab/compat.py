"""Every private API of Lightning, torch, torchmetrics and jsonargparse that distlab uses, in this one module.

Each use says why no public hook does the job, and the versions it was checked against are the ends of the ranges
that :mod:`distlab.versions` enforces at import (make test-versions runs both). When a release moves one of these,
the failure lands here, by name. ``tests/unit/test_compat.py`` fails when a private name is used anywhere else, or
when a distlab subclass overrides a private hook not listed in :data:`SUBCLASS_HOOKS`.
"""

from __future__ import annotations

import contextlib
import csv
import importlib
import inspect
import typing
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import lightning.pytorch.callbacks
import lightning.pytorch.loggers
import lightning.pytorch.profilers
import torch
import torch.distributed as dist
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from distlab.errors import ConfigError

# Checked against: lightning 2.6.0 and 2.6.6, torch 2.13.0 and 2.14.1, torchmetrics 1.4.0 and 1.9.0, jsonargparse 4.39.0
# and 4.53.0 (the ends of the declared ranges; make test-versions).

# ---- private hooks distlab's subclasses override (Lightning's own extension points, which it keeps private) --------
SUBCLASS_HOOKS = {
    "_configure_launcher": "Strategy: how a strategy picks its launcher (DistlabStrategyMixin)",
    "_collect_rank_zero_results": "the spawn launcher: what rank 0 sends back (FSDP2 gathers full tensors first)",
    "_run_early_stopping_check": "EarlyStopping: the decision SyncEarlyStopping makes on rank 0 and broadcasts",
    "_parse_ckpt_path": "LightningCLI: reading --ckpt_path's hyperparameters (distlab refuses pickled code first)",
    "_instantiate_trainer": "LightningCLI: building the Trainer (distlab adds its callbacks and loggers there)",
    "_cache_functions_events": "PyTorchProfiler: its events table (TraceProfiler tolerates a run with no step)",
    "_check_log_dir_exists": "CSVLogger's writer: where it deletes an existing metrics.csv (AppendingWriter keeps it)",
    "_wrapping_function": "the spawn launcher: each rank's entry (forkserver ranks take the launching process's "
    "environment and global state, as spawned ranks do)",
    "_add_subcommands": "LightningCLI: registering fit/validate/test/predict (distlab adds generate and export beside them)",
}

# ---- private names, imported when first used ------------------------------------------------------------------
_PRIVATE_NAMES = {
    # Lightning's spawn launcher: no public base class to extend (distlab's allows notebooks; strategies/launcher.py)
    "MultiProcessingLauncher": (
        "lightning.pytorch.strategies.launchers.multiprocessing",
        "_MultiProcessingLauncher",
    ),
    # what a spawned rank restores of the launching process (deterministic algorithms, RNG states, cudnn flags)
    "GlobalStateSnapshot": ("lightning.pytorch.strategies.launchers.multiprocessing", "_GlobalStateSnapshot"),
    # ModelParallelStrategy.setup's own steps, which FSDP2Strategy.setup repeats around its sharding (no hook between)
    "materialize_distributed_module": ("lightning.fabric.utilities.init", "_materialize_distributed_module"),
    "optimizers_to_device": ("lightning.fabric.utilities.optimizer", "_optimizers_to_device"),
    # the compute dtype a precision plugin trains in (ThroughputMonitor's; no public accessor)
    "plugin_compute_dtype": ("lightning.pytorch.callbacks.throughput_monitor", "_plugin_to_compute_dtype"),
    # what Lightning trains with when configure_optimizers returned None (it only warns)
    "MockOptimizer": ("lightning.pytorch.core.optimizer", "_MockOptimizer"),
    # reading one key of a DCP folder without a process group (export, generate from an FSDP2 folder)
    "load_state_dict_from_keys": (
        "torch.distributed.checkpoint.state_dict_loader",
        "_load_state_dict_from_keys",
    ),
}


def __getattr__(name: str) -> Any:
    if name in _PRIVATE_NAMES:
        module, attr = _PRIVATE_NAMES[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'distlab.compat' has no attribute {name!r}")


# ---- patches: every attribute distlab replaces on an object it does not own goes through here ---------------------
@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    """``obj.name = value`` for the duration of the block, then as before (also on error): the original value
    back, or, where ``value`` shadowed a class attribute (a method), the shadow removed."""
    had = name in getattr(obj, "__dict__", {})
    original = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, original)
        else:
            delattr(obj, name)


def patch(obj: Any, name: str, value: Any) -> None:
    """``obj.name = value`` until :func:`unpatch` (for patches that span Lightning hooks, not one block)."""
    setattr(obj, name, value)


def unpatch(obj: Any, name: str) -> None:
    """Undo :func:`patch` of an instance attribute that shadows the class's."""
    vars(obj).pop(name, None)


# ---- Lightning -----------------------------------------------------------------------------------------------
class AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, except that an existing metrics.csv is continued (its columns kept), not deleted."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                self.metrics_keys = sorted(next(csv.reader(f), []))


class AppendingCSVLogger(CSVLogger):
    """Lightning's CSVLogger, except that an existing metrics.csv is continued, not deleted (a resumed fit keeps the
    steps before its checkpoint). No public option: the deletion is in ``ExperimentWriter._check_log_dir_exists``."""

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingWriter(log_dir=self.log_dir)
        return self._experiment


def int_before_float(functions: Any) -> None:
    """Put ``int`` before ``float`` in every annotation of ``functions`` that holds both.

    Lightning #21259: ``typing`` caches ``Optional[Union[int, float]]`` under a key that equals
    ``Optional[Union[float, int]]``, so the order Lightning's annotations hold is whichever a package imported
    earlier happened to build first (it differs between two machines with the same versions). jsonargparse tries a
    Union's types in order: with float first, ``--trainer.limit_train_batches=2`` parses as 2.0, a fraction, and
    ``ModelPruning(amount=2)``, ``StochasticWeightAveraging(swa_epoch_start=2)`` change meaning the same way. No
    option of the parser orders the types; the annotations themselves are rewritten (the same types, int first)."""
    for fn in functions:
        annotations = getattr(fn, "__annotations__", None) or {}
        for name, tp in list(annotations.items()):
            args = typing.get_args(tp) if typing.get_origin(tp) is typing.Union else ()
            if int in args and float in args and args.index(float) < args.index(int):
                # Union[(int, ...)] is cached under its own key: the tuple of types, int first
                annotations[name] = typing.Union[(int, *(a for a in args if a is not int))]


def lightning_init_functions() -> list[Any]:
    """The ``__init__`` of the Trainer and of every class Lightning's callbacks, loggers and profilers export: the
    signatures the CLI parses."""
    packages = (lightning.pytorch.callbacks, lightning.pytorch.loggers, lightning.pytorch.profilers)
    classes = [L.Trainer] + [c for pkg in packages for _, c in inspect.getmembers(pkg, inspect.isclass)]
    return list({id(c.__init__): c.__init__ for c in classes}.values())


def subcommands_action(parser: Any) -> Any:
    """A jsonargparse parser's subcommands (``add_subcommands()`` may run once, and LightningCLI keeps what it
    returned to itself): distlab adds generate and export to LightningCLI's four."""
    return parser._subcommands_action


def launcher_strategy(launcher: Any) -> Any:
    """The strategy a Lightning launcher launches for (kept as its ``_strategy``; no accessor)."""
    return launcher._strategy


def set_main_port(cluster_environment: Any, port: int) -> None:
    """The rendezvous port of ``LightningEnvironment``: read from MASTER_PORT once, then kept as its ``_main_port``
    (a second fit of the same Trainer would take the first's); no setter."""
    cluster_environment._main_port = port


def set_launcher(strategy: Any, launcher: Any) -> None:
    """``Strategy._configure_launcher``'s protocol: the launcher is its ``_launcher`` (no setter)."""
    strategy._launcher = launcher


def start_method(strategy: Any) -> str:
    return strategy._start_method  # DDPStrategy/ModelParallelStrategy keep it private


def set_start_method(strategy: Any, method: str) -> None:
    strategy._start_method = method


def process_group_backend(strategy: Any) -> str | None:
    return getattr(strategy, "_process_group_backend", None)  # public only after setup, as a property


def skip_lightning_signal_handlers(trainer: Any) -> None:
    """Keep the Trainer from installing its SIGTERM handler for this run (its ``_signal_connector`` registers it
    after ``on_fit_start``; it broadcasts inside the handler): the caller handles stop signals itself."""
    connector = trainer._signal_connector
    patch(connector, "register_signal_handlers", lambda: setattr(connector, "received_sigterm", False))


def layer_sync(strategy: Any) -> Any:
    """The Trainer's ``sync_batchnorm`` plugin, as the accelerator connector hands it to the strategy."""
    return getattr(strategy, "_layer_sync", None)


def saves_distributed_checkpoint(strategy: Any) -> bool:
    return bool(getattr(strategy, "_save_distributed_checkpoint", False))


def set_parallel_sizes(strategy: Any, data_parallel: int, tensor_parallel: int) -> None:
    """ModelParallelStrategy's mesh sizes, fixed once the ranks are known (its "auto" means dp = nodes)."""
    strategy._data_parallel_size, strategy._tensor_parallel_size = data_parallel, tensor_parallel


def should_accumulate(trainer: Any) -> bool:
    """Whether this batch only accumulates (no optimizer step follows it): the fit loop's own test."""
    return trainer.fit_loop._should_accumulate()


@contextlib.contextmanager
def counting_this_batch(trainer: Any) -> Iterator[None]:
    """Inside the block, the fit loop's logger-step counter already counts the batch that just ended, as it will
    after ``on_advance_end``. A checkpoint written there (by a validation run in ``on_advance_end``) then resumes
    at the right step: Lightning restarts such a checkpoint "on last" and adds nothing to the counter."""
    loop = trainer.fit_loop.epoch_loop
    counts = not loop._should_accumulate()
    loop._batches_that_stepped += counts
    try:
        yield
    finally:
        loop._batches_that_stepped -= counts


def defer_epoch_end_checkpoint(callback: Any) -> None:
    """A ModelCheckpoint left to decide (``save_on_train_epoch_end=None``) acts on validations, not epoch ends."""
    if callback._save_on_train_epoch_end is None:
        callback._save_on_train_epoch_end = False


def check_early_stopping_on_validation(callback: Any) -> None:
    """Lightning's EarlyStopping checks at validation end (not at train-epoch end)."""
    callback._check_on_train_epoch_end = False


def eval_loop_data_source(loop: Any) -> Any:
    """What Lightning's validate/test loop would iterate (the data module's or the module's loader hook)."""
    return loop._data_source


def print_eval_results(results: list[dict[str, float]], stage: str) -> None:
    """Lightning's table of validate/test results, for evaluations distlab runs itself."""
    from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop

    _EvaluationLoop._print_results(results, stage)


def early_stopping_step(callback: Any, current: Any) -> tuple[bool, str | None]:
    """``EarlyStopping._evaluate_stopping_criteria``: (should stop, reason), updating its wait count and best."""
    return callback._evaluate_stopping_criteria(current)


def early_stopping_metric_ok(callback: Any, logs: dict) -> bool:
    """``EarlyStopping._validate_condition_metric``: whether the monitored metric is there (raises if strict)."""
    return callback._validate_condition_metric(logs)


def early_stopping_log(callback: Any, trainer: Any, message: str, log_rank_zero_only: bool) -> None:
    callback._log_info(trainer, message, log_rank_zero_only)


def restricted_classmethod(method: Any) -> Any:
    """Lightning's classmethod that refuses a call on an instance (``LightningModule.load_from_checkpoint``'s): an
    override keeps that guard."""
    return type(vars(L.LightningModule)["load_from_checkpoint"])(method)


# ---- torch --------------------------------------------------------------------------------------------------
def functional_collectives() -> Any:
    """torch's functional collectives (``torch.distributed._functional_collectives``: traced code and DTensor call
    them, not the ``torch.distributed`` names), which rank-local work must refuse too."""
    return importlib.import_module("torch.distributed._functional_collectives")


class foreach:  # noqa: N801 (a namespace, read as foreach.lerp_)
    """torch's foreach kernels (``torch._foreach_*``: one call over a list of tensors, what torch.optim's
    ``foreach=True`` paths run; no public name). Element-wise, so each result equals the per-tensor op's."""

    def __getattr__(self, op: str) -> Callable[..., Any]:
        return getattr(torch, "_foreach_" + op)


foreach = foreach()


def use_count(tensor: Any) -> int:
    """How many references the C++ side holds to ``tensor``'s storage (the gloo release wait: distributed/gloo.py)."""
    return tensor._use_count()


# ---- torchmetrics ----------------------------------------------------------------------------------------------
def metric_defaults(metric: Any) -> dict[str, Any]:
    """The metric's state names and their defaults (``add_state``)."""
    return metric._defaults


def metric_reductions(metric: Any) -> dict[str, Any]:
    """How each state is reduced across processes (``dist_reduce_fx``)."""
    return metric._reductions


def metric_progress(metric: Any) -> tuple[int, Any]:
    """(update count, cached compute result): what ``reset`` clears besides the states."""
    return metric._update_count, metric._computed


def set_metric_progress(metric: Any, update_count: int, computed: Any) -> None:
    metric._update_count, metric._computed = update_count, computed


def set_metric_sync(metric: Any, available_fn: Any, on_compute: bool) -> None:
    """Whether ``compute`` syncs across processes (exact evaluation computes on one rank or syncs itself)."""
    metric.distributed_available_fn, metric.sync_on_compute, metric._to_sync = (
        available_fn,
        on_compute,
        on_compute,
    )


def metric_is_synced(metric: Any) -> bool:
    return metric._is_synced


def closed_form_lr(scheduler: Any) -> list[float] | None:
    """The rates a torch LR scheduler's private closed form gives at its current step, or None where it has none."""
    closed_form = getattr(scheduler, "_get_closed_form_lr", None)
    return list(closed_form()) if callable(closed_form) else None


class GradientUse:
    """Which of a sharded module's parameters this rank gave a gradient since :meth:`take` last asked, under FSDP2
    reducing the gradients of parameters a rank did not use as zeros (its ``set_reduce_scatter_unused_params``: else
    the ranks' reduce-scatters differ in size, and gloo aborts or nccl hangs). A parameter no rank used must then
    get no gradient, as under ``ddp(find_unused_parameters=True)``, and the zeros cannot tell: so each parameter
    group's ``post_backward`` (FSDP2's private method, no public hook runs before its reduction) first notes what
    it is about to reduce, by FSDP2's own test.

    A whole unit that some ranks skip (an expert no sample was routed to) is another matter: its gather and its
    reduction would pair with another unit's on the other ranks (a crash, a hang, or, for units of one size,
    shards of two experts mixed without a word). So before each unit's forward, at the end of each step method
    and before each reduction, the ranks agree on which unit comes next (one small CPU all-reduce), and a
    disagreement is one line on every rank at once."""

    def __init__(self, module: Any, step_methods: tuple[str, ...], control_group: Callable[[], Any]) -> None:
        """``control_group()``: the process group of every rank for small CPU tensors (gloo)."""
        from torch.distributed.fsdp import FSDPModule

        self.control_group = control_group
        self.used: set[int] = set()
        names = {id(m): name for name, m in module.named_modules()}
        units = [m for m in module.modules() if isinstance(m, FSDPModule)]
        self.labels = [names[id(m)] or f"{type(m).__name__}'s own parameters" for m in units]
        self.end = len(units)  # the code of "a step method returned"
        for i, m in enumerate(units):
            m.set_reduce_scatter_unused_params(True, recurse=False)
            if m is not module:
                m.register_forward_pre_hook(lambda *_, i=i: self._agree(i), prepend=True)
            for group in m._get_fsdp_state()._fsdp_param_groups:
                self._note_before_reducing(group, self.end + 1 + i)
        for method in step_methods:
            self._agree_after(module, method)

    def _agree_after(self, module: Any, method: str) -> None:
        step = getattr(module, method)

        def agreed_step(*args: Any, **kwargs: Any) -> Any:
            out = step(*args, **kwargs)
            self._agree(self.end)
            return out

        setattr(module, method, agreed_step)

    def _label(self, code: int) -> str:
        if code == self.end:
            return "none: the step method returned"
        what = "forward" if code < self.end else "gradient reduction"
        return f"the {what} of {self.labels[code % (self.end + 1)]}"

    def _agree(self, code: int) -> None:
        both = torch.tensor([code, -code], dtype=torch.int64)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.control_group())
        high, low = int(both[0]), -int(both[1])
        if high != low:
            raise ConfigError(
                f"fsdp2: the ranks ran different sharded units ({self._label(low)} on some, {self._label(high)} on "
                "others): FSDP2 gathers and reduces a unit on every rank at once, so a module that only some ranks "
                "call (an expert, a branch) cannot be a unit of its own; fully_shard only the blocks every rank runs "
                "in configure_model, or train with ddp_optimizer_sync"
            )

    def _note_before_reducing(self, group: Any, code: int) -> None:
        original = group.post_backward

        def post_backward(*args: Any, **kwargs: Any) -> Any:
            self._agree(code)
            for fsdp_param in group.fsdp_params:
                if fsdp_param.unsharded_accumulated_grad is not None or (
                    hasattr(fsdp_param, "_unsharded_param") and fsdp_param.unsharded_param.grad is not None
                ):
                    self.used.add(id(fsdp_param.sharded_param))
            return original(*args, **kwargs)

        group.post_backward = post_backward

    def take(self, params: list[Any]) -> list[bool]:
        """Whether this rank used each of ``params`` since the last call for them; forgets them."""
        flags = [id(p) in self.used for p in params]
        self.used.difference_update(id(p) for p in params)
        return flags
