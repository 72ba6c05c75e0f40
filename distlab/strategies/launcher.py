"""The multiprocessing launcher of distlab's ``*_spawn`` strategies: Lightning's, usable in notebooks too.

Lightning refuses ``start_method="spawn"`` in every interactive session (``sys.ps1`` is set, as in a Jupyter
kernel): "Trainer(strategy=...) is not compatible with an interactive environment". The reason is that a
spawned rank is a fresh interpreter that cannot import a class defined in the notebook itself (the notebook's
``__main__`` has no file to re-import). Classes that live in importable modules (distlab's, the CLI's configs,
or a ``%%writefile my_model.py`` the notebook imports) reach the ranks fine. So this launcher is allowed in
interactive sessions, and instead refuses, in one line and before any process starts, a LightningModule (or one
of its submodules), DataModule, DataLoader dataset / collate_fn / sampler or callback whose class or function is
defined in an unimportable ``__main__`` (otherwise each rank dies with "Can't get attribute 'MyModel' on
<module '__main__'>" on the kernel's stderr, and the notebook shows only "process 1 terminated with exit code
1"). It is a best-effort check of those objects, not of everything they reference.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from torch import nn

from distlab.errors import ConfigError


def main_importable() -> bool:
    """Whether a spawned process can import this process's ``__main__`` (a script, ``python -m``), as
    multiprocessing's spawn preparation does; false in a notebook kernel or ``python -c``."""
    main = sys.modules.get("__main__")
    return getattr(getattr(main, "__spec__", None), "name", None) is not None or bool(
        getattr(main, "__file__", None)
    )


def _in_main(obj: Any) -> str | None:
    """The ``__main__`` name of what pickling ``obj`` would reference by module, or None."""
    cls = obj if isinstance(obj, (type, types.FunctionType)) else type(obj)
    if getattr(cls, "__module__", None) == "__main__":
        return getattr(cls, "__qualname__", repr(cls))
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
        name = _in_main(obj)
        if name is not None and name not in found:
            found.append(name)
        if isinstance(obj, nn.Module):
            for m in obj.modules():
                if m is not obj:
                    visit(m)
        elif isinstance(obj, (list, tuple)):
            for o in obj:
                visit(o)
        elif isinstance(obj, dict):
            for o in obj.values():
                visit(o)
        elif hasattr(obj, "dataset") and hasattr(obj, "collate_fn"):  # a DataLoader
            for o in (
                obj.dataset,
                obj.collate_fn,
                getattr(obj, "sampler", None),
                getattr(obj, "batch_sampler", None),
            ):
                visit(o)

    for obj in args:
        visit(obj)
    if trainer is not None:
        visit(list(trainer.callbacks))
    return found


class SpawnLauncher(_MultiProcessingLauncher):
    """Lightning's multiprocessing launcher (start method spawn / fork / forkserver), allowed in notebooks."""

    @property
    def is_interactive_compatible(self) -> bool:
        return True  # what spawn cannot carry (classes defined in the notebook) is refused in launch()

    def launch(self, function: Any, *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        if self._start_method in ("spawn", "forkserver") and not main_importable():
            names = objects_from_main(trainer, args)
            if names:
                raise ConfigError(
                    f"{', '.join(names)} defined in this notebook / session cannot reach the spawned ranks (each "
                    "is a fresh interpreter that cannot import this __main__); put it in a .py file (in a notebook: "
                    "%%writefile my_module.py) and import it from there"
                )
        return super().launch(function, *args, trainer=trainer, **kwargs)
