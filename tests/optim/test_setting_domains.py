"""A setting has one domain wherever it reaches an optimizer.

Generated from the signatures, not listed: every argument of ``muon_param_groups`` and of each shipped
LightningModule whose name, less a role prefix (``muon_``, ``adamw_``, ``matrix_``, ...), is an argument of
``DistMuon`` or ``DistAdamW`` is routed to it. Over edge values (signs, zero, the unit interval's ends, huge, inf,
nan, wrong types):

- what the outer signature accepts, the optimizer's signature accepts (else a value passes the parser and fails
  later, after the run folder exists, or trains on nonsense the optimizer would have refused);
- the optimizer's run-time check of a param group (``add_param_group``, a dict from the user's own code) refuses
  exactly what its signature refuses (a group dict cannot sneak past the declared domain).
"""

from __future__ import annotations

import inspect
import itertools
import math
import typing

import pytest
import torch

import distlab.modules as modules
from distlab.domains import conforms
from distlab.optim import DistAdamW, DistMuon, DistMuonAdamW, muon_param_groups
from distlab.optim.dist_optim import ADAMW_DEFAULTS, MUON_DEFAULTS

OPTIMIZERS = {"muon": DistMuon, "adamw": DistAdamW}
PREFIXES = {"muon_": "muon", "matrix_": "muon", "adamw_": "adamw", "embedding_": "adamw", "head_": "adamw"}
SCALARS = [
    -1,
    -1e-12,
    0,
    0.0,
    1e-12,
    0.5,
    0.95,
    0.999999,
    1,
    1.0,
    1.5,
    7,
    1e30,
    math.inf,
    -math.inf,
    math.nan,
]
WRONG = [None, "0.5", True, [0.5]]
EDGES = SCALARS + WRONG + list(itertools.product([-0.1, 0.0, 0.9, 1.0, 1.5, math.nan], repeat=2))


def _hints(fn) -> dict[str, typing.Any]:
    return typing.get_type_hints(fn)


def _routes() -> list[tuple[str, typing.Any, str, str]]:
    """(where, its annotation, optimizer kind, the optimizer's argument) for each routed setting."""
    surfaces = {"muon_param_groups": muon_param_groups}
    surfaces |= {
        name: getattr(modules, name).__init__
        for name in modules.__all__
        if inspect.isclass(getattr(modules, name))
    }
    routes = []
    for where, fn in surfaces.items():
        for arg, tp in _hints(fn).items():
            kinds = [(k, arg[len(p) :]) for p, k in PREFIXES.items() if arg.startswith(p)]
            kinds = kinds or [(k, arg) for k in OPTIMIZERS]
            for kind, name in kinds:
                if name in _hints(OPTIMIZERS[kind].__init__) and name != "params":
                    routes.append((f"{where}({arg}=...)", tp, kind, name))
    return routes


ROUTES = _routes()


def test_the_routes_were_found():
    """The walk finds the settings it exists for (a refactor that renames them must not empty it)."""
    found = {(r[0].split("(")[1], r[2]) for r in ROUTES}
    assert {
        ("momentum=...)", "muon"),
        ("adamw_eps=...)", "adamw"),
        ("muon_momentum=...)", "muon"),
    } <= found, found


@pytest.mark.parametrize("where,tp,kind,name", ROUTES, ids=[f"{r[0]}->{r[2]}.{r[3]}" for r in ROUTES])
def test_what_a_surface_accepts_its_optimizer_accepts(where, tp, kind, name):
    inner = _hints(OPTIMIZERS[kind].__init__)[name]
    wider = [v for v in EDGES if v is not None and conforms(tp, v) and not conforms(inner, v)]
    assert not wider, f"{where} accepts {wider}, which {OPTIMIZERS[kind].__name__}({name}=...) refuses"


GROUP_SETTINGS = [
    (kind, name)
    for kind, cls in OPTIMIZERS.items()
    for name, tp in _hints(cls.__init__).items()
    if name not in ("params", "return")
    and inspect.signature(cls.__init__).parameters[name].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
]


@pytest.mark.parametrize("kind,name", GROUP_SETTINGS, ids=[f"{k}.{n}" for k, n in GROUP_SETTINGS])
def test_a_param_group_is_refused_exactly_where_the_signature_refuses(kind, name):
    tp = _hints(OPTIMIZERS[kind].__init__)[name]
    probes = [v for v in EDGES if v is not None and not isinstance(v, (str, list, bool))]
    for value in probes:
        if typing.get_origin(tp) is tuple and not isinstance(value, tuple):
            continue  # a scalar for a pair: a TypeError in torch's own words, not a domain question
        if typing.get_origin(tp) is not tuple and isinstance(value, tuple):
            continue
        want_ok = conforms(tp, value)
        for path in ("a param group", "kind_defaults"):
            w = torch.nn.Parameter(torch.randn(4, 3))
            try:
                if path == "a param group":
                    opt = DistMuonAdamW([{"params": [torch.nn.Parameter(torch.randn(4, 3))], "kind": kind}])
                    opt.add_param_group({"params": [w], "kind": kind, name: value})
                else:
                    DistMuonAdamW([{"params": [w], "kind": kind}], kind_defaults={kind: {name: value}})
                refused = None
            except (ValueError, TypeError) as e:
                refused = str(e)
            assert (refused is None) == want_ok, (
                f"{kind} {path} {name}={value!r}: signature {'accepts' if want_ok else 'refuses'}, the check said "
                f"{refused!r}"
            )
            if refused is not None:
                assert "\n" not in refused and name in refused, refused


OTHER_KINDS_SETTINGS = [
    (kind, name)
    for kind, other in (("muon", "adamw"), ("adamw", "muon"))
    for name in _hints(OPTIMIZERS[other].__init__)
    if name in (ADAMW_DEFAULTS if other == "adamw" else MUON_DEFAULTS)
    and name not in (MUON_DEFAULTS if kind == "muon" else ADAMW_DEFAULTS)
]


@pytest.mark.parametrize("kind,name", OTHER_KINDS_SETTINGS, ids=[f"{k}.{n}" for k, n in OTHER_KINDS_SETTINGS])
def test_a_setting_of_the_other_kind_in_a_group_is_refused_not_ignored(kind, name):
    """``{"kind": "muon", "betas": ...}``: the group keeps the key and never reads it; refused in one line."""
    value = (
        inspect.signature(OPTIMIZERS["adamw" if kind == "muon" else "muon"].__init__).parameters[name].default
    )
    w = torch.nn.Parameter(torch.randn(4, 3))
    with pytest.raises(ValueError, match=f"'{name}' is a setting of") as info:
        DistMuonAdamW([{"params": [w], "kind": kind, name: value}])
    assert "\n" not in str(info.value)
