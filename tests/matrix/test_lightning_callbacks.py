"""Every callback Lightning exports, on distlab's GPT module and its endless text stream, as a user adds it:
``--trainer.callbacks+=<class>`` with its required arguments (values of their annotated types) and nothing else
(but a cap on a search's rounds, SEARCH_CAPS).

Each must train (exit 0) or be refused in one line with exit 2 and no run folder left behind; never an internal
error, a traceback, or exit 1. The classes are read from ``lightning.pytorch.callbacks`` as installed, so a Lightning
release's new callback joins by itself. (ThroughputMonitor once crashed here: it reads ``flops_per_batch`` as a
number, and the GPT module had a method of that name.)
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import lightning.pytorch.callbacks
import pytest

from distlab.cli import main
from tests.helpers.cli import CONFIGS
from tests.helpers.domains import Places, cli_text, inside_value

# Required arguments whose declared domain says "a function" or "anything": a value of that kind, by argument name.
FUNCTIONS = {"batch_size_fn": "builtins.len", "pruning_fn": "l1_unstructured"}
# Optional arguments that only bound a search, the same code paths in fewer rounds: BatchSizeFinder's default
# doubles the batch size from 2 to 8192 on a CPU (12 trials of 3 steps, then the fit at 8192: ~25 s); capped at 8
# it still tries sizes, changes the datamodule's batch_size, restores its checkpoint and fits at the size it found.
SEARCH_CAPS = {"BatchSizeFinder": {"max_val": 8}}
CALLBACKS = sorted(
    name
    for name in lightning.pytorch.callbacks.__all__
    if isinstance(getattr(lightning.pytorch.callbacks, name), type)
    and not inspect.isabstract(getattr(lightning.pytorch.callbacks, name))
)


def _required(cls: type, places: Places) -> list[str]:
    import typing

    out = []
    try:
        hints = typing.get_type_hints(cls.__init__)
    except NameError:
        hints = {}
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not p.empty:
            continue
        value: Any = FUNCTIONS.get(name)
        if name == "dirpath":  # a folder under the test's places (a str alone would be a folder in the cwd)
            value = places.a_folder
        if value is None:
            value = cli_text(inside_value(hints.get(name), places))
        out.append(f"--trainer.callbacks.{name}={value}")
    caps = SEARCH_CAPS.get(cls.__name__, {})
    params = inspect.signature(cls.__init__).parameters
    out += [f"--trainer.callbacks.{name}={value}" for name, value in caps.items() if name in params]
    return out


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> Places:
    return Places.under(tmp_path_factory.mktemp("places"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", CALLBACKS)
def test_each_lightning_callback_trains_or_is_refused_in_one_line(name, places, tmp_path, capsys, caplog):
    cls = getattr(lightning.pytorch.callbacks, name)
    run = tmp_path / "run"
    args = [
        "fit",
        "--config",
        str(CONFIGS / "debug.yaml"),
        f"--trainer.default_root_dir={run}",
        "--trainer.max_steps=2",
        "--trainer.val_check_interval=2",
        f"--trainer.callbacks+=lightning.pytorch.callbacks.{name}",
        *_required(cls, places),
    ]
    try:
        with caplog.at_level(logging.INFO):
            main(args)
        code = 0
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("distlab: error:")]
    assert code in (0, 2), f"{name}: exit {code}: {err[-1500:]}"
    assert "Traceback" not in err, f"{name}: {err[-1500:]}"
    if code == 2:
        assert len(errors) == 1, f"{name}: {err[-1500:]}"
        assert "internal error" not in errors[0], errors[0]
        assert not run.exists(), f"{name}: refused, and the run folder {run} was left behind"
    else:
        assert not errors, errors
        saved = [
            *run.rglob("*.ckpt"),
            *Path(places.a_folder).rglob("*.ckpt"),
        ]  # (OnExceptionCheckpoint's dirpath)
        assert saved, f"{name}: the fit exited 0 and saved no checkpoint: {caplog.text[-1500:]}"
