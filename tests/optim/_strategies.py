"""Hypothesis strategies built from the domains distlab's signatures declare (:mod:`distlab.domains`).

:func:`strategy_for` maps one declared type to a strategy: a restricted number type (``NonNegative``,
``HalfOpenUnitInterval``, ``NSSteps``, ...) from its own bounds, ``Literal[...]`` from its values, ``bool``,
``None``, unions, fixed-length tuples, and ``X | Tensor`` (torch's 1-element tensor learning rate) as ``X``
or ``torch.tensor(X)``. A type it cannot map raises :class:`Unmappable`: a new parameter joins the property
tests by being annotated, and one annotated with something this module does not know fails them loudly.

Unbounded numbers are drawn up to ``FLOAT_CAP`` / ``INT_CAP`` past their bound (plus the bounds themselves,
where the domain includes them): the values an optimizer can take for a few steps without overflowing, so a
comparison with the oracle stays meaningful.

Example::

    strategy_for(NonNegative)                  # floats in [0, FLOAT_CAP], 0 included
    signature_strategies(DistMuon.__init__)    # {"lr": ..., "weight_decay": ..., ...}
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin

import torch
from hypothesis import strategies as st
from torch import Tensor

from distlab.domains import is_domain as is_restricted
from distlab.optim.functional import Triple

FLOAT_CAP = 4.0  # unbounded float domains: drawn up to this far past their finite bound
INT_CAP = 8  # unbounded or wide int domains: drawn up to this far past their lower bound (and their bounds)
EDGE_EVERY = 6  # one draw in this many is a bound of the domain

# Types that are not domains but whose valid values are known. torch.dtype: DistMuon's ns_dtype accepts the
# two dtypes Newton-Schulz runs in (the annotation cannot say which; parse_dtype refuses the rest).
FINITE_EXTRA: dict[Any, tuple[Any, ...]] = {torch.dtype: (torch.bfloat16, torch.float32)}
EXTRA: dict[Any, st.SearchStrategy] = {tp: st.sampled_from(values) for tp, values in FINITE_EXTRA.items()}
# One (a, b, c) per Newton-Schulz iteration is not drawn here: torch.optim.Muon, these properties' oracle, takes one
# triple; per-iteration coefficients (Polar Express) have their own oracle (test_polar_express_matches_the_papers_...).
EXTRA[tuple[Triple, ...]] = st.nothing()


class Unmappable(TypeError):
    """A declared type with no strategy: annotate the parameter with a domain from distlab.domains."""


def _is_union(tp: Any) -> bool:
    return get_origin(tp) is Union or isinstance(tp, types.UnionType)


def _bounds(tp: type) -> tuple[float, bool, float, bool]:
    """(lo, lo_open, hi, hi_open) of a restricted number type; -inf / inf where unbounded."""
    if getattr(tp, "_join", "and") != "and":
        raise Unmappable(f"{tp.__name__}: restrictions joined by {tp._join!r} are not mapped")
    lo, lo_open, hi, hi_open = -math.inf, True, math.inf, True
    for op, ref in tp.restrictions:
        if op in (">", ">="):
            lo, lo_open = max(lo, ref), op == ">"
        elif op in ("<", "<="):
            hi, hi_open = min(hi, ref), op == "<"
        else:
            raise Unmappable(f"{tp.__name__}: restriction {op} is not mapped")
    return lo, lo_open, hi, hi_open


def _restricted_number(tp: type) -> st.SearchStrategy:
    lo, lo_open, hi, hi_open = _bounds(tp)
    if tp.base is int:
        lo_i = -INT_CAP if lo == -math.inf else math.floor(lo) + 1 if lo_open else math.ceil(lo)
        hi_i = lo_i + INT_CAP if hi == math.inf else math.ceil(hi) - 1 if hi_open else math.floor(hi)
        return _mostly(st.integers(lo_i, min(hi_i, lo_i + INT_CAP)), [lo_i, hi_i])
    if tp.base is not float:
        raise Unmappable(f"{tp.__name__}: restricted {tp.base.__name__} types are not mapped")
    low = -FLOAT_CAP if lo == -math.inf else lo
    high = min(hi, (0.0 if lo == -math.inf else lo) + FLOAT_CAP)
    capped = high < hi
    interior = st.floats(
        low,
        high,
        exclude_min=lo_open and lo != -math.inf,
        exclude_max=hi_open and not capped,
        allow_nan=False,
        allow_infinity=False,
    )
    edges = [v for v, is_open in ((lo, lo_open), (hi, hi_open)) if math.isfinite(v) and not is_open]
    if hi_open and math.isfinite(hi):
        edges.append(math.nextafter(hi, -math.inf))  # e.g. beta2 as close to 1 as a float gets
    return _mostly(interior, edges) if edges else interior


def _mostly(interior: st.SearchStrategy, edges: list) -> st.SearchStrategy:
    """``interior``, and one draw in EDGE_EVERY a bound the domain includes (e.g. ns_steps=99: costly to run)."""
    return st.integers(1, EDGE_EVERY).flatmap(lambda k: st.sampled_from(edges) if k == 1 else interior)


def finite_values(tp: Any) -> list[Any] | None:
    """Every value of a finite domain (``Literal``, ``bool``, ``None``, a finite ``EXTRA`` type, unions of
    them), or None for an infinite one."""
    if tp is None or tp is type(None):
        return [None]
    if tp is bool:
        return [False, True]
    if get_origin(tp) is Literal:
        return list(get_args(tp))
    if tp in FINITE_EXTRA:
        return list(FINITE_EXTRA[tp])
    if _is_union(tp):
        parts = [finite_values(a) for a in get_args(tp)]
        return None if any(p is None for p in parts) else [v for p in parts for v in p]
    return None


def strategy_for(tp: Any) -> st.SearchStrategy:
    """A strategy drawing values inside the domain ``tp`` declares; :class:`Unmappable` if there is none."""
    if tp in EXTRA:
        return EXTRA[tp]
    if tp is bool:
        return st.booleans()
    if tp is None or tp is type(None):
        return st.none()
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return st.sampled_from(args)
    if _is_union(tp):
        atoms = [finite_values(a) for a in args]
        if all(
            v is not None for v in atoms
        ):  # a finite domain: every value equally likely, whatever its type
            return st.sampled_from([v for values in atoms for v in values])
        numbers = [a for a in args if a is not Tensor]
        alternatives = [strategy_for(a) for a in numbers]
        if Tensor in args:  # torch's convention: a hyperparameter may be a 1-element tensor of its domain
            if not numbers or not all(is_restricted(a) for a in numbers):
                raise Unmappable(f"{tp}: a Tensor alternative needs a number domain beside it")
            alternatives.append(st.one_of(*map(strategy_for, numbers)).map(torch.tensor))
        return st.one_of(*alternatives)
    if origin is tuple and args and Ellipsis not in args:
        return st.tuples(*map(strategy_for, args))
    if is_restricted(tp):
        return _restricted_number(tp)
    raise Unmappable(
        f"no strategy for the declared type {tp!r}: annotate it with a domain from distlab.domains"
    )


def signature_strategies(
    fn: Callable, skip: set[str] | frozenset[str] = frozenset()
) -> dict[str, st.SearchStrategy]:
    """{parameter: strategy} for every parameter of ``fn`` (but ``self``, ``*args``, ``**kw`` and ``skip``)."""
    hints = typing.get_type_hints(fn)
    out = {}
    for name, param in inspect.signature(fn).parameters.items():
        if name == "self" or name in skip or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name not in hints:
            raise Unmappable(f"{fn.__qualname__}: parameter {name!r} has no annotation")
        try:
            out[name] = strategy_for(hints[name])
        except Unmappable as e:
            raise Unmappable(f"{fn.__qualname__}({name}): {e}") from None
    return out


def subset_of(strategies: dict[str, st.SearchStrategy]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts holding any subset of the keys, each drawn from its strategy (per-group overrides)."""
    return st.fixed_dictionaries({}, optional=strategies)
