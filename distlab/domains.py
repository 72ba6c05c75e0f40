"""Every setting's valid values, declared once in its type.

A parameter of a class distlab ships is annotated with the set of values it accepts - a restricted type
below, ``Literal[...]``, ``bool``, or ``X | None`` of those. That one declaration is enforced twice:

- by the CLI's parser (jsonargparse reads the annotations): ``distlab fit --model.weight_decay=-1`` is one
  line and exit 2 before any folder, file or process exists;
- by :func:`check_domains` when the class is built from Python (``GPTLightningModule(weight_decay=-1)``
  raises a one-line :class:`~distlab.errors.ConfigError`).

``tests/cli/test_domains.py`` walks the signature of every shipped class and subcommand: a parameter
without a declared domain fails it, and every parameter is fed values outside its domain (derived from the
type, not listed) through the real CLI. A new parameter joins those checks by being annotated.

Example::

    from distlab.domains import Positive, UnitInterval, check_domains

    class MyCallback(L.Callback):
        def __init__(self, every_n_steps: PositiveInt = 10, ratio: UnitInterval = 0.5) -> None:
            check_domains(MyCallback.__init__, locals())
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import inspect
import math
import os
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from jsonargparse.typing import (
    extend_base_type,
    register_type,
    restricted_number_type,
    restricted_string_type,
)

from distlab.compat import restricted_parts
from distlab.errors import ConfigError, abbreviated


def _plain(tp: type, path: bool = False, folder: bool = False) -> type:
    """Have the parser check values against ``tp`` but hand out plain int / float / str: an instance of a
    restricted type (an int subclass) would be pickled into checkpoints by class name, and
    ``torch.load(weights_only=True)`` refuses to load such a class. A ``path`` type hands out its value with
    ``~`` expanded (as a shell would: a config file and ``--x=~/y`` are read by no shell); a ``folder`` to create
    with ``..`` resolved first (``os.makedirs("typo/../run")`` would leave an empty ``typo`` behind)."""
    base = restricted_parts(tp)["base"]

    def check_and_strip(value: Any) -> Any:
        plain = base(tp(value))
        plain = os.path.expanduser(plain) if path else plain
        return os.path.normpath(plain) if folder else plain

    register_type(tp, base, deserializer=check_and_strip, fail_already_registered=False)  # (True before 4.34)
    return tp


_INT64 = 2**63


def _not_a_power(value: Any) -> None:
    raise ValueError(f"{value} is not a power of two")


# ---- numbers -----------------------------------------------------------------------------------------
# (Each domain's restrictions differ from jsonargparse's own types of the same meaning, which it registers
# by their restrictions; every float domain here is finite - jsonargparse's PositiveFloat accepts inf.)
PositiveInt = _plain(
    restricted_number_type("PositiveInteger", int, [(">", 0), ("<", _INT64)], docstring="an integer >= 1")
)
NonNegativeInt = _plain(
    restricted_number_type("NonNegativeInteger", int, [(">=", 0), ("<", _INT64)], docstring="an integer >= 0")
)
AtLeastTwo = _plain(restricted_number_type("AtLeastTwo", int, [(">=", 2)], docstring="an integer >= 2"))
PowerOfTwo = _plain(
    extend_base_type(
        "PowerOfTwo",
        int,
        lambda cls, v: (
            None if int(v) >= 1 and int(v) & (int(v) - 1) == 0 and int(v) <= 2**20 else _not_a_power(v)
        ),
        docstring="a power of two: 1, 2, 4, 8, ...",
    )
)
SampleLength = _plain(  # distlab generate's output: a screenful to a book, not a run that never ends
    restricted_number_type(
        "SampleLength", int, [(">=", 0), ("<=", 1_000_000)], docstring="an integer in [0, 1000000] (bytes)"
    )
)
NewTokens = _plain(  # GPT.generate from Python: past 10**8 (10**30, a value meant for another setting) it samples for ever
    restricted_number_type(
        "NewTokens", int, [(">=", 0), ("<=", 100_000_000)], docstring="an integer in [0, 100000000] (tokens)"
    )
)
NSSteps = _plain(  # Newton-Schulz iterations (torch.optim.Muon's bound)
    restricted_number_type("NSSteps", int, [(">=", 0), ("<", 100)], docstring="an integer in [0, 100)")
)
ShardTokens = (
    _plain(  # distlab prepare's shard size: below 2**16 a shard is mostly header (10 wrote 4,000 files)
        restricted_number_type(
            "ShardTokens", int, [(">=", 65_536), ("<", _INT64)], docstring="an integer >= 65536 (tokens)"
        )
    )
)
Port = _plain(restricted_number_type("Port", int, [(">=", 1), ("<=", 65535)], docstring="a port in 1..65535"))
Seed = _plain(
    restricted_number_type(
        "Seed", int, [(">=", 0), ("<", 2**32)], docstring="an integer in [0, 2**32) (numpy's seed range)"
    )
)
Positive = _plain(
    restricted_number_type("Positive", float, [(">", 0.0), ("<", math.inf)], docstring="a finite number > 0")
)
LearningRate = (
    _plain(  # above 10 no optimizer here trains (1e30 was accepted and trained to nonsense, exit 0)
        restricted_number_type(
            "LearningRate", float, [(">", 0.0), ("<=", 10.0)], docstring="a learning rate in (0, 10]"
        )
    )
)
PeakFlops = _plain(  # FLOP/s of one device: below 1e9 it is a figure in TFLOP/s (312 for an A100), not FLOP/s
    restricted_number_type(
        "PeakFlops", float, [(">=", 1e9), ("<", math.inf)], docstring="FLOP/s, >= 1e9 (e.g. 312e12, not 312)"
    )
)
TimeoutSeconds = (
    _plain(  # a process group's timeout: below a second, any wait (a validation, a slow rank) fails
        restricted_number_type(
            "TimeoutSeconds",
            float,
            [(">=", 1.0), ("<", math.inf)],
            docstring="a finite number of seconds >= 1",
        )
    )
)
NonNegative = _plain(
    restricted_number_type(
        "NonNegative", float, [(">=", 0.0), ("<", math.inf)], docstring="a finite number >= 0"
    )
)
Finite = _plain(
    restricted_number_type("Finite", float, [(">", -math.inf), ("<", math.inf)], docstring="a finite number")
)
UnitInterval = _plain(
    restricted_number_type(
        "UnitInterval", float, [(">=", 0.0), ("<=", 1.0), ("<", math.inf)], docstring="a number in [0, 1]"
    )
)
OpenUnitInterval = _plain(
    restricted_number_type(
        "OpenFraction", float, [(">", 0.0), ("<", 1.0), ("<", math.inf)], docstring="a number in (0, 1)"
    )
)
HalfOpenUnitInterval = _plain(
    restricted_number_type(
        "HalfOpenUnitInterval", float, [(">=", 0.0), ("<", 1.0)], docstring="a number in [0, 1)"
    )
)
FractionOfEpoch = _plain(  # Lightning's val_check_interval as a fraction of an epoch
    restricted_number_type(
        "FractionOfEpoch", float, [(">", 0.0), ("<=", 1.0)], docstring="a number in (0, 1]"
    )
)
# ---- text --------------------------------------------------------------------------------------------
# Any text a terminal can hand over as UTF-8 (bytes that are not UTF-8 reach Python as lone surrogates).
Text = _plain(restricted_string_type("Text", r"^[^\ud800-\udfff]*$", docstring="any UTF-8 text"))
NonEmptyText = _plain(
    restricted_string_type(
        "NonEmptyText",
        r"^[^\ud800-\udfff]*[^\s\ud800-\udfff][^\ud800-\udfff]*$",
        docstring="a non-empty string",
    )
)
FileSuffix = _plain(
    restricted_string_type(
        "FileSuffix",
        r"^(?!\.bin$)\.[^./\\\s]+$",
        docstring="a text file's name suffix with its dot, e.g. '.py' (not .bin: .bin files are read as token shards)",
    )
)

Duration = _plain(  # Lightning's max_time / val_check_interval as text
    restricted_string_type(
        "Duration", r"^(?!0+:0+:0+:0+$)\d+:\d+:\d+:\d+$", docstring="a duration 'DD:HH:MM:SS' > 0"
    )
)
DeviceText = _plain(  # Lightning's devices as text
    restricted_string_type(
        "DeviceText",
        r"^\s*(-1|[1-9]\d{0,4}|\d{1,5}(\s*,\s*\d{1,5})*\s*,?)\s*$",  # (a count, indices: up to 5 digits)
        docstring="a count or device indices as text ('2', '0,1')",
    )
)

TorchDevice = _plain(  # a torch device as text
    restricted_string_type(
        "TorchDevice",
        r"^(cpu|cuda|mps|xpu|hpu|meta)(:[0-9]+)?$",
        docstring="a device such as 'cpu' or 'cuda:0'",
    )
)


def _no_variables(value: Any) -> None:
    if re.search(r"\$\{?[A-Za-z_]", str(value)):
        raise ValueError("it holds an unexpanded environment variable: a config file is not read by a shell")
    if os.sep == "/" and (re.match(r"^[A-Za-z]:[\\/]", str(value)) or "\\" in str(value)):
        raise ValueError(
            "it is a Windows path (a drive letter or backslashes); write it with / as this system does"
        )
    if str(value) != str(value).strip():
        raise ValueError("it begins or ends with whitespace (a stray space inside the quotes?); remove it")
    if any(ord(c) < 32 for c in str(value)):
        raise ValueError(
            "it holds a newline or another control character (a paste from two lines?); remove it"
        )
    if re.match(r"^[A-Za-z][\w+.-]*://", str(value)):
        raise ValueError(
            "it is a URL; distlab reads and writes local paths: mount the storage (or copy the file) and give that path"
        )


def _existing_path(cls: type, value: Any) -> None:
    if not str(value).strip():
        raise ValueError("an empty path names nothing")
    _no_variables(value)
    if not Path(str(value)).expanduser().exists():
        listed = str(value).startswith("[") and str(value).endswith("]")
        raise ValueError(
            "does not exist (it is written as a list: give its items as separate words)"
            if listed
            else "does not exist"
        )


def _writable_folder(cls: type, value: Any) -> None:
    if not str(value).strip():
        raise ValueError("an empty path names nothing")
    _no_variables(value)
    try:
        where = Path(str(value)).expanduser().resolve()
    except (RuntimeError, OSError):  # a symbolic-link loop (RuntimeError before Python 3.13)
        where = None  # unwritable_reason names the link
    if where == Path(Path.cwd().anchor):
        raise ValueError(
            "it is the filesystem root (an empty variable before a '/'?); name a folder for the run"
        )
    problem = unwritable_reason(str(value), folder=True)
    if problem:
        raise ValueError(problem)


def _safetensors_file(cls: type, value: Any) -> None:
    _no_variables(value)
    path = Path(str(value)).expanduser()
    if path.name == ".safetensors":  # (Path's suffix of a dot-file is empty)
        raise ValueError("it has no file name before .safetensors; write e.g. model.safetensors")
    if path.suffix != ".safetensors":
        raise ValueError("does not end in .safetensors")
    if path.is_dir():
        raise ValueError("is a folder")
    problem = unwritable_reason(path, folder=False)
    if problem:
        raise ValueError(problem)


ExistingPath = _plain(
    extend_base_type("ExistingPath", str, _existing_path, docstring="a file or folder that exists"), path=True
)
WritableFolder = _plain(
    extend_base_type(
        "WritableFolder", str, _writable_folder, docstring="a folder this process can create or write in"
    ),
    path=True,
    folder=True,
)
SafetensorsFile = _plain(
    extend_base_type(
        "SafetensorsFile",
        str,
        _safetensors_file,
        docstring="a file name ending in .safetensors, in a folder this process can write",
    ),
    path=True,
)


def _file_name(cls: type, value: Any) -> None:
    text = str(value)
    if not text.strip():
        raise ValueError("an empty name names no file")
    _no_variables(value)
    if Path(text).is_absolute() or ".." in Path(text).parts:
        raise ValueError("it leaves its folder; the folder is set by its own setting (dirpath, save_dir)")


FileName = _plain(
    extend_base_type(
        "FileName", str, _file_name, docstring="a file name inside its folder (not absolute, no '..')"
    )
)


def _checkpoint_file_name(cls: type, value: Any) -> None:
    """A ModelCheckpoint file-name template: a file name whose ``{name}`` / ``{name:spec}`` fields format as
    Lightning formats them (its own steps: find the fields, index the metrics by name, ``str.format``)."""
    _file_name(cls, value)
    text = str(value)
    fields = re.findall(r"(\{.*?)[:\}]", text)
    template = text
    for field in sorted(fields, key=len, reverse=True):
        template = template.replace(field, f"{{0[{field[1:]}]")
    try:
        template.format({field[1:]: 0 for field in fields})
    except (ValueError, IndexError, KeyError) as e:
        raise ValueError(
            f"it is not a file-name template ({e}); write fields as {{name}} or {{name:.3f}}, e.g. '{{epoch}}-{{step}}'"
        ) from None


CheckpointFileName = _plain(
    extend_base_type(
        "CheckpointFileName",
        str,
        _checkpoint_file_name,
        docstring="a checkpoint file-name template inside its folder, fields as {name} or {name:.3f}",
    )
)

# Names a user may give as a checkpoint to resume from besides a path (Lightning's own).
CKPT_ALIASES = ("last", "best", "hpc", "registry")

TEXT_DURATIONS: tuple[Any, ...] = (
    Duration,
)  # text durations: beside one, a timedelta comes from Python only
_PYTHON_TIMEDELTA = object()  # a timedelta beside a text duration: only Python passes one
DESCRIPTIONS: dict[Any, str] = {
    _PYTHON_TIMEDELTA: "a datetime.timedelta in Python",
    timedelta: "a positive duration up to 365 days ('H:MM:SS' in a config or on the command line; a "
    "datetime.timedelta in Python)",
}


def broken_link_reason(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be reached through a symbolic link on its way (one to nothing, or one that leads back to
    itself), or None. ``exists()`` says only "no" for both, which reads as "not found"."""
    target = Path(path).expanduser().absolute()
    dangling = next(
        (p for p in (*reversed(target.parents), target) if p.is_symlink() and not p.exists()), None
    )
    if dangling is None:
        return None
    try:
        os.stat(dangling)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return (
                f"{str(dangling)!r} is a symbolic link that leads back to itself ({os.readlink(dangling)} ...); "
                "fix or remove the link"
            )
    return (
        f"{str(dangling)!r} is a symbolic link to nothing ({os.readlink(dangling)}); fix or remove the link"
    )


def unwritable_reason(path: str | os.PathLike, folder: bool = True) -> str | None:
    """Why ``path`` - a folder to write in (``folder``), or else a file to create or replace - cannot be written
    by this process, or None if it can.

    The nearest existing ancestor must be a folder in which a file can really be created (probed with a
    temporary file that is removed at once: ``os.access`` says yes to root on a read-only or immutable folder)."""
    target = Path(path).expanduser().absolute()
    try:
        broken = broken_link_reason(target)
        if broken is not None:  # exists() says no, and creating it fails with "File exists"
            return broken
        existing = next(p for p in (target, *target.parents) if p.exists())
    except OSError as e:  # ENAMETOOLONG and the like: the OS refuses the name itself
        return f"the system refuses the name ({e.strerror or type(e).__name__})"
    if existing != target and not existing.is_dir():
        return f"{str(existing)!r} is a file, so nothing can be created under it"
    if existing == target and folder and not target.is_dir():
        return "it is a file, not a folder"
    folder = existing if existing.is_dir() else existing.parent
    try:
        fd, probe = _mkstemp(folder)
    except OSError as e:
        return f"cannot create files in {str(folder)!r} ({e.strerror or type(e).__name__})"
    os.close(fd)
    os.unlink(probe)
    return None


def _mkstemp(folder: Path) -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(prefix=".distlab-write-probe-", dir=folder)


# ---- describing and checking a type --------------------------------------------------------------------


def describe(tp: Any, python: bool = False) -> str:
    """A type's domain in words: ``Positive | None`` -> "a finite number > 0, or null" - in a config's words, or
    (``python``) in Python's: "a finite number > 0, or None", a function rather than its import path."""
    if isinstance(tp, Rule):
        return tp.wanted
    if tp is Callable or get_origin(tp) is Callable:
        return "a function (any callable)" if python else "a function's import path (module.function)"
    if tp in DESCRIPTIONS:
        return DESCRIPTIONS[tp]
    if tp is type(None):
        return "None" if python else "null"
    if tp is bool:
        return "True or False" if python else "true or false"
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args) if len(args) > 1 else repr(args[0])
    if origin is dict or tp is dict:
        return "a dict such as {'hours': 1}" if python else "a mapping such as {'hours': 1}"
    if _is_union(tp):
        if timedelta in args and any(a in TEXT_DURATIONS for a in args):  # the text form is the member's own
            args = tuple(a for a in args if a is not timedelta) + (_PYTHON_TIMEDELTA,)
        return ", or ".join(describe(a, python) for a in args)
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        inner = [a for a in args if a is not Ellipsis]
        if origin is tuple and inner and Ellipsis not in args:
            if len(set(inner)) == 1:
                return f"a list of {len(inner)} values, each {describe(inner[0], python)}"
            return f"a list of {len(inner)}: " + ", ".join(describe(a, python) for a in inner)
        return "a list whose items are each " + describe(inner[0], python) if inner else "a list"
    doc = getattr(tp, "__doc__", None) if is_restricted(tp) else None
    if doc:
        return doc.strip()
    if python and isinstance(tp, type):
        return f"a {public_name(tp)}"
    return getattr(tp, "__name__", str(tp))


def public_name(cls: type) -> str:
    """A class by the shortest import path that exports it (``torch.dtype``, ``torch.nn.Module``; distlab's and
    built-in classes by their name alone)."""
    import sys

    if cls.__module__ in ("builtins",) or cls.__module__.startswith("distlab"):
        return cls.__name__
    parts = cls.__module__.split(".")
    for n in range(1, len(parts) + 1):
        module = sys.modules.get(".".join(parts[:n]))
        if module is not None and getattr(module, cls.__name__, None) is cls:
            return f"{'.'.join(parts[:n])}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__name__}"


def is_restricted(tp: Any) -> bool:
    """A type made by jsonargparse's restricted_number_type / restricted_string_type / extend_base_type."""
    return bool(restricted_parts(tp))


def _is_union(tp: Any) -> bool:
    return get_origin(tp) is Union or isinstance(tp, types.UnionType)


def conforms(tp: Any, value: Any) -> bool:
    """Whether ``value`` (as Python code passes it) lies in the domain ``tp`` declares."""
    if tp is Any or tp is inspect.Parameter.empty:
        return True
    if isinstance(tp, Rule):
        return tp.ok(value)
    if tp is type(None) or tp is None:
        return value is None
    if _is_union(tp):
        return any(conforms(a, value) for a in get_args(tp))
    origin, args = get_origin(tp), get_args(tp)
    if origin is typing.Annotated:
        return conforms(args[0], value)
    if origin is Literal:  # (a str enum member counts as its text; True is not the number 1)
        return any(
            value == a and isinstance(value, type(a)) and isinstance(value, bool) == isinstance(a, bool)
            for a in args
        )
    if is_restricted(tp):
        base = restricted_parts(tp)["base"]
        if base is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return False
        if base is int and (isinstance(value, bool) or not isinstance(value, int)):
            return False
        if base is str and not isinstance(value, (str, os.PathLike)):
            return False
        try:
            tp(os.fspath(value) if isinstance(value, os.PathLike) else value)
        except (ValueError, TypeError):
            return False
        return True
    if tp is bool:
        return isinstance(value, bool)
    if tp is timedelta:
        return isinstance(value, timedelta) and timedelta(0) < value <= timedelta(days=365)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(args[0], v) for v in value)
        return len(value) == len(args) and all(conforms(a, v) for a, v in zip(args, value, strict=True))
    if origin in (list, Sequence):
        return isinstance(value, (list, tuple)) and all(conforms(args[0], v) for v in value) if args else True
    if origin is dict or tp is dict:
        return isinstance(value, Mapping) and (
            len(args) != 2 or all(conforms(args[1], v) for v in value.values())
        )
    if origin is not None and callable(origin) and origin.__module__ == "collections.abc":
        return origin is not Callable or callable(value)  # Iterable[...] etc.: not checked further
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True  # a type we cannot check here (a string forward reference, a TypeVar): the parser does


@functools.cache
def _hints(fn: Callable) -> dict[str, Any]:
    return typing.get_type_hints(fn)


def why_not(tp: Any, value: Any) -> str | None:
    """The reason a check of its own words gives (a path type: "'/x' does not exist"), or None."""
    members = get_args(tp) if _is_union(tp) else (tp,)
    for member in members:
        parts = restricted_parts(member)
        if (
            parts
            and parts["restrictions"] is None
            and parts["regex"] is None
            and not (
                isinstance(value, (list, tuple)) and len(members) > 1
            )  # a list: its list member says why
        ):  # a check of its own (a path type)
            if parts["base"] is str and not isinstance(
                value, (str, os.PathLike)
            ):  # its check would read str(value)
                kind = type(value).__name__
                return (
                    f"it is {'bytes' if isinstance(value, bytes) else ('an ' if kind[0] in 'aeiou' else 'a ') + kind}, not a str"
                    + (": decode it first (value.decode())" if isinstance(value, bytes) else "")
                )
            try:
                member(value)
            except (ValueError, TypeError) as e:
                return str(e)
        elif get_origin(member) in (list, tuple) and isinstance(value, (list, tuple)):
            inner = [a for a in get_args(member) if a is not Ellipsis]
            for item in value if len(set(inner)) == 1 else ():
                reason = why_not(inner[0], item)
                if reason:
                    return f"{item!r} {reason}"
    return None


def refusal(key: str, value: Any, tp: Any, reason: str | None = None, python: bool = False) -> str:
    """The one line that refuses ``key=value`` outside the domain ``tp``: what, the value seen, what to set (in a
    config's words, or in Python's: ``python``)."""
    wanted = describe(tp, python)
    reason = reason or why_not(tp, value)
    if not reason and re.search(r"\$\{?[A-Za-z_]", str(value)):  # ${HOME} in flow YAML is not even a list
        reason = "it holds an unexpanded environment variable: a config file is not read by a shell"
    if (
        not reason and "{" in str(value) and re.search(r"[{,]\s*[\w.-]+:[^\s/]", str(value))
    ):  # {0:2}: YAML reads one key "0:2"
        reason = (
            "YAML needs a space after each ':' in a mapping, so {0:2} is the single key '0:2'; write {0: 2}"
        )
    reason = (
        reason
        or _class_spec_problem(value)
        or _one_item_for_a_list(tp, value)
        or _settings_for_a_class(tp, value)
    )
    number = float(value) if isinstance(value, str) and _numeric(value) else value
    whole = isinstance(number, float) and math.isfinite(number) and number.is_integer()
    if not reason and whole and conforms(tp, int(number)):  # 2.0 where a count of 2 is accepted
        reason = f"a whole number written as a fraction: write {int(number)} for a count"
    elif not reason and whole and _a_percent(tp, value):
        reason = f"a share, not a percent: {float(value):g} means {float(value) / 100:g}"
    shown = value if isinstance(value, str) and value.strip() and value.isprintable() else repr(value)
    if isinstance(value, timedelta):
        shown = str(value)
    shown = abbreviated(str(shown))  # a line, not a page: the start and the end of a long value
    if reason:  # a check with its own words (a path that does not exist)
        return f"{key}={shown} is not accepted ({reason}); set {key} to {wanted}"
    return f"{key}={shown} is not accepted; set {key} to {wanted}"


def _settings_for_a_class(tp: Any, value: Any) -> str | None:
    """A dict where a settings class belongs (``GPT({"depth": 2})``): say how to build one from it."""
    if isinstance(value, Mapping) and isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return f"a dict of settings, not a {tp.__name__}: build one with {tp.__name__}(**settings)"
    return None


def _one_item_for_a_list(tp: Any, value: Any) -> str | None:
    """One item where a list is declared (``--data.paths=/a/file``): say the brackets it needs."""
    members = (
        [m for m in get_args(tp) if m is not type(None)]
        if get_origin(tp) in (Union, types.UnionType)
        else [tp]
    )
    lists = [m for m in members if get_origin(m) is list and get_args(m)]
    if not lists or not isinstance(value, str) or value.strip().startswith("["):
        return None
    if any(conforms(get_args(m)[0], value) for m in lists):
        return f"a list is expected, and this is one item: write [{value}]"
    return next((why for m in lists if (why := why_not(get_args(m)[0], value))), None)


def class_path_problem(path: str) -> str | None:
    """Why ``path`` names no class, in the user's terms (``pytorch_lightning.…``, a trailing ``()``, a module, a
    function), or None when it imports as a class."""
    import importlib

    if path.endswith(")"):
        return f"class_path {path} ends in '()': name the class without calling it ({path.split('(')[0]})"
    head = path.split(".")[0]
    if (
        head == "pytorch_lightning"
    ):  # the standalone package: not installed, or its classes are not lightning's
        return (
            f"distlab runs on the lightning package, and pytorch_lightning's classes are another package's: write "
            f"{path.replace('pytorch_lightning', 'lightning.pytorch', 1)}"
        )
    try:
        found = importlib.import_module(path)
        public = getattr(found, "__all__", None) or [n for n in vars(found) if not n.startswith("_")]
        names = sorted(n for n in public if isinstance(getattr(found, n, None), type))[:3]
        return (
            f"{path} is a module, not a class: name a class in it ({', '.join(f'{path}.{n}' for n in names)})"
        )
    except ImportError:
        pass
    module, _, name = path.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None  # the parser's own words say it does not import
    if not isinstance(obj, type):
        return f"{path} is a {type(obj).__name__}, not a class: give a class's import path"
    return None


def _class_spec_problem(value: Any) -> str | None:
    """A class spec (``{class_path: ..., init_args: ...}``) anywhere in ``value`` whose init_args is not a mapping
    of option names to values (a list, a number): the union's refusal alone does not say which part is wrong."""
    if isinstance(value, str) and ("init_args" in value or "class_path" in value):
        import yaml

        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            return None
    if isinstance(value, (list, tuple)):
        return next((r for r in map(_class_spec_problem, value) if r), None)
    if not hasattr(value, "get") or not hasattr(value, "keys"):
        return None
    init = value.get("init_args")
    path = value.get("class_path") if "class_path" in value.keys() else None
    if isinstance(path, str) and path:
        why = class_path_problem(path)
        if why:
            return why
    if "class_path" in value.keys() and init is not None and not hasattr(init, "keys"):
        name = str(value.get("class_path")).rsplit(".", 1)[-1]
        return (
            f"the init_args of {name} must be a mapping of its options (option: value), not {init!r}; "
            f"write init_args: {{OPTION: VALUE}}"
        )
    return None


def _a_percent(tp: Any, value: Any) -> bool:
    """A share (a domain inside [0, 1]) given as a percent: 10 where 0.1 was meant."""
    if isinstance(value, str) and _numeric(value):
        value = float(value)
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and 1 < value <= 100
        and conforms(tp, value / 100)
        and not conforms(tp, 1.5)
    )


def check_domains(
    fn: Callable, values: Mapping[str, Any], owner: str | None = None, python: bool = True
) -> None:
    """Refuse (one-line ConfigError) an argument of ``fn`` outside the domain its annotation declares, in Python's
    words (``python=False``: a command's options, in a config's words).

    Call it first thing in ``__init__`` with ``locals()``: ``check_domains(MyClass.__init__, locals())``."""
    hints = _hints(fn)
    owner = owner or fn.__qualname__.rsplit(".", 1)[0]
    for name, param in inspect.signature(fn).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or name not in values:
            continue
        tp = hints.get(name, Any)
        value = values[name]
        if not conforms(tp, value):
            reason = None
            if isinstance(value, str) and _numeric(value) and not why_not(tp, value):
                reason = f"it is the str {value!r}, not a number"  # from Python: "0.02" read from a file or os.environ
            raise ConfigError(f"{owner}: {refusal(name, value, tp, reason, python)}")


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# ---- what counts as a declared domain --------------------------------------------------------------------
# Types whose every value is meaningful, or that the parser checks by their own rules (a class path must name
# a subclass; a callable must import).
_OPEN_TYPES = (bool, type(None), timedelta)
_UNDECLARED = (int, float, str, dict, list, tuple, object, Any)


def is_declared(tp: Any) -> bool:
    """Whether ``tp`` says which values a parameter accepts (``int``, ``float``, ``str``, ``Any`` or no
    annotation do not: they admit -1, nan, '' ...)."""
    if tp is inspect.Parameter.empty or tp in _UNDECLARED:
        return False
    if tp in _OPEN_TYPES or is_restricted(tp) or isinstance(tp, Rule):
        return True
    origin, args = get_origin(tp), get_args(tp)
    if origin is typing.Annotated:
        return any(isinstance(a, Checked) for a in args[1:])
    if origin is Literal:
        return True
    if _is_union(tp) or origin in (list, tuple, Sequence):
        inner = [a for a in args if a is not Ellipsis]
        return bool(inner) and all(is_declared(a) for a in inner)
    if origin is dict:
        return len(args) == 2 and is_declared(args[1])
    if origin is not None and origin.__module__ == "collections.abc":
        return origin is Callable  # a callable: the parser imports it; Iterable[dict] and the like are not
    return isinstance(tp, type) and tp not in _UNDECLARED  # a class: only its subclasses / instances pass


@dataclasses.dataclass(frozen=True)
class Rule:
    """A domain a type cannot say: ``ok(value)`` decides, ``wanted`` says it in words ("a non-empty mapping
    {epoch: batches}"), ``outside`` lists values it refuses (the generated bad-input suite feeds them)."""

    ok: Callable[[Any], bool]
    wanted: str
    outside: tuple[Any, ...] = ()


class Checked:
    """``Annotated[T, Checked("by what")]``: a structured value whose parts are checked where it is used (an
    optimizer's param groups, by ``DistMuonAdamW.add_param_group``); the text says by what."""

    def __init__(self, by: str) -> None:
        self.by = by

    def __repr__(self) -> str:
        return f"Checked({self.by!r})"


def undeclared(fn: Callable) -> list[str]:
    """The parameters of ``fn`` (a class's ``__init__``, a command) whose annotation declares no domain."""
    hints = typing.get_type_hints(fn, include_extras=True)
    return [
        name
        for name, param in inspect.signature(fn).parameters.items()
        if name != "self"
        and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
        and not is_declared(hints.get(name, inspect.Parameter.empty))
    ]
