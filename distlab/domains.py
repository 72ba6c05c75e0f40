"""Every setting's valid values, declared once in its type; this module imports neither jsonargparse nor Lightning.

A parameter of a class distlab ships is annotated with the values it accepts: a domain below, ``Literal[...]``,
``bool``, or ``X | None`` of those. :func:`check_domains` enforces it from Python (a one-line
:class:`~distlab.errors.ConfigError`), and the CLI's parser reads the same annotations (``distlab.cli`` registers
each domain with jsonargparse). Calling a domain checks a value and returns it as a plain ``int`` / ``float`` /
``str`` (``PositiveInt(3) == 3``; ``PositiveInt(0)`` raises ValueError saying why).

Example::

    class MyCallback(L.Callback):
        def __init__(self, every_n_steps: PositiveInt = 10, ratio: UnitInterval = 0.5) -> None:
            check_domains(MyCallback.__init__, locals())
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import operator
import os
import re
import tempfile
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, NamedTuple, Union, get_args, get_origin

from distlab.errors import ConfigError, abbreviated

_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


class Domain:
    """The base of every domain type: ``base`` (int, float or str), ``doc`` (the values in words), and what decides:
    ``restrictions`` [(op, bound), ...] of a number, ``pattern`` of a text, or ``check(value)`` of a path. Calling
    the type returns the checked value as a plain ``base``; ``path`` types expand ``~`` (and a ``folder`` resolves
    ``..``) as a shell would."""

    base: type = str
    doc: str = ""
    restrictions: tuple[tuple[str, float], ...] = ()
    pattern: re.Pattern | None = None
    path = folder = False

    def __new__(cls, value: Any) -> Any:  # type: ignore[misc]
        why = cls.reason(value)
        if why is not None:
            raise ValueError(f"{abbreviated(repr(value))} {why}")
        plain = cls.base(value)
        plain = os.path.expanduser(plain) if cls.path else plain
        return os.path.normpath(plain) if cls.folder else plain

    @classmethod
    def reason(cls, value: Any) -> str | None:
        """Why ``value`` lies outside the domain, or None."""
        if cls.base in (int, float):
            if isinstance(value, str):
                with contextlib.suppress(ValueError):  # else still a str: refused below
                    value = cls.base(value)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return f"is not {'an integer' if cls.base is int else 'a number'}"
            if cls.base is int and not float(value).is_integer():
                return "is not an integer"
            broken = [f"{op} {b:g}" for op, b in cls.restrictions if not _OPS[op](value, b)]
            return f"is not {' and '.join(broken)}" if broken else None
        if not isinstance(value, (str, os.PathLike)):
            return f"is {type(value).__name__}, not text"
        if cls.pattern is not None and not cls.pattern.match(os.fspath(value)):
            return "does not match"
        return cls.check(os.fspath(value)) if cls.path else None  # a path's own check (checked() sets it)


def number(name: str, base: type, doc: str, **bounds: float) -> type:
    """A number domain: ``gt`` / ``ge`` / ``lt`` / ``le`` bounds (floats are always finite)."""
    ops = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    restrictions = tuple((ops[k], v) for k, v in bounds.items())
    if base is float and not any(op in ("<", "<=") for op, _ in restrictions):
        restrictions += (("<", math.inf),)
    if base is float and not any(op in (">", ">=") for op, _ in restrictions):
        restrictions += ((">", -math.inf),)
    return type(name, (Domain,), {"base": base, "doc": doc, "restrictions": restrictions})


def text(name: str, pattern: str, doc: str) -> type:
    return type(name, (Domain,), {"doc": doc, "pattern": re.compile(pattern)})


def checked(name: str, check: Callable[[str], str | None], doc: str, folder: bool = False) -> type:
    """A path domain decided by ``check`` (a path that must exist, a folder one can write in)."""
    return type(name, (Domain,), {"doc": doc, "check": staticmethod(check), "path": True, "folder": folder})


class PowerOfTwo(Domain):
    base, doc = int, "a power of two: 1, 2, 4, 8, ..."
    restrictions = ((">=", 1), ("<=", 2**20))

    @classmethod
    def reason(cls, value: Any) -> str | None:
        why = super().reason(value)
        return why or (None if int(value) & (int(value) - 1) == 0 else "is not a power of two")


_INT64 = 2**63
# ---- numbers -----------------------------------------------------------------------------------------------
PositiveInt = number("PositiveInt", int, "an integer >= 1", gt=0, lt=_INT64)
NonNegativeInt = number("NonNegativeInt", int, "an integer >= 0", ge=0, lt=_INT64)
AtLeastTwo = number("AtLeastTwo", int, "an integer >= 2", ge=2, lt=_INT64)
SampleLength = number("SampleLength", int, "an integer in [0, 1000000] (bytes)", ge=0, le=1_000_000)
NewTokens = number("NewTokens", int, "an integer in [0, 100000000] (tokens)", ge=0, le=100_000_000)
NSSteps = number("NSSteps", int, "an integer in [0, 100)", ge=0, lt=100)  # torch.optim.Muon's bound
ShardTokens = number("ShardTokens", int, "an integer >= 65536 (tokens)", ge=65_536, lt=_INT64)
Seed = number("Seed", int, "an integer in [0, 2**32) (numpy's seed range)", ge=0, lt=2**32)
Positive = number("Positive", float, "a finite number > 0", gt=0.0)
NonNegative = number("NonNegative", float, "a finite number >= 0", ge=0.0)
Finite = number("Finite", float, "a finite number")
# One domain for every learning rate, from a module's setting to an optimizer's param group: torch's (>= 0; 0
# freezes), bounded where no optimizer here trains (1e30 trained to nonsense, exit 0)
LearningRate = number("LearningRate", float, "a learning rate in [0, 10]", ge=0.0, le=10.0)
PeakFlops = number("PeakFlops", float, "FLOP/s, >= 1e9 (e.g. 312e12, not 312)", ge=1e9)
TimeoutSeconds = number("TimeoutSeconds", float, "a finite number of seconds >= 1", ge=1.0)
UnitInterval = number("UnitInterval", float, "a number in [0, 1]", ge=0.0, le=1.0)
OpenUnitInterval = number("OpenUnitInterval", float, "a number in (0, 1)", gt=0.0, lt=1.0)
HalfOpenUnitInterval = number("HalfOpenUnitInterval", float, "a number in [0, 1)", ge=0.0, lt=1.0)
# ---- text --------------------------------------------------------------------------------------------------
# Any text a terminal can hand over as UTF-8 (bytes that are not UTF-8 reach Python as lone surrogates).
Text = text("Text", r"^[^\ud800-\udfff]*$", "any UTF-8 text")
NonEmptyText = text(
    "NonEmptyText", r"^[^\ud800-\udfff]*[^\s\ud800-\udfff][^\ud800-\udfff]*$", "a non-empty string"
)
FileSuffix = text(
    "FileSuffix",
    r"^(?!\.bin$)\.[^./\\\s]+$",
    "a text file's name suffix with its dot, e.g. '.py' (not .bin: .bin files are read as token shards)",
)
TorchDevice = text(
    "TorchDevice", r"^(cpu|cuda|mps|xpu|hpu|meta)(:[0-9]+)?$", "a device such as 'cpu' or 'cuda:0'"
)


# ---- paths -------------------------------------------------------------------------------------------------
def _local_path(value: str) -> str | None:
    return "names nothing (an empty path)" if not value.strip() else None


def _existing(value: str) -> str | None:
    return _local_path(value) or (None if Path(value).expanduser().exists() else "does not exist")


def _writable_folder(value: str) -> str | None:
    return _local_path(value) or unwritable_reason(value, folder=True)


def _safetensors_file(value: str) -> str | None:
    path = Path(value).expanduser()
    if path.suffix != ".safetensors" or path.name == ".safetensors":  # (an empty path: names nothing)
        return _local_path(value) or "is not a file name ending in .safetensors (e.g. model.safetensors)"
    return "is a folder" if path.is_dir() else unwritable_reason(path, folder=False)


ExistingPath = checked("ExistingPath", _existing, "a file or folder that exists")
WritableFolder = checked(
    "WritableFolder", _writable_folder, "a folder this process can create or write in", folder=True
)
SafetensorsFile = checked(
    "SafetensorsFile",
    _safetensors_file,
    "a file name ending in .safetensors, in a folder this process can write",
)


def unwritable_reason(path: str | os.PathLike, folder: bool = True) -> str | None:
    """Why ``path`` - a folder to write in (``folder``), or a file to create or replace - cannot be written by this
    process, or None. The nearest existing ancestor is probed with a temporary file (``os.access`` says yes to root
    on a read-only folder)."""
    target = Path(path).expanduser().absolute()
    existing = next(p for p in (target, *target.parents) if p.exists())
    if existing != target and not existing.is_dir():
        return f"{str(existing)!r} is a file, so nothing can be created under it"
    if existing == target and folder and not target.is_dir():
        return "is a file, not a folder"
    where = existing if existing.is_dir() else existing.parent
    try:
        fd, probe = tempfile.mkstemp(prefix=".distlab-write-probe-", dir=where)
    except OSError as e:
        return f"cannot create files in {str(where)!r} ({e.strerror or type(e).__name__})"
    os.close(fd)
    os.unlink(probe)
    return None


DOMAINS: tuple[type, ...] = tuple(v for v in list(globals().values()) if isinstance(v, type) and issubclass(v, Domain)
                                  and v is not Domain)  # fmt: skip
# Names a user may give as a checkpoint to resume from besides a path (Lightning's own).
CKPT_ALIASES = ("last", "best", "hpc", "registry")


class Checked(NamedTuple):
    """``Annotated[T, Checked("by what")]``: a structured value whose parts are checked where it is used (an
    optimizer's param groups, by ``DistMuonAdamW.add_param_group``)."""

    by: str


# ---- describing and checking a type ------------------------------------------------------------------------
def _is_union(tp: Any) -> bool:
    return get_origin(tp) is Union or isinstance(tp, types.UnionType)


def is_domain(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, Domain)


def describe(tp: Any, python: bool = False) -> str:
    """A type's domain in words (``Positive | None`` -> "a finite number > 0, or null"; ``python``: "or None")."""
    if is_domain(tp):
        return tp.doc
    if tp is Callable or get_origin(tp) is Callable:
        return "a function (any callable)" if python else "a function's import path (module.function)"
    if tp is timedelta:
        return "a positive duration up to 365 days"
    if tp is type(None):
        return "None" if python else "null"
    if tp is bool:
        return "True or False" if python else "true or false"
    origin, args = get_origin(tp), get_args(tp)
    if origin is typing.Annotated:
        return describe(args[0], python)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args) if len(args) > 1 else repr(args[0])
    if origin is dict or tp is dict:
        return "a mapping such as {'hours': 1}"
    if _is_union(tp):
        return ", or ".join(describe(a, python) for a in args)
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        inner = [a for a in args if a is not Ellipsis]
        if origin is tuple and inner and Ellipsis not in args:
            return f"a list of {len(inner)}: " + ", ".join(describe(a, python) for a in inner)
        return "a list whose items are each " + describe(inner[0], python) if inner else "a list"
    return f"a {getattr(tp, '__name__', str(tp))}"


def conforms(tp: Any, value: Any) -> bool:
    """Whether ``value`` (as Python code passes it) lies in the domain ``tp`` declares."""
    if tp is Any or tp is inspect.Parameter.empty:
        return True
    if tp is type(None) or tp is None:
        return value is None
    if _is_union(tp):
        return any(conforms(a, value) for a in get_args(tp))
    origin, args = get_origin(tp), get_args(tp)
    if origin is typing.Annotated:
        return conforms(args[0], value)
    if origin is Literal:  # (True is not the number 1)
        return any(value == a and isinstance(value, type(a)) and isinstance(value, bool) == isinstance(a, bool)
                   for a in args)  # fmt: skip
    if is_domain(tp):
        if tp.base in (int, float) and isinstance(value, str):  # from Python a number is a number
            return False
        return tp.reason(value) is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is timedelta:
        return isinstance(value, timedelta) and timedelta(0) < value <= timedelta(days=365)
    if tp in (int, float):
        return isinstance(value, (int, float) if tp is float else int) and not isinstance(value, bool)
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(args[0], v) for v in value)
        return len(value) == len(args) and all(conforms(a, v) for a, v in zip(args, value, strict=True))
    if origin in (list, Sequence):
        return isinstance(value, (list, tuple)) and (not args or all(conforms(args[0], v) for v in value))
    if origin is dict or tp is dict:
        return isinstance(value, Mapping) and (
            len(args) != 2 or all(conforms(args[1], v) for v in value.values())
        )
    if origin is not None and getattr(origin, "__module__", "") == "collections.abc":
        return origin is not Callable or callable(value)  # Iterable[...] etc.: not checked further
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True  # a string forward reference, a TypeVar: not ours to check


def refusal(key: str, value: Any, tp: Any, python: bool = False) -> str:
    """The one line that refuses ``key=value`` outside the domain ``tp``: what, the value seen, what to set."""
    reason = _why(tp, value)
    if reason is None and isinstance(value, str) and python and any(is_domain(m) and m.base is not str
                                                                   for m in (get_args(tp) or (tp,))):  # fmt: skip
        reason = f"it is the str {value!r}, not a number"
    shown = value if isinstance(value, str) and value.strip() and value.isprintable() else repr(value)
    shown = abbreviated(str(value) if isinstance(value, timedelta) else str(shown))
    said = f" ({reason})" if reason else ""
    return f"{key}={shown} is not accepted{said}; set {key} to {describe(tp, python)}"


def _why(tp: Any, value: Any) -> str | None:
    """The words of a text domain's own check for ``value`` (a path that does not exist), also for an item of a
    list; None where the domain in words says enough."""
    if _is_union(tp):
        return next((why for member in get_args(tp) if (why := _why(member, value))), None)
    if is_domain(tp) and tp.path and isinstance(value, (str, os.PathLike)):
        return tp.check(os.fspath(value))
    if get_origin(tp) in (list, tuple, Sequence) and isinstance(value, (list, tuple)) and get_args(tp):
        inner = get_args(tp)[0]
        return next((f"{item!r} {why}" for item in value if (why := _why(inner, item))), None)
    return None


@functools.cache
def _hints(fn: Callable) -> dict[str, Any]:
    return typing.get_type_hints(fn)


def check_domains(
    fn: Callable, values: Mapping[str, Any], owner: str | None = None, python: bool = True
) -> None:
    """Refuse (one-line ConfigError) an argument of ``fn`` outside the domain its annotation declares.

    Call it first thing in ``__init__`` with ``locals()``: ``check_domains(MyClass.__init__, locals())``."""
    hints = _hints(fn)
    owner = owner or fn.__qualname__.rsplit(".", 1)[0]
    for name, param in inspect.signature(fn).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or name not in values:
            continue
        tp = hints.get(name, Any)
        if not conforms(tp, values[name]):
            raise ConfigError(f"{owner}: {refusal(name, values[name], tp, python=python)}")
