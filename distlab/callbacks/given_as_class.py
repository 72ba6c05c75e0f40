"""``Trainer(callbacks=[SpeedMonitor])``, the class where an instance belongs, named in one line.

Lightning calls a callback's hooks as ``callback.setup(trainer, pl_module, stage=...)``. On a class, that call
reaches the plain function, with the Trainer in ``self``'s place: Python says "setup() missing 1 required positional
argument", and while Lightning handles that error, ``on_exception`` fails the same way and hides it.

:func:`refuse_the_class_for_an_instance` gives a callback class hooks that, called on the class itself with
something other than an instance as their first argument, raise a :class:`~distlab.errors.ConfigError` naming the
slip (the hooks Lightning calls while it handles an error stay quiet, so that line is the one the user sees).
Called on an instance, or as ``Base.hook(self, ...)`` from a subclass, a hook is the plain function.
``distlab.callbacks`` applies it to every callback class it exports.

    from distlab.callbacks import SpeedMonitor
    L.Trainer(callbacks=[SpeedMonitor]).fit(model)   # ConfigError: SpeedMonitor was given as a class ...
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import lightning as L

from distlab.errors import ConfigError

# Hooks Lightning calls while it handles an exception: quiet on the class, so the first error is the one raised.
_WHILE_HANDLING = ("on_exception", "teardown")


class _InstanceHook:
    """A hook that works as usual on an instance and names the class-for-an-instance slip on the class."""

    def __init__(self, fn: Any, name: str) -> None:
        self.fn, self.name = fn, name

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is not None:
            return self.fn.__get__(obj, owner)
        fn, name = self.fn, self.name

        @functools.wraps(fn)
        def on_the_class(*args: Any, **kwargs: Any) -> Any:
            if args and isinstance(args[0], owner):  # Base.hook(self, ...): an instance after all
                return fn(*args, **kwargs)
            if name in _WHILE_HANDLING:
                return None
            raise ConfigError(
                f"{owner.__name__} was given as a class, not a callback: write {owner.__name__}() (with its "
                f"arguments) in callbacks=[...]"
            )

        return on_the_class


def hook_names() -> list[str]:
    """The hooks Lightning calls on a callback: the functions ``lightning.Callback`` defines."""
    return [
        name
        for name, value in vars(L.Callback).items()
        if inspect.isfunction(value)
        and not name.startswith("_")
        and name not in ("state_dict", "load_state_dict")
    ]


def refuse_the_class_for_an_instance(cls: type) -> type:
    """Give ``cls`` (a Lightning callback class) hooks that name the slip of passing the class itself."""
    for name in hook_names():
        fn = next((vars(k)[name] for k in cls.__mro__ if name in vars(k)), None)
        if inspect.isfunction(fn):
            setattr(cls, name, _InstanceHook(fn, name))
        elif isinstance(fn, _InstanceHook):  # a subclass of a guarded class: its own owner in the message
            setattr(cls, name, _InstanceHook(fn.fn, name))
    return cls
