"""The learning-rate schedule over its whole domain (hypothesis, derandomized): every schedule, warmup, warmdown and
floor drawn, each claim of ``lr_multiplier``'s docstring checked against its statement, not against the formula.

- warmup: linear from 1/warmup to 1 over ``warmup_steps`` (step k gets (k+1)/warmup);
- then every value lies in [min_lr_ratio, 1] and never rises again;
- "cosine" starts at 1 right after warmup, is halfway between 1 and the floor halfway through the remaining steps,
  and reaches the floor at ``total_steps``;
- "linear" holds 1, then falls in equal steps to the floor over the last round(warmdown_ratio * total) steps,
  reaching it at ``total_steps``;
- "constant" is 1 after warmup.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distlab.modules.schedule import lr_multiplier

PROFILE = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def schedules(draw):
    total = draw(st.integers(1, 400))
    return dict(
        total_steps=total,
        warmup_steps=draw(st.integers(0, total - 1)),
        schedule=draw(st.sampled_from(["cosine", "linear", "constant"])),
        warmdown_ratio=draw(st.floats(0.01, 1.0)),
        min_lr_ratio=draw(st.floats(0.0, 1.0)),
    )


@given(s=schedules())
@settings(max_examples=300, derandomize=True, **PROFILE)
def test_the_schedule_keeps_every_promise_of_its_docstring(s):
    total, warmup, floor = s["total_steps"], s["warmup_steps"], s["min_lr_ratio"]
    m = [lr_multiplier(step, **s) for step in range(total + 1)]
    for k in range(warmup):
        assert m[k] == pytest.approx((k + 1) / warmup), f"warmup step {k}: {m[k]}"
    after = m[warmup:]
    assert all(floor - 1e-12 <= v <= 1 + 1e-12 for v in after), "a value outside [min_lr_ratio, 1]"
    assert all(b <= a + 1e-12 for a, b in zip(after, after[1:], strict=False)), (
        "the schedule rises after warmup"
    )
    if s["schedule"] == "constant":
        assert all(v == 1.0 for v in after)
        return
    assert m[total] == pytest.approx(floor, abs=1e-9), f"{s['schedule']} ends at {m[total]}, not at the floor"
    if s["schedule"] == "cosine":
        assert m[warmup] == pytest.approx(1.0)
        remaining = total - warmup
        if remaining % 2 == 0:
            assert m[warmup + remaining // 2] == pytest.approx((1 + floor) / 2)
    else:
        warmdown = max(1, round(s["warmdown_ratio"] * total))
        start = total - warmdown
        assert all(v == 1.0 for v in m[warmup:start]), "linear: not 1 before its warmdown"
        for j in range(warmdown + 1):
            if start + j >= warmup:
                assert m[start + j] == pytest.approx(1 - (1 - floor) * j / warmdown), f"warmdown step {j}"


def test_the_walk_reaches_every_schedule():
    assert math.isclose(lr_multiplier(10, 10, warmup_steps=4, schedule="cosine", min_lr_ratio=0.1), 0.1)
