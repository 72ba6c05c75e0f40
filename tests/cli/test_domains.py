"""Bad input as a class: every parameter of every shipped class and command declares its domain, and values
outside it are refused - generated from the signatures, not listed.

- Every parameter of every configurable class distlab exports, of its public functions and of the ``generate`` /
  ``export`` / ``prepare`` commands has a declared domain (``is_declared`` in tests/helpers/domains.py).
- From Python: building each class (calling each function) with each value outside its domain (derived from the
  type: tests/helpers/domains.py) raises a one-line ConfigError naming the parameter.
- Through the real CLI (``distlab.cli.main`` in this process), which reads the same declarations: for each domain a
  command line can reach, one parameter of it given a value outside ends in exactly one line naming the parameter,
  exit status 2, no traceback, nothing written, an earlier run untouched.

A new parameter joins every check by being annotated; the counts are printed at the end of the module.
"""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml

from distlab.cli.commands import FUNCTION_COMMANDS
from distlab.domains import Checked, is_domain
from distlab.errors import ConfigError
from tests.helpers.cli import CONFIGS
from tests.helpers.domains import (
    CLI_BASES,
    Places,
    cli_text,
    inside_value,
    is_declared,
    outside_values,
    parameters,
    refused_in_one_line,
    shipped_classes,
    shipped_functions,
)

CLASSES = shipped_classes()
FUNCTIONS = shipped_functions()
COUNTS: dict[str, int] = {"cli values": 0, "python values": 0}


def _path(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> Places:
    return Places.under(tmp_path_factory.mktemp("places"))


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("earlier_run")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"an earlier run's checkpoint")
    (run / "config.yaml").write_text("trainer: {max_steps: 8}\n")
    return run


@pytest.fixture(scope="module")
def trainer_only(tmp_path_factory) -> Path:
    """debug.yaml's trainer section alone: the model and data classes under test are named on the command line."""
    cfg = yaml.safe_load((CONFIGS / "debug.yaml").read_text())
    path = tmp_path_factory.mktemp("configs") / "trainer_only.yaml"
    path.write_text(yaml.safe_dump({"seed_everything": 0, "trainer": cfg["trainer"]}))
    return path


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()
    }


# ---- 1. every parameter declares its domain -------------------------------------------------------------
def _owners() -> list[tuple[str, Any]]:
    return [(c.__name__, c.__init__) for c in CLASSES] + [(f.__qualname__, f) for f in FUNCTIONS]


@pytest.mark.parametrize("owner", [name for name, _ in _owners()])
def test_every_parameter_declares_its_domain(owner):
    fn = dict(_owners())[owner]
    undeclared = [f"{name}: {tp}" for name, tp, _ in parameters(fn) if not is_declared(tp)]
    assert not undeclared, (
        f"{owner} has parameters with no declared domain (see distlab/domains.py): {undeclared}"
    )


def test_the_walk_finds_the_classes_users_configure():
    """A guard against a walk that silently finds nothing (the classes a recipe names must be in it)."""
    names = {c.__name__ for c in CLASSES}
    assert {
        "GPTLightningModule",
        "TextDataModule",
        "RankZeroValidation",
        "FSDP2Strategy",
        "DistMuonAdamW",
    } <= names
    assert set(FUNCTION_COMMANDS) <= {f.__name__ for f in FUNCTIONS}


def _restricted_types() -> set[type]:
    from typing import get_args

    found: set[type] = set()

    def walk(tp: Any) -> None:
        if is_domain(tp):
            found.add(tp)
        for a in get_args(tp):
            walk(a)

    for _, fn in _owners():
        for _, tp, _ in parameters(fn):
            walk(tp)
    return found


def test_the_parser_hands_out_plain_values(places, tmp_path):
    """A parsed value is a plain int / float / str, never an instance of its restricted type: a checkpoint that
    pickled one (a callback's state, a module's hyperparameters) could not be read with weights_only=True."""
    import io

    from jsonargparse import ArgumentParser

    import distlab.cli.parser_types  # noqa: F401

    types = _restricted_types()
    assert len(types) >= 10
    for tp in types:
        parser = ArgumentParser(exit_on_error=False)
        parser.add_argument("--x", type=tp)
        value = parser.parse_args([f"--x={cli_text(inside_value(tp, places))}"]).x
        assert type(value) in (int, float, str), f"{tp.__name__} parsed to a {type(value).__name__}"
        buffer = io.BytesIO()
        torch.save({"x": value}, buffer)
        buffer.seek(0)
        assert torch.load(buffer, weights_only=True) == {"x": value}


# ---- 2. the CLI refuses every outside value ---------------------------------------------------------------
def _cli_cases() -> list[tuple[str, str, Any, str, Any]]:
    """(id, where, owner, parameter, type) for one parameter a command line can set per declared type (the parser
    reads every declaration the same way: one of each shows the declarations reach it)."""
    cases, seen = [], set()
    candidates = [(cls, name, tp, "class") for cls in CLASSES if issubclass(cls, CLI_BASES)
                  for name, tp, _ in parameters(cls.__init__)]  # fmt: skip
    candidates += [
        (fn, name, tp, "command") for fn in FUNCTION_COMMANDS.values() for name, tp, _ in parameters(fn)
    ]
    for owner, name, tp, where in candidates:
        if repr(tp) in seen:
            continue
        seen.add(repr(tp))
        label = owner.__name__
        cases.append((f"{label}.{name}", where, owner, name, tp))
    return cases


CLI_CASES = _cli_cases()


def _required(fn: Any, places: Places, but: str) -> dict[str, Any]:
    """Values inside the domain for the required parameters of ``fn`` other than ``but``."""
    return {
        name: inside_value(tp, places)
        for name, tp, default in parameters(fn)
        if default is inspect.Parameter.empty and name != but
    }


def _args(
    where: str, owner: Any, name: str, value: Any, places: Places, run: Path, trainer_only: Path
) -> list[str]:
    text = cli_text(value)
    if where == "command":
        command = next(c for c, fn in FUNCTION_COMMANDS.items() if fn is owner)
        given = _required(owner, places, but=name)
        if command == "export" and "out" in given:
            given["out"] = str(run) + ".safetensors"
        return [command, *(f"--{k}={cli_text(v)}" for k, v in given.items()), f"--{name}={text}"]
    base = ["fit", "--config", str(trainer_only), f"--trainer.default_root_dir={run}"]
    required = [(k, cli_text(v)) for k, v in _required(owner.__init__, places, but=name).items()]
    if issubclass(owner, L.LightningModule):
        return [*base, "--model", _path(owner), f"--model.{name}={text}"]
    if issubclass(owner, L.LightningDataModule):
        return [*base, "--data", _path(owner), f"--data.{name}={text}"]
    if issubclass(owner, L.Callback):
        pre = [f"--trainer.callbacks.{k}={v}" for k, v in required]
        return [*base, f"--trainer.callbacks+={_path(owner)}", *pre, f"--trainer.callbacks.{name}={text}"]
    return [*base, f"--trainer.strategy={_path(owner)}", f"--trainer.strategy.{name}={text}"]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_the_cli_refuses_every_value_outside_the_domain(
    case, places, earlier_run, trainer_only, tmp_path, capsys
):
    _, where, owner, name, tp = case
    # (text a terminal cannot hand over as UTF-8 reaches jsonargparse as surrogates, which it cannot print)
    values = [v for v in outside_values(tp, places) if not (isinstance(v, str) and not _utf8(v))][:2]
    if not values:
        pytest.skip(f"{case[0]}: every value outside {tp!r} is text a command line cannot carry")
    assert values, f"no value outside {tp!r} was found for {case[0]}: the generator must know this type"
    before_earlier, before_places = _snapshot(earlier_run), _snapshot(Path(places.a_folder).parent)
    for value in values:
        run = tmp_path / "run"
        args = _args(where, owner, name, value, places, run, trainer_only)
        line, shown = refused_in_one_line(args, name, capsys)
        assert len(line) < 500, f"not one short line ({len(line)} characters): {line}"
        assert not run.exists() and not Path(str(run) + ".safetensors").exists(), (
            f"{shown}: something was written"
        )
        COUNTS["cli values"] += 1
    assert _snapshot(earlier_run) == before_earlier, "an earlier run was changed"
    assert _snapshot(Path(places.a_folder).parent) == before_places, "a file was written next to the inputs"


# ---- 3. from Python, the same declaration holds ---------------------------------------------------------------
def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _python_required(fn: Any, name: str, places: Places) -> dict[str, Any]:
    out = {}
    for pname, tp, default in parameters(fn):
        if default is not inspect.Parameter.empty or pname == name:
            continue
        if pname in ("params", "param_groups"):
            out[pname] = [torch.nn.Parameter(torch.zeros(3, 3))]
        elif pname == "idx":  # GPT.generate's prompt
            out[pname] = torch.tensor([[1, 2]])
        elif pname == "model":
            out[pname] = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
        else:
            out[pname] = inside_value(tp, places)
    return out


def _python_cases() -> list[tuple[str, Any, str, Any]]:
    cases = []
    for label, fn in _owners():
        for name, tp, _ in parameters(fn):
            if any(isinstance(a, Checked) for a in getattr(tp, "__metadata__", ())):
                continue  # structured: checked where it is used (the optimizer tests cover param groups)
            cases.append((f"{label}.{name}", fn, name, tp))
    return cases


PYTHON_CASES = _python_cases()


@pytest.mark.parametrize("case", PYTHON_CASES, ids=[c[0] for c in PYTHON_CASES])
def test_python_construction_refuses_every_value_outside_the_domain(case, places):
    label, fn, name, tp = case
    target = next((c for c in CLASSES if c.__init__ is fn), fn)
    kwargs = _python_required(fn, name, places)
    for value in outside_values(tp, places):
        with pytest.raises(ConfigError) as info:
            target(**kwargs, **{name: value})
        message = str(info.value)
        assert "\n" not in message and name in message, f"{label}={value!r}: {message}"
        COUNTS["python values"] += 1


def test_zz_print_the_generated_suites_size(capsys):
    """The closing count (runs last in this module): how many parameters and values the suites walked."""
    n_params = sum(len(parameters(fn)) for _, fn in _owners())
    line = (
        f"generated bad-input suite: {len(CLASSES)} classes + {len(FUNCTIONS)} functions, {n_params} parameters "
        f"declared; {len(CLI_CASES)} declared types through the CLI ({COUNTS['cli values']} outside values refused), "
        f"{len(PYTHON_CASES)} Python parameters ({COUNTS['python values']} outside values refused)"
    )
    with capsys.disabled():
        print("\n" + line)
    assert len(CLI_CASES) >= 20 and len(PYTHON_CASES) >= 100


def test_a_number_given_as_text_from_python_is_called_text():
    """'0.02' read from a file or os.environ looks like a valid number when printed bare: the line says it is a str."""
    from distlab.callbacks import SpeedMonitor
    from distlab.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"every_n_steps=50 is not accepted \(it is the str '50', not a number\)"
    ):
        SpeedMonitor(every_n_steps="50")
