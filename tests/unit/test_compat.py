"""The version contract: the ranges ``import distlab`` enforces are the ones pyproject.toml declares (read back
from distlab's installed metadata, so they cannot drift), and a version outside them is one line.
(That the declared bounds really run is make test-versions: scripts/check_versions.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement

from distlab.versions import (
    COMPROMISED,
    CompromisedReleaseError,
    UntestedVersionError,
    check_compromised,
    check_versions,
    declared_ranges,
    outside_ranges,
)
from tests.helpers.cli import REPO


def test_the_enforced_ranges_are_pyprojects():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    expected = {Requirement(r).name: Requirement(r).specifier for r in declared}
    found = {name: Requirement(f"{name}{spec}").specifier for name, spec in declared_ranges().items()}
    assert found == expected, "reinstall distlab (make setup) after editing pyproject.toml's dependencies"
    assert all(">=" in str(s) and "<" in str(s) for s in expected.values()), "each range needs both bounds"


def test_this_environment_is_inside_the_ranges():
    assert outside_ranges() == []


def test_a_version_outside_its_range_is_one_line(monkeypatch):
    monkeypatch.delenv("DISTLAB_ALLOW_UNTESTED", raising=False)
    with pytest.raises(UntestedVersionError) as info:
        check_versions({"lightning": ">=99"})
    message = str(info.value)
    assert (
        "\n" not in message
        and "supported: lightning>=99" in message
        and "pip install 'lightning>=99'" in message
    )
    monkeypatch.setenv("DISTLAB_ALLOW_UNTESTED", "1")
    with pytest.warns(UserWarning, match="supported: lightning>=99"):
        check_versions({"lightning": ">=99"})


def test_the_distlab_command_says_it_in_one_line_and_exits_2():
    code = (
        "import sys; sys.argv = ['distlab']; import distlab.versions as c; c.check_versions({'torch': '<1'})"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert (
        line.startswith("distlab: error: distlab is tested with other versions")
        and "supported: torch<1" in line
    )


def plant_release(root, name: str, version: str, marker) -> None:
    """An installed-looking ``name`` ``version`` under ``root`` whose import writes ``marker`` (the payload's stand-in)."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    package = root / name.replace("-", "_")
    package.mkdir()
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")


@pytest.mark.parametrize("name", ["lightning", "pytorch-lightning"])
@pytest.mark.parametrize("version", ["2.6.2", "2.6.3"])
@pytest.mark.parametrize("cli", [False, True], ids=["python", "cli"])
def test_a_compromised_release_is_refused_before_it_is_imported(tmp_path, name, version, cli):
    """lightning / pytorch-lightning 2.6.2 and 2.6.3 (malware, GHSA-w37p-236h-pfx3): ``import distlab`` refuses
    them in one line naming the advisory, even with DISTLAB_ALLOW_UNTESTED=1, and nothing of theirs runs."""
    marker = tmp_path / "payload-ran"
    plant_release(tmp_path / "site", name, version, marker)
    code = ("import sys; sys.argv = ['distlab']; " if cli else "") + "import distlab"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "DISTLAB_ALLOW_UNTESTED": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == (2 if cli else 1) and not marker.exists(), (out.returncode, out.stderr)
    last = out.stderr.strip().splitlines()[-1]
    assert f"{name} {version} is a compromised release (GHSA-w37p-236h-pfx3" in last, out.stderr
    if cli:
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    else:
        assert last.startswith("distlab.versions.CompromisedReleaseError:")


def test_a_release_next_to_the_compromised_ones_is_not_refused(tmp_path):
    """The check is by exact release: 2.6.6 (the range's floor) passes it, and so would 2.6.1 (the range refuses it)."""
    check_compromised({"lightning": "2.6.6", "pytorch-lightning": "2.6.1"})
    with pytest.raises(CompromisedReleaseError, match="pytorch-lightning 2.6.3"):
        check_compromised({"lightning": "2.6.6", "pytorch-lightning": "2.6.3"})


def test_the_declared_ranges_exclude_the_compromised_releases():
    from packaging.specifiers import SpecifierSet

    ranges = declared_ranges()
    for name, bad in COMPROMISED.items():
        assert name in ranges, f"{name} must be declared, so that pip cannot pick a compromised release of it"
        assert not any(SpecifierSet(ranges[name]).contains(v) for v in bad), (name, ranges[name])


def _distlab_names() -> set[str]:
    """Every private name distlab defines itself (functions, classes, attributes it assigns)."""
    import ast

    names: set[str] = set()
    for path in (REPO / "distlab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def test_private_apis_of_dependencies_live_in_compat_only():
    """No module but distlab/compat.py imports a private name of another package, reads or writes a private
    attribute distlab does not define, or names one in getattr/hasattr/setattr; the private hooks distlab's
    subclasses override are listed in compat.SUBCLASS_HOOKS. A new use fails here and goes to compat.py."""
    import ast

    own = _distlab_names()
    found = []
    for path in sorted((REPO / "distlab").rglob("*.py")):
        if path.name == "compat.py":
            continue
        rel = path.relative_to(REPO)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and not node.module.startswith("distlab"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private or any(
                    p.startswith("_") and not p.startswith("__") for p in node.module.split(".")
                ):
                    found.append(f"{rel}:{node.lineno} imports {node.module} {private}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if any(part.startswith("_") for part in a.name.split(".")):
                        found.append(f"{rel}:{node.lineno} imports {a.name}")
            elif (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                if node.attr not in own:
                    found.append(f"{rel}:{node.lineno} uses .{node.attr}")
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
                "getattr",
                "hasattr",
                "setattr",
            ):
                if len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                    name = node.args[1].value
                    if (
                        isinstance(name, str)
                        and name.startswith("_")
                        and not name.startswith("__")
                        and name not in own
                    ):
                        found.append(f"{rel}:{node.lineno} {node.func.id}(..., {name!r})")
    assert not found, "private APIs outside distlab/compat.py:\n" + "\n".join(found)


def test_overridden_private_hooks_are_declared():
    import importlib
    import inspect
    import pkgutil

    import distlab
    from distlab.compat import SUBCLASS_HOOKS

    overrides = set()
    for info in pkgutil.walk_packages(distlab.__path__, "distlab."):
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if not (inspect.isclass(cls) and cls.__module__ == module.__name__):
                continue
            for name in vars(cls):
                set_by_python = ("_abc_impl", "_is_protocol")  # abc's and typing's own
                if name.startswith("_") and not name.startswith("__") and name not in set_by_python:
                    foreign = [
                        b
                        for b in cls.__mro__[1:]
                        if not b.__module__.startswith("distlab") and name in vars(b)
                    ]
                    if foreign:
                        overrides.add(name)
    assert overrides <= set(SUBCLASS_HOOKS), (
        f"declare these in compat.SUBCLASS_HOOKS: {overrides - set(SUBCLASS_HOOKS)}"
    )


# A process in which Lightning's int-or-float annotations read float first, as they do where a package imported
# before Lightning built the float-first Union (typing caches Unions under keys that ignore order; Lightning
# #21259): the state is made here by building each annotation again, float first.
POISONED_CLI = """
import inspect, sys, typing
import lightning as L
from lightning.pytorch.callbacks import StochasticWeightAveraging

def float_first(fn):
    names = []
    for name, tp in fn.__annotations__.items():
        args = typing.get_args(tp) if typing.get_origin(tp) is typing.Union else ()
        if int in args and float in args:
            fn.__annotations__[name] = typing.Union[(float, *(a for a in args if a is not float))]
            names.append(name)
    return names

mixed = float_first(L.Trainer.__init__)
assert mixed and float_first(StochasticWeightAveraging.__init__) == ["swa_epoch_start"]
assert typing.get_args(inspect.signature(L.Trainer.__init__).parameters[mixed[0]].annotation)[0] is float
from distlab.cli import main
args = ["fit", "--config", sys.argv[1], "--trainer.max_steps=4", "--print_config"]
args += [f"--trainer.{n}=2" for n in mixed]
args += ["--trainer.callbacks+=StochasticWeightAveraging", "--trainer.callbacks.swa_lrs=0.1",
         "--trainer.callbacks.swa_epoch_start=2"]
print("MIXED", " ".join(mixed))
try:
    main(args)
except SystemExit as e:
    assert e.code in (0, None), e.code
"""


@pytest.mark.timeout(120)
def test_an_integer_for_an_int_or_float_argument_stays_an_integer_whatever_the_typing_cache_holds(tmp_path):
    """Every Trainer argument Lightning annotates int-or-float (found in its signature), and a callback's
    (StochasticWeightAveraging.swa_epoch_start): ``=2`` means 2 batches/epochs, never the fraction 2.0, even in a
    process where float-first Unions were built before Lightning was imported."""
    import yaml

    from tests.helpers.cli import CONFIGS

    script = tmp_path / "poisoned.py"
    script.write_text(POISONED_CLI)
    out = subprocess.run(
        [sys.executable, str(script), str(CONFIGS / "debug.yaml")],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    head, _, printed = out.stdout.partition("\n")
    mixed = head.removeprefix("MIXED ").split()
    config = yaml.safe_load(printed)
    for name in mixed:
        value = config["trainer"][name]
        assert value == 2 and type(value) is int, (name, value)
    swa = config["trainer"]["callbacks"][-1]["init_args"]["swa_epoch_start"]
    assert swa == 2 and type(swa) is int, swa
