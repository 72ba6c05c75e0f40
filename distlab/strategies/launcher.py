"""The multiprocessing launcher of distlab's ``*_spawn`` strategies: Lightning's, usable in notebooks too.

Lightning refuses ``start_method="spawn"`` in every interactive session (``sys.ps1`` is set, as in Jupyter), since a
spawned rank, a fresh interpreter, cannot import a class defined in the notebook's ``__main__``. Classes in
importable modules (distlab's, the CLI's configs, a ``%%writefile my_model.py`` the notebook imports) reach the
ranks fine. So this launcher allows interactive sessions and instead refuses, in one line before any process starts,
a LightningModule (or submodule), DataModule, DataLoader dataset / collate_fn / sampler or callback defined in an
unimportable ``__main__`` (else each rank dies with "Can't get attribute 'MyModel' on <module '__main__'>" on the
kernel's stderr, and the notebook shows only "process 1 terminated with exit code 1"). A best-effort check of those
objects, not of everything they reference.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn

from distlab.compat import (
    GlobalStateSnapshot,
    MultiProcessingLauncher,
    launcher_strategy,
    set_main_port,
    start_method,
)
from distlab.distributed.spawn import unshare_tensors
from distlab.errors import ConfigError
from distlab.log import info_rank0


def main_importable() -> bool:
    """Whether a spawned process can import this process's ``__main__`` (a script, ``python -m``), as
    multiprocessing's spawn preparation does; false in a notebook kernel or ``python -c``."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return True
    # '<stdin>' for a script piped into `python -`: nothing to re-import
    file = getattr(main, "__file__", None)
    return bool(file and os.path.isfile(file))


def parametrized_module(args: tuple) -> str | None:
    """The name of the first parametrized module among ``args``' modules (torch refuses to pickle one), or None."""
    from torch.nn.utils.parametrize import is_parametrized

    for obj in args:
        if isinstance(obj, nn.Module):
            found = next((name for name, m in obj.named_modules() if is_parametrized(m)), None)
            if found is not None:
                return ".".join((type(obj).__name__, found)) if found else type(obj).__name__
    return None


def objects_from_main(trainer: Any, args: tuple) -> list[str]:
    """Names of the classes / functions defined in ``__main__`` among what the launcher sends to each rank:
    the module (and its submodules), the DataModule, DataLoaders (dataset, collate_fn, sampler), callbacks."""
    found: list[str] = []
    seen: set[int] = set()

    def visit(obj: Any) -> None:
        if obj is None or id(obj) in seen:
            return
        seen.add(id(obj))
        cls = obj if isinstance(obj, (type, types.FunctionType)) else type(obj)  # what pickle names by module
        name = getattr(cls, "__qualname__", repr(cls))
        if getattr(cls, "__module__", None) == "__main__" and name not in found:
            found.append(name)
        if isinstance(obj, nn.Module):
            parts = obj.modules()  # itself first: already seen
        elif isinstance(obj, (list, tuple, dict)):
            parts = obj.values() if isinstance(obj, dict) else obj
        elif hasattr(obj, "dataset") and hasattr(obj, "collate_fn"):  # a DataLoader
            parts = [getattr(obj, a, None) for a in ("dataset", "collate_fn", "sampler", "batch_sampler")]
        else:
            return
        for part in parts:
            visit(part)

    for obj in args:
        visit(obj)
    if trainer is not None:
        visit(list(trainer.callbacks))
    return found


def unguarded_main_line() -> int | None:
    """The line of the script's top-level statement that started this launch, if it is not under
    ``if __name__ == "__main__":`` (each spawned rank re-runs the script: it would launch again, and Lightning's
    children refuse that while the parent waits); None when guarded, or not launched from a script."""
    import ast
    import inspect

    frame = inspect.currentframe()
    while frame is not None and not (
        frame.f_globals.get("__name__") == "__main__" and frame.f_code.co_name == "<module>"
    ):
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.endswith(".py"):
        return None
    try:
        tree = ast.parse(open(frame.f_code.co_filename, encoding="utf-8").read())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    line = frame.f_lineno
    for stmt in tree.body:
        if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            guarded = (
                isinstance(stmt, ast.If)
                and "__main__" in ast.unparse(stmt.test)
                and "__name__" in ast.unparse(stmt.test)
            )
            return None if guarded else line
    return None


class _LaunchingStdio:
    """The launching process's stdout and stderr, carried into a forkserver rank when it starts (as a pipe is: the
    descriptors travel with the pickled start), since a forked rank has the server's, from whoever started it."""

    def __init__(self, fds: tuple[Any, Any] | None = None) -> None:
        self.fds = fds

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import reduction

        return (_LaunchingStdio, ((reduction.DupFd(1), reduction.DupFd(2)),))

    def attach(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, fd in zip((1, 2), self.fds or (), strict=False):
            os.dup2(fd.detach(), target)


def quick_start_method(method: str) -> str:
    """``"forkserver"`` for ``"spawn"`` where the platform has one (ranks fork from a server that imported torch,
    Lightning and distlab once, with this launcher carrying what a spawned rank would have had); else ``method``."""
    return "forkserver" if method == "spawn" and "forkserver" in mp.get_all_start_methods() else method


class SpawnLauncher(MultiProcessingLauncher):
    """Lightning's multiprocessing launcher (start method spawn / fork / forkserver), allowed in notebooks; a SIGTERM
    or Ctrl-C to the launching process reaches the ranks (which agree, save and stop) instead of killing them."""

    @property
    def is_interactive_compatible(self) -> bool:
        return True  # what spawn cannot carry (classes defined in the notebook) is refused in launch()

    def launch(self, function: Any, *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        from distlab.launch import launcher_world

        # each of the launcher's processes would spawn ranks of its own: two jobs that collide
        if (started := launcher_world()) is not None:
            raise ConfigError(
                f"this strategy spawns its own ranks, but {started[0]} already started {started[1]} processes; use "
                "strategy='ddp_optimizer_sync' (or 'ddp', 'fsdp2') under a launcher, or run the script without it"
            )
        # what the ranks get is pickled (a fork copies it)
        pickled = start_method(self) in ("spawn", "forkserver")
        if pickled and (line := unguarded_main_line()) is not None:
            raise ConfigError(
                f"line {line} of this script starts ranks (start_method={start_method(self)!r}) outside an `if __name__ == "
                '"__main__":` block; each rank re-runs the script and would start ranks again: put the call under '
                "that guard (or use a strategy without _spawn, which launches the script itself)"
            )
        if pickled and not main_importable() and (names := objects_from_main(trainer, args)):
            raise ConfigError(
                f"{', '.join(names)} defined in this notebook / session cannot reach the spawned ranks (each "
                "is a fresh interpreter that cannot import this __main__); put it in a .py file (in a notebook: "
                "%%writefile my_module.py) and import it from there"
            )
        if pickled and (parametrized := parametrized_module(args)) is not None:
            raise ConfigError(
                f"{parametrized} is parametrized (weight_norm, spectral_norm or torch.nn.utils.parametrize), and torch "
                "sends such a module to no spawned rank (it pickles only its state_dict); apply the parametrization in "
                "the module's configure_model, which runs on each rank, or use a strategy without _spawn"
            )
        from distlab.callbacks.preemption import stop_signals_forwarded

        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE")
        store = self._host_rendezvous() if trainer is not None and trainer.num_nodes == 1 else None
        if start_method(self) == "forkserver":
            # The ranks fork from a server that imported torch, Lightning and distlab once (a spawned rank imports
            # them itself: seconds of CPU each). The server's environment is its own, from when it started: each
            # rank takes the launching process's, with the port Lightning is about to set, and its global state.
            mp.get_context("forkserver").set_forkserver_preload(["torch", "lightning.pytorch", "distlab"])
            if store is None:  # (a job over several nodes meets on the MASTER_PORT every node was given)
                os.environ["MASTER_PORT"] = str(launcher_strategy(self).cluster_environment.main_port)
            self._launching_env = (dict(os.environ), GlobalStateSnapshot.capture(), _LaunchingStdio())
        try:
            with stop_signals_forwarded(lambda: self.procs):  # a stop reaches the ranks, which save first
                return super().launch(function, *args, trainer=trainer, **kwargs)
        finally:
            self._launching_env = None
            if store is not None:  # the ranks have ended: the port is free again
                del store
                os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
                if agent_store is not None:
                    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = agent_store

    def _host_rendezvous(self) -> dist.TCPStore:
        """The ranks' rendezvous store, hosted by this process from before any rank starts until they have ended
        (every rank a client, as under torchrun's agent), so that nothing takes its port in between; MASTER_PORT is
        kept unless in use. Why: docs/internals.md, "The ranks' rendezvous"."""
        cluster, asked = launcher_strategy(self).cluster_environment, os.environ.get("MASTER_PORT", "")
        try:
            store = dist.TCPStore(
                cluster.main_address,
                int(asked) if asked.isdigit() else 0,
                is_master=True,
                wait_for_workers=False,
            )
        except dist.DistNetworkError:
            store = dist.TCPStore(cluster.main_address, 0, is_master=True, wait_for_workers=False)
            info_rank0(
                f"distlab: MASTER_PORT={asked} is in use (an earlier fit's store?); the ranks meet on {store.port}"
            )
        os.environ["MASTER_PORT"] = str(store.port)
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        set_main_port(cluster, store.port)  # what Lightning's launcher and each rank's init read
        return store

    _launching_env: tuple[dict[str, str], Any, _LaunchingStdio] | None = None

    def _wrapping_function(self, process_idx: int, trainer: Any, function: Any, args: Any, kwargs: Any,
                           return_queue: Any, global_states: Any = None) -> None:  # fmt: skip
        if self._launching_env is not None:  # a forkserver rank: what a spawned rank gets from Lightning
            env, global_states, stdio = self._launching_env
            os.environ.clear()
            os.environ.update(env)
            stdio.attach()
            # the weights arrived in shared memory: else every rank would update the same storage
            apply_to_collection((args, kwargs), nn.Module, unshare_tensors)
        super()._wrapping_function(process_idx, trainer, function, args, kwargs, return_queue, global_states)

    def get_extra_results(self, trainer: Any) -> dict[str, Any]:
        """On rank 0: Lightning's, and the stop signal the ranks agreed on with what they saved (a signal that
        reached a rank, not this process, still ends the command as a stop, not as a success)."""
        from distlab.callbacks import preemption

        return {
            **super().get_extra_results(trainer),
            "distlab_stop": (preemption.stopped_by, preemption.stop_note),
        }

    def update_main_process_results(self, trainer: Any, extra: dict[str, Any]) -> None:
        from distlab.callbacks import preemption

        stopped_by, note = extra.pop("distlab_stop", (None, ""))
        if stopped_by is not None:
            preemption.stopped_by = preemption.stopped_by or stopped_by
            preemption.stop_note = preemption.stop_note or note
        super().update_main_process_results(trainer, extra)
