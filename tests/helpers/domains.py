"""What the generated bad-input suite walks, and the values it feeds: derived from the code, not listed.

- :func:`shipped_classes`: every public class of distlab's packages that a user configures (LightningModules,
  DataModules, callbacks, strategies, optimizers, metrics), found through each package's ``__all__``.
- :func:`outside_values`: values outside a declared domain, built from the type itself (a restriction
  ``v > 0`` gives 0 and -1; a float adds nan and inf; a Literal gives a name it lacks; a path type gives a
  missing path, a folder, an uncreatable place ...). A candidate that the parser itself accepts is kept only
  when distlab's own construction check is what refuses it (a zero timedelta).
- :func:`inside_value`: a value inside a domain (for the required arguments around the one under test).
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import lightning as L
import torch
import torch.distributed.device_mesh
import torchmetrics
from lightning.pytorch.strategies import Strategy

from distlab.domains import Checked
from distlab.domains import is_domain as is_restricted

CLI_BASES = (L.LightningModule, L.LightningDataModule, L.Callback, Strategy)
PYTHON_BASES = (*CLI_BASES, torch.optim.Optimizer, torchmetrics.Metric)


def shipped_classes() -> list[type]:
    """Every configurable class distlab exports (a new one joins by being exported)."""
    import distlab.callbacks
    import distlab.data
    import distlab.modules
    import distlab.optim
    import distlab.strategies

    found: list[type] = []
    for pkg in (distlab.modules, distlab.data, distlab.callbacks, distlab.strategies, distlab.optim):
        for name in pkg.__all__:
            obj = getattr(pkg, name)
            if isinstance(obj, type) and issubclass(obj, PYTHON_BASES) and obj not in found:
                found.append(obj)
    from distlab.models.gpt import GPTConfig

    return [*found, GPTConfig]  # the GPT's settings, as Python builds them (the module's are its own)


# the packages whose public functions a user calls with settings of their own (distlab.distributed is the
# collectives layer under the optimizers and strategies: its arguments are tensors and groups, not settings)
FUNCTION_PACKAGES = ("distlab", "distlab.data", "distlab.optim", "distlab.parallel", "distlab.strategies")


def shipped_functions() -> list[Any]:
    """Every public function of the packages users call (their ``__all__``), the CLI's function commands, the GPT's
    sampling and ``load_gpt``: a new one joins by being exported."""
    import importlib

    from distlab.checkpoint import load_gpt
    from distlab.cli.commands import FUNCTION_COMMANDS
    from distlab.models.gpt import GPT, GPTConfig

    found: list[Any] = []
    for name in FUNCTION_PACKAGES:
        pkg = importlib.import_module(name)
        for attr in pkg.__all__:
            obj = getattr(pkg, attr)
            if inspect.isfunction(obj) and obj not in found:
                found.append(obj)
    sampling = GPT(
        GPTConfig(depth=1, sequence_len=8, head_dim=16, aspect_ratio=32)
    ).generate  # a bound method
    return [*found, *FUNCTION_COMMANDS.values(), sampling, load_gpt]


def parameters(fn: Any) -> list[tuple[str, Any, Any]]:
    """(name, declared type, default) of each settable parameter of ``fn``."""
    hints = typing.get_type_hints(fn, include_extras=True)
    out = []
    for name, p in inspect.signature(fn).parameters.items():
        if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out.append((name, hints.get(name, inspect.Parameter.empty), p.default))
    return out


@dataclass
class Places:
    """Paths of every kind a path parameter can be handed."""

    missing: str
    a_file: str
    a_folder: str
    under_a_file: str
    uncreatable: str

    @classmethod
    def under(cls, d: Path) -> Places:
        """Each kind of place, made under the folder ``d``."""
        (d / "a_file").write_text("not a checkpoint, not a folder")
        (d / "a_folder").mkdir()
        return cls(
            missing=str(d / "missing" / "nothing"),
            a_file=str(d / "a_file"),
            a_folder=str(d / "a_folder"),
            under_a_file=str(d / "a_file" / "below"),
            uncreatable="/proc/distlab-cannot-create-here",
        )


def _unwrap(tp: Any) -> Any:
    return get_args(tp)[0] if get_origin(tp) is typing.Annotated else tp


def _is_union(tp: Any) -> bool:
    import types

    return get_origin(tp) is Union or isinstance(tp, types.UnionType)


def _number_candidates(tp: type) -> list[Any]:
    base = tp.base
    out: list[Any] = ["abc"]
    names = {">": "gt", ">=": "ge", "<": "lt", "<=": "le"}
    for op, ref in tp.restrictions:
        name = names[op]
        if math.isinf(ref):
            out.append(ref)
            continue
        step = 1 if base is int else 0.5
        if name in ("gt", "ge"):
            out += [ref - step] + ([ref] if name == "gt" else [])
        elif name in ("lt", "le"):
            out += [ref + step] + ([ref] if name == "lt" else [])
    if base is float:
        out += [math.nan, math.inf, -math.inf]
    else:
        out += [1.5]
    return out


def _path_candidates(tp: type, places: Places) -> list[Any]:
    name = tp.__name__
    if name == "ExistingPath":
        return [places.missing, ""]
    if name == "WritableFolder":
        return ["", places.a_file, places.under_a_file, places.uncreatable]
    if name == "FileName":
        return ["", "../outside.txt", places.a_folder + "/absolute.txt"]
    if name == "SafetensorsFile":
        return [places.a_folder, places.missing + ".pt", places.under_a_file + "/m.safetensors"]
    if name == "CheckpointFileName":
        return ["", "{step", "{step}-{val_loss:.3q}", "../x-{step}"]
    if name == "PowerOfTwo":
        return [0, 3, 6, -2, "abc"]
    raise AssertionError(f"no outside values known for the path type {name}: add them here")


def raw_candidates(tp: Any, places: Places) -> list[Any]:
    """Values built to break ``tp``'s rule (some may fall inside another member of a union: filtered later)."""
    tp = _unwrap(tp)
    if _is_union(tp):
        return [v for member in get_args(tp) for v in raw_candidates(member, places)]
    origin, args = get_origin(tp), get_args(tp)
    if tp is type(None):
        return []
    if tp is bool:
        return ["maybe", 2]
    if tp is timedelta:
        return [timedelta(0), "abc"]
    if origin is Literal:
        return [12345 if all(isinstance(a, int) for a in args) else "not-one-of-them"]
    if is_restricted(tp) and tp.restrictions:
        return _number_candidates(tp)
    if is_restricted(tp) and tp.pattern is not None:
        return [v for v in ("", "py", "x y", "a\n", "1,2x", "a\udcffb") if not tp.pattern.match(v)]
    if is_restricted(tp):
        return _path_candidates(tp, places)
    if origin in (tuple, list) or (origin is not None and origin.__name__ == "Sequence"):
        inner = [a for a in args if a is not Ellipsis]
        if any(isinstance(a, type) and not is_restricted(a) for a in inner):  # e.g. list[torch.device]
            return ["not-a-list"]
        good = [inside_value(a, places) for a in inner]
        out: list[Any] = []
        if origin is tuple and Ellipsis not in args:
            out.append(good[:-1] if len(good) > 1 else [*good, *good])  # the wrong length
        for i, a in enumerate(inner):
            for bad in raw_candidates(a, places)[:2]:
                item = list(good) if origin is tuple and Ellipsis not in args else [good[0]]
                item[i if len(item) > i else 0] = bad
                out.append(item)
        return out
    if origin is dict or tp is dict:
        return ["not-a-mapping"]
    if isinstance(tp, type) or origin is not None:  # a class (or a callable): a path that imports nothing
        return ["not_a_module.NotAClass"]
    raise AssertionError(f"no outside values known for {tp!r}: teach tests/helpers/domains.py")


def inside_value(tp: Any, places: Places) -> Any:
    """A value the domain ``tp`` accepts."""
    from distlab.domains import conforms

    tp = _unwrap(tp)
    if tp is torch.Tensor:
        return torch.zeros(4, 3)
    if tp is torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    if (
        tp is torch.distributed.device_mesh.DeviceMesh
    ):  # an instance that was never set up: each check runs first
        return object.__new__(tp)
    if _is_union(tp):
        members = [m for m in get_args(tp) if m is not type(None)] or [type(None)]
        return inside_value(members[0], places)
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return args[0]
    if tp is bool:
        return True
    if tp is type(None):
        return None
    if is_restricted(tp) and tp.__name__ == "ExistingPath":
        return places.a_file
    if is_restricted(tp) and tp.__name__ == "SafetensorsFile":
        return places.a_folder + "/ok.safetensors"
    if is_restricted(tp) and tp.__name__ == "WritableFolder":
        return places.a_folder
    if is_restricted(tp) and tp.__name__ == "FileName":
        return "out.txt"
    for v in (1, 2, 0.5, 0, ".py", "x", 10, "2", "00:01:00:00", "cpu"):
        if conforms(tp, v):
            return v
    if is_restricted(tp) and tp.restrictions:  # a number domain far from 0: its own bounds
        bounds = [ref for _, ref in tp.restrictions if math.isfinite(ref)]
        for v in (*bounds, *(b + 1 for b in bounds), *(b * 2 for b in bounds)):
            if conforms(tp, v):
                return v
    if origin in (tuple, list):
        inner = [a for a in args if a is not Ellipsis]
        return [inside_value(a, places) for a in inner]
    if origin is dict and len(args) == 2:
        return {inside_value(args[0], places): inside_value(args[1], places)}
    raise AssertionError(f"no inside value known for {tp!r}")


def parser_accepts(tp: Any, value: Any) -> bool:
    """Whether jsonargparse (not distlab) accepts ``value`` for a parameter of type ``tp``."""
    from jsonargparse import ArgumentParser

    import distlab.cli.parser_types  # noqa: F401  (distlab's domains registered with the parser)

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--x", type=_unwrap(tp))
    try:
        parser.parse_object({"x": value})
    except Exception:  # noqa: BLE001 - any refusal
        return False
    return True


def outside_values(tp: Any, places: Places) -> list[Any]:
    """Values outside the declared domain ``tp``: each candidate breaks one member's rule and no other member
    of a union accepts it. A zero timedelta passes the parser: distlab's construction check refuses it."""
    tp = _unwrap(tp)
    members = list(get_args(tp)) if _is_union(tp) else [tp]
    out: list[Any] = []
    for m in members:
        for value in raw_candidates(m, places):
            others = [o for o in members if o is not m]
            if any(parser_accepts(o, value) for o in others) or any(_same(value, v) for v in out):
                continue
            out.append(value)
    return out


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and (a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


def cli_text(value: Any) -> str:
    """How a user types ``value`` after ``--key=``."""
    import json

    if isinstance(value, str):
        return value
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, timedelta):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(json.dumps(v) if isinstance(v, str) else cli_text(v) for v in value) + "]"
    return json.dumps(value)


def refused_in_one_line(args: list[str], name: str, capsys) -> tuple[str, str]:
    """Run the CLI on ``args`` in this process: it must end in exactly one ``distlab: error:`` line naming ``name``,
    exit status 2, no traceback. Returns (the line, what to show when a further check fails)."""
    import pytest

    from distlab.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("distlab: error:")]
    shown = f"{args[-1]!r}: {err[-1500:]}"
    assert info.value.code == 2, shown
    assert len(lines) == 1 and "Traceback" not in err, shown
    assert name in lines[0], f"the line does not name {name!r}: {lines[0]}"
    return lines[0], shown


# ---- what counts as a declared domain ----------------------------------------------------------------------
_OPEN_TYPES = (bool, type(None), timedelta)  # every value is meaningful
_UNDECLARED = (int, float, str, dict, list, tuple, object, Any)  # they admit -1, nan, '' ...


def is_declared(tp: Any) -> bool:
    """Whether ``tp`` says which values a parameter accepts."""
    if tp is inspect.Parameter.empty or tp in _UNDECLARED:
        return False
    if tp in _OPEN_TYPES or is_restricted(tp):
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
    if origin is not None and getattr(origin, "__module__", "") == "collections.abc":
        return origin is Callable
    return isinstance(tp, type) and tp not in _UNDECLARED  # a class: only its instances pass
