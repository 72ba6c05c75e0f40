"""The distlab command silences only what distlab makes moot, matched by message, and DISTLAB_VERBOSE=1 shows
it all. (That real runs print none of it is checked on every README command: tests/docs/test_readme_commands.py.)"""

from __future__ import annotations

import logging
import os
import warnings

import pytest
from lightning.pytorch.utilities import rank_zero_info

from distlab.log import MOOT_WARNINGS, SYNC_DIST_ADVICE, silence_moot_messages, sync_dist_advice_silenced

TIP = "💡 Tip: For seamless cloud logging, try installing something"


@pytest.fixture
def clean_filters(monkeypatch):
    """Each test starts with no distlab filter on Lightning's logger and the warnings filters restored."""
    from distlab.log import RANK_ZERO_LOGGERS

    loggers = [logging.getLogger(name) for name in RANK_ZERO_LOGGERS]
    saved = [list(lg.filters) for lg in loggers]
    saved_env = os.environ.get("PYTHONWARNINGS")
    monkeypatch.delenv("DISTLAB_SILENCED_MOOT", raising=False)  # (restored as it was, after the test)
    for lg in loggers:
        lg.filters[:] = []  # what earlier tests' distlab commands installed
    with warnings.catch_warnings():
        yield
    for lg, filters in zip(loggers, saved, strict=True):
        lg.filters[:] = filters
    if saved_env is None:
        os.environ.pop("PYTHONWARNINGS", None)
    else:
        os.environ["PYTHONWARNINGS"] = saved_env


@pytest.mark.parametrize("verbose", [False, True])
def test_tips_and_dependency_deprecations_are_silenced_unless_verbose(
    verbose, clean_filters, monkeypatch, caplog
):
    monkeypatch.setenv("DISTLAB_VERBOSE", "1" if verbose else "0")
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    import importlib
    import importlib.util

    if importlib.util.find_spec(
        "pytorch_lightning"
    ):  # once imported (a config naming it), Lightning logs under its name
        importlib.import_module("pytorch_lightning")

    silence_moot_messages()
    with caplog.at_level(logging.INFO):
        rank_zero_info(TIP)
        rank_zero_info("a line a user needs")
    shown = [r.getMessage() for r in caplog.records]
    assert "a line a user needs" in shown
    assert (TIP in shown) == verbose
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        silence_moot_messages()  # simplefilter above reset the filters: install them again
        warnings.warn(MOOT_WARNINGS[0] + " is deprecated, use something else", FutureWarning, stacklevel=1)
        warnings.warn("a warning a user needs", UserWarning, stacklevel=1)
    messages = [str(w.message) for w in seen]
    assert "a warning a user needs" in messages
    assert any(MOOT_WARNINGS[0] in m for m in messages) == verbose
    # the ranks a launcher or spawn starts inherit the filter through the environment
    assert (f"ignore:{MOOT_WARNINGS[0]}" in os.environ.get("PYTHONWARNINGS", "")) != verbose


@pytest.mark.parametrize("from_the_command", [True, False])
def test_a_spawned_rank_silences_the_tips_itself(from_the_command, clean_filters, monkeypatch):
    """A rank started by spawn is a fresh interpreter: it never ran the distlab command's silence_moot_messages, so
    every rank printed Lightning's tip again. The command's environment tells it to; a user's script is untouched."""
    import subprocess
    import sys

    monkeypatch.setenv("DISTLAB_VERBOSE", "0")
    if from_the_command:
        silence_moot_messages()  # what `distlab fit` does before it spawns
    child = (
        "import distlab.log\nfrom lightning.pytorch.utilities import rank_zero_info\n"
        f"rank_zero_info({TIP!r})\nrank_zero_info('a line a user needs')\n"
    )
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    said = out.stdout + out.stderr
    assert "a line a user needs" in said, said
    assert (TIP in said) != from_the_command, said


@pytest.mark.parametrize("verbose", [False, True])
def test_the_sync_dist_advice_is_silenced_only_inside_exact_evaluation(verbose, monkeypatch):
    monkeypatch.setenv("DISTLAB_VERBOSE", "1" if verbose else "0")
    advice = SYNC_DIST_ADVICE + "'val_loss', ..., sync_dist=True)`"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with sync_dist_advice_silenced():
            warnings.warn(advice, UserWarning, stacklevel=1)
        warnings.warn(advice, UserWarning, stacklevel=1)  # outside: kept
    assert len(seen) == (2 if verbose else 1)
