"""Property-based oracles: DistMuonAdamW / DistMuon / DistAdamW equal torch.optim.Muon / torch.optim.AdamW over
every public argument's declared domain, drawn shapes, world sizes 1-3, ZeRO-1 and FSDP2.

Claim: for any constructor call whose arguments lie in the domains the signatures declare (``NonNegative``,
``HalfOpenUnitInterval``, ``NSSteps``, ``Literal[...]``, ... from distlab/domains.py; strategies are built
from the annotations by tests/optim/_strategies.py, so a new argument is drawn without editing a list), with
per-group overrides, on params of any shape (matrices, Conv1d/Conv2d kernels, a single row, fewer rows than
ranks, rows not divisible by the world size, scalars and vectors for AdamW, several of mixed kinds), over
``STEPS`` steps with gradients missing on some or every rank, the distributed optimizer's params after every
step and its final state equal one process of torch's optimizers fed the average of the ranks' gradients
(conv kernels as their (out, in*kh*kw) view; ``max_grad_norm``: after ``clip_grad_norm_`` on the averaged
gradients; ``ns_dtype`` float32: torch's algorithm with fp32 Newton-Schulz, :class:`ReferenceMuon`).

Domain of the runs: world 1 with torch.distributed not initialised (in-process @given), world 1 on a one-rank
gloo group, and 2 and 3 gloo ranks; ZeRO-1 with ``grad_sync`` "reduce" (each rank its own gradient), "averaged"
(every rank the mean) and "auto" (either), and FSDP2 (``fully_shard``, ``grad_sync`` "sharded" or "auto").
The spawned cases are drawn in this process by hypothesis with fixed seeds (no database, no deadline) and all
run in one spawn of 3 ranks: world 3 on WORLD, world 2 on the group of ranks 0-1 while rank 2 runs the world-1
cases on its own group (tests/optim/_jobs_properties.py); ``test_the_drawn_cases_cover_the_domain`` proves the
draw reaches every value that matters.

Tolerances: bit-for-bit (NaN where the oracle has NaN: drawn Newton-Schulz coefficients can diverge), because
gradients are integers / 64 times a power of two (exact sums in any order). With ``max_grad_norm`` the global
norm is summed in another order than clip_grad_norm_'s: norms rtol 1e-5, params and state rtol/atol 1e-5.
"""

from __future__ import annotations

import inspect
from collections import Counter
from typing import Any, get_args, get_type_hints

import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st

from distlab.domains import conforms
from distlab.optim import DistAdamW, DistMuon, DistMuonAdamW, muon_param_groups
from distlab.optim.dist_optim import GradSyncMode
from tests.helpers.dist import run_distributed
from tests.optim._jobs_properties import job_cases, run_case
from tests.optim._prop_cases import (
    BEYOND_TORCH,
    CLASSES,
    HARNESS,
    MODES_BY_LAYOUT,
    ORACLE_OPTIONS,
    ORACLES,
    Case,
    ReferenceMuon,
    cases,
    hyper_names,
    hyper_strategies,
    ns_dtype_of,
    one_thread,
    option_names,
    oracle_run,
)
from tests.optim._strategies import Unmappable, finite_values, signature_strategies, strategy_for

# One fixed, bounded profile: reproducible in CI (derandomized or seeded), nothing written to a database.
PROFILE = dict(database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Cases per class drawn for each (layout, world size): a spawn costs seconds, a case tens of milliseconds.
N_SPAWNED = {
    ("zero1", 1): 16,
    ("fsdp2", 1): 12,
    ("zero1", 2): 28,
    ("fsdp2", 2): 16,
    ("zero1", 3): 28,
    ("fsdp2", 3): 16,
}
CLIP_TOL = dict(rtol=1e-5, atol=1e-5)
SPAWN_TIMEOUT = 240
WORLDS = (1, 2, 3)


def draw_cases(layout: str, world: int, cls: str, n: int) -> list[Case]:
    """``n`` cases drawn by hypothesis with a seed fixed per (layout, world, class): the same list every run."""
    out: list[Case] = []

    @seed(sorted(CLASSES).index(cls) * 100 + world * 10 + ("zero1", "fsdp2").index(layout))
    @settings(max_examples=n, phases=[Phase.generate], **PROFILE)
    @given(cases(layout, world, cls))
    def collect(case: Case) -> None:
        out.append(case)

    collect()
    return out


# ---- the strategies come from the signatures ---------------------------------------------------------


def test_every_public_argument_is_drawn_from_its_declared_domain():
    """Each constructor argument either has a strategy built from its annotation or is one the harness supplies;
    each per-group hyperparameter is an argument of the torch oracle; each option's meaning is known to it."""
    for cls in (DistMuonAdamW, DistMuon, DistAdamW):
        drawn = signature_strategies(cls.__init__, skip=HARNESS)  # raises Unmappable on an unknown type
        params = [n for n in inspect.signature(cls.__init__).parameters if n != "self"]
        assert set(params) == set(drawn) | (HARNESS & set(params))
        for name in option_names(cls):
            assert name in ORACLE_OPTIONS, f"{cls.__name__}({name}=...): tell the oracle what it does"
    for cls, kind in ((DistMuon, "muon"), (DistAdamW, "adamw")):
        oracle_args = inspect.signature(ORACLES[kind].__init__).parameters
        assert set(hyper_names(cls)) <= set(oracle_args), f"{cls.__name__} has hyperparameters torch lacks"
    assert set(BEYOND_TORCH) <= set(
        inspect.signature(DistMuon.__init__).parameters
    )  # the list names real ones
    # muon_param_groups: every keyword but the model and the name patterns (drawn from the model's own names)
    assert set(signature_strategies(muon_param_groups, skip={"model", "muon", "adamw", "head"}))
    modes = {m for layout in MODES_BY_LAYOUT.values() for m in layout}
    assert modes == set(get_args(GradSyncMode)), "a grad_sync mode the cases never request"


class Opaque:
    """A type with no declared domain."""


def _takes_opaque(x: Opaque | None = None) -> None: ...


def test_an_unmappable_type_fails_loudly():
    with pytest.raises(Unmappable, match="Opaque"):
        strategy_for(Opaque)
    with pytest.raises(Unmappable, match=r"_takes_opaque\(x\)"):
        signature_strategies(_takes_opaque)


@settings(max_examples=60, derandomize=True, **PROFILE)
@given(st.data())
def test_drawn_arguments_lie_in_their_domains_and_are_accepted(data):
    """Every drawn value conforms to its annotation, and the constructor accepts the whole drawn call."""
    cls = data.draw(st.sampled_from([DistMuon, DistAdamW]))
    kw = data.draw(st.fixed_dictionaries(signature_strategies(cls.__init__, skip=HARNESS)))
    hints = get_type_hints(cls.__init__)
    for name, value in kw.items():
        assert conforms(hints[name], value), f"{name}={value!r} is outside {hints[name]}"
    w = torch.nn.Parameter(torch.zeros(3, 2))
    opt = cls([w], **kw)
    group = opt.param_groups[0]
    for name in hyper_names(cls):
        if name in kw:
            assert group[name] is kw[name] or group[name] == kw[name], name


@example(hyper=dict(lr=torch.tensor(0.7), weight_decay=0.3, nesterov=False), shape=(5, 3), seed_=1)
@example(hyper=dict(adjust_lr_fn="match_rms_adamw", momentum=0.5, ns_steps=2), shape=(2, 6), seed_=2)
@settings(max_examples=100, derandomize=True, **PROFILE)
@given(
    hyper=st.fixed_dictionaries({}, optional=hyper_strategies("muon")),
    shape=st.tuples(st.integers(1, 7), st.integers(1, 6)),
    seed_=st.integers(0, 1000),
)
def test_reference_muon_in_bf16_is_torch_muon(hyper, shape, seed_):
    """The fp32 oracle's few lines are torch's algorithm: run in bf16 they equal torch.optim.Muon bit for bit
    (the examples: a tensor lr, which torch keeps in float32 arithmetic, and the non-default branches)."""
    g = torch.Generator().manual_seed(seed_)
    a = torch.nn.Parameter(torch.randn(shape, generator=g))
    b = torch.nn.Parameter(a.detach().clone())
    ours, torchs = ReferenceMuon([a], ns_dtype=torch.bfloat16, **hyper), torch.optim.Muon([b], **hyper)
    with one_thread():
        for _ in range(3):
            grad = torch.randn(shape, generator=g)
            a.grad, b.grad = grad.clone(), grad.clone()
            ours.step()
            torchs.step()
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


# ---- comparing a run with the oracle -------------------------------------------------------------------


def batched_tol(want: torch.Tensor) -> dict[str, float]:
    """batch_ns=True: a few ulp of the update (DistMuonAdamW's docstring), so the bound scales with the tensor's
    largest entry: a drawn Newton-Schulz polynomial (a = 2.35 over 7 steps, b and c near 0) multiplies the update by
    a**7 ~ 400, and the batched chain's last-bit differences with it, past any fixed 1e-5 (found on an AMX host)."""
    scale = float(torch.nan_to_num(want).abs().max()) if want.numel() else 0.0
    return dict(rtol=1e-5, atol=1e-5 * max(1.0, scale))


def _close(got: torch.Tensor, want: torch.Tensor, clip: bool, batched: bool = False) -> str | None:
    tol = CLIP_TOL if clip else batched_tol(want) if batched else dict(rtol=0, atol=0)
    try:
        torch.testing.assert_close(got, want, equal_nan=True, **tol)
    except AssertionError as e:  # "Tensor-likes are not equal!; Mismatched elements: 1 / 6; Greatest ..."
        return "; ".join(line.strip() for line in str(e).splitlines()[:4] if line.strip())
    return None


def mismatch(case: Case, got: dict[str, Any], want: dict[str, Any]) -> str | None:
    """Why a run differs from the oracle (params every step, clip norms, final state), or None."""
    clip = case.options.get("max_grad_norm") is not None
    batched = case.options.get("batch_ns") is True
    for s, (g_step, w_step) in enumerate(zip(got["snaps"], want["snaps"], strict=True)):
        for j, (g, w) in enumerate(zip(g_step, w_step, strict=True)):
            if (why := _close(g, w, clip, batched)) is not None:
                return f"step {s} param {j} {tuple(w.shape)}: {why}"
    for s, w in enumerate(want["norms"]):
        if w is None:
            continue
        if got["norms"][s] is None or _close(got["norms"][s].float(), w.float(), True) is not None:
            return f"step {s} clip norm {got['norms'][s]} != clip_grad_norm_'s {w}"
    if got["state"] is not None:
        if set(got["state"]) != set(want["state"]):
            return f"state held for params {sorted(got['state'])}, torch holds {sorted(want['state'])}"
        for j, w_state in want["state"].items():
            g_state = got["state"][j]
            if set(g_state) != set(w_state):
                return f"param {j} state keys {sorted(g_state)} != torch's {sorted(w_state)}"
            for k, w in w_state.items():
                if g_state[k].dtype != w.dtype:
                    return f"param {j} state {k!r} is {g_state[k].dtype}, torch keeps {w.dtype}"
                if (why := _close(g_state[k].reshape(w.shape), w, clip, batched)) is not None:
                    return f"param {j} state {k!r}: {why}"
    return None


def expected_mode(case: Case) -> str:
    if case.layout == "fsdp2":
        return "sharded"
    if case.grad_sync != "auto":
        return case.grad_sync
    return "averaged" if case.world > 1 and case.feed == "averaged" else "reduce"


# id(case) -> (case, oracle_run(case)): computed once per drawn case (the case is kept, so its id stays its own)
_ORACLES: dict[int, tuple[Case, dict[str, Any]]] = {}


def oracle_of(case: Case) -> dict[str, Any]:
    if id(case) not in _ORACLES:
        _ORACLES[id(case)] = (case, oracle_run(case))
    return _ORACLES[id(case)][1]


def assert_all_match(runs: list[tuple[str, Case, dict[str, Any]]], oracle=oracle_run) -> None:
    """Every (label, case, result) equals the oracle; the message lists the first failures as user calls."""
    failures = []
    for label, case, got in runs:
        why = mismatch(case, got, oracle(case))
        if why is None and got["mode"] != expected_mode(case):
            why = f"mode {got['mode']!r}, expected {expected_mode(case)!r}"
        if why is not None:
            failures.append(f"{label}: {why}\n    {case.describe()}")
    assert not failures, f"{len(failures)} of {len(runs)} runs differ from torch:\n" + "\n".join(failures[:6])


# ---- world 1, torch.distributed not initialised --------------------------------------------------------


@settings(max_examples=100, derandomize=True, **PROFILE)
@given(st.sampled_from(sorted(CLASSES)).flatmap(lambda cls: cases("zero1", 1, cls)))
def test_one_process_equals_torch(case):
    """With one process (no process group) every drawn call is exactly torch.optim.Muon / AdamW."""
    with one_thread():
        got = run_case(case, 0, 1, None, None)
    assert_all_match([("in-process", case, got)])


# ---- worlds 1-3 on real gloo process groups, one spawn per world size ---------------------------------


@pytest.fixture(scope="module")
def drawn() -> dict[tuple[str, int], list[Case]]:
    return {
        key: [c for cls in sorted(CLASSES) for c in draw_cases(*key, cls, n)] for key, n in N_SPAWNED.items()
    }


@pytest.fixture(scope="module")
def spawned(drawn):
    """results(layout, world) -> [(case, {rank: result})]. One spawn of 3 ranks runs every world size: world 3
    on WORLD, world 2 on the gloo group of ranks 0-1 while rank 2 runs the world-1 cases on its own group."""
    cache: list[list[dict]] = []
    by_world = {w: drawn[("zero1", w)] + drawn[("fsdp2", w)] for w in WORLDS}

    def results(layout: str, world: int) -> list[tuple[Case, dict[int, dict]]]:
        if not cache:
            cache.append(run_distributed(job_cases, max(WORLDS), by_world, timeout=SPAWN_TIMEOUT))
        ranks = cache[0]
        out = []
        for i, case in enumerate(by_world[world]):
            if case.layout == layout:
                out.append((case, {r: ranks[r][world][i] for r in range(len(ranks)) if i in ranks[r][world]}))
        return out

    return results


@pytest.mark.timeout(SPAWN_TIMEOUT + 60)
@pytest.mark.parametrize("world", [1, 2, 3], ids=lambda w: f"world{w}")
@pytest.mark.parametrize("layout", ["zero1", "fsdp2"])
def test_distributed_equals_torch(spawned, layout, world):
    """Every drawn case, on every rank: params after each step, clip norms and final state == torch's."""
    runs = spawned(layout, world)
    assert runs and all(len(by_rank) == world for _, by_rank in runs)  # every case ran on all its ranks
    assert_all_match(
        [(f"case {i} rank {r}", case, by_rank[r]) for i, (case, by_rank) in enumerate(runs) for r in by_rank],
        oracle_of,
    )


@pytest.mark.timeout(SPAWN_TIMEOUT + 60)
@pytest.mark.parametrize("world", [2, 3], ids=lambda w: f"world{w}")
@pytest.mark.parametrize("layout", ["zero1", "fsdp2"])
def test_ranks_stay_bit_identical(spawned, layout, world):
    """Every rank ends every step with the same params, bit for bit (NaN where rank 0 has NaN)."""
    for case, by_rank in spawned(layout, world):
        for r in range(1, world):
            for step, (a_step, b_step) in enumerate(
                zip(by_rank[r]["snaps"], by_rank[0]["snaps"], strict=True)
            ):
                for a, b in zip(a_step, b_step, strict=True):
                    torch.testing.assert_close(
                        a,
                        b,
                        rtol=0,
                        atol=0,
                        equal_nan=True,
                        msg=lambda m, s=step, r=r, c=case: f"rank {r} step {s}: {m}\n{c.describe()}",
                    )


@pytest.mark.timeout(180)
def test_the_drawn_cases_cover_the_domain(drawn):
    """The fixed draw reaches what the properties are about: every class, mode, dtype, option, flag and
    Literal value off its default, active clipping, conv kernels, empty shards and missing gradients."""
    all_cases = [c for cs in drawn.values() for c in cs]
    seen: dict[str, set] = {}
    clipping, finite = Counter(), 0
    for case in all_cases:
        ref = oracle_of(case)
        finite += all(bool(t.isfinite().all()) for t in ref["snaps"][-1])
        for g in ref["groups"]:
            for name, value in g.items():
                seen.setdefault(f"{g['kind']}.{name}", set()).add(repr(value))
        seen.setdefault("ns_dtype", set()).add(ns_dtype_of(case) if "muon" in case.kinds else None)
        for key in ("cls", "layout", "world", "grad_sync", "feed", "as_groups"):
            seen.setdefault(key, set()).add(getattr(case, key))
        for name, value in case.options.items():
            seen.setdefault(f"option.{name}", set()).add(repr(value))
        seen.setdefault("missing", set()).update(case.missing.values())
        for s, k in zip(case.shapes, case.kinds, strict=True):
            seen.setdefault("shape", set()).add((k, len(s), case.layout, 0 < len(s) and s[0] < case.world))
        norm = case.options.get("max_grad_norm")
        if norm is not None:
            clipping[any(n is not None and n > norm for n in ref["norms"])] += 1
    assert seen["cls"] == set(CLASSES) and seen["grad_sync"] == set(get_args(GradSyncMode))
    assert seen["feed"] == {"per_rank", "averaged"} and seen["as_groups"] == {True, False}
    assert {torch.bfloat16, torch.float32} <= seen["ns_dtype"]
    assert seen["missing"] == {"all@0", "all@1", "one_rank@1"}
    assert seen["muon.nesterov"] == {"True", "False"}
    assert seen["muon.adjust_lr_fn"] == {"None", "'original'", "'match_rms_adamw'"}
    for kind in ("muon", "adamw"):
        defaults = inspect.signature(ORACLES[kind].__init__).parameters
        for name in hyper_names(DistMuon if kind == "muon" else DistAdamW):
            values, default = seen[f"{kind}.{name}"], defaults[name].default
            least = 1 if isinstance(default, bool) else 2
            assert len(values - {repr(default)}) >= least, f"{kind} {name} barely drawn: {values}"
    for cls in (DistMuonAdamW, DistMuon, DistAdamW):
        hints = get_type_hints(cls.__init__)
        for name in option_names(cls):
            values = finite_values(hints[name])
            if values is None:
                assert len(seen[f"option.{name}"]) >= 3, f"option {name} barely drawn"
            else:  # a finite domain: every value (ns_dtype's spellings, coalesce None/True/False, ...)
                assert {repr(v) for v in values} <= seen[f"option.{name}"], name
    assert clipping[True] >= 5 and clipping[False] >= 2, clipping
    for layout in ("zero1", "fsdp2"):
        assert ("muon", 4, layout, False) in seen["shape"] and ("muon", 3, layout, False) in seen["shape"]
        assert ("muon", 2, layout, True) in seen["shape"] or ("muon", 4, layout, True) in seen["shape"]
        assert any(k == "adamw" and empty and lay == layout for k, _, lay, empty in seen["shape"])
    assert ("adamw", 0, "zero1", False) in seen["shape"]
    assert finite >= 0.75 * len(all_cases), (
        f"only {finite} of {len(all_cases)} cases end finite: a vacuous draw"
    )
