"""Lightning's own callbacks, loggers and profilers, as users put them in configs: every argument has a declared
domain, and every value outside it is refused through the real CLI before anything is written.

The walk is over the installed Lightning (every class ``lightning.pytorch.callbacks`` / ``.loggers`` /
``.profilers`` exports): an argument whose annotation does not say its values (a plain ``int``, ``float``,
``str``) and that has no entry in :data:`distlab.lightning_domains.CLASS_DOMAINS` fails here, so a Lightning
release's new argument is noticed, not silently accepted. The outside values are derived from each declared
domain (tests/helpers/domains.py), not listed.
"""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Any

import lightning
import lightning.pytorch.callbacks
import lightning.pytorch.loggers
import lightning.pytorch.profilers
import pytest
import yaml

from distlab.cli import main
from distlab.cli_errors import LIGHTNING_1_TRAINER_OPTIONS
from distlab.domains import is_declared
from distlab.lightning_domains import CLASS_DOMAINS, PASSED_ON, domains_of
from tests.helpers.cli import CONFIGS
from tests.helpers.domains import Places, cli_text, inside_value, outside_values, refused_in_one_line

PACKAGES = {
    "callbacks": lightning.pytorch.callbacks,
    "logger": lightning.pytorch.loggers,
    "profiler": lightning.pytorch.profilers,
}


def _classes() -> list[tuple[str, type]]:
    """(the Trainer argument it goes in, class) for every class the three packages export."""
    out = []
    for where, pkg in PACKAGES.items():
        for name in pkg.__all__:
            obj = getattr(pkg, name)
            if isinstance(obj, type):
                out.append((where, obj))
    return out


CLASSES = _classes()


def _annotations(cls: type) -> dict[str, Any]:
    """Each argument's annotation; one that cannot be resolved (a forward reference to an optional package's
    class, as WandbLogger's) counts as saying nothing."""
    try:
        return typing.get_type_hints(cls.__init__)
    except NameError:  # resolve the others one by one
        import sys

        namespace = vars(sys.modules[cls.__module__])
        out = {}
        for name, p in inspect.signature(cls.__init__).parameters.items():
            try:
                out[name] = eval(p.annotation, namespace) if isinstance(p.annotation, str) else p.annotation  # noqa: S307
            except NameError:
                continue
        return out


def _arguments(cls: type) -> list[str]:
    return [
        n
        for n, p in inspect.signature(cls.__init__).parameters.items()
        if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def test_every_lightning_argument_has_a_domain():
    hints_missing = []
    for _, cls in CLASSES:
        hints, declared = _annotations(cls), domains_of(cls)
        for name in _arguments(cls):
            if name in declared:
                domain = declared[name]
                assert domain == PASSED_ON or is_declared(domain), f"{cls.__name__}.{name}: {domain!r}"
            elif not is_declared(hints.get(name, inspect.Parameter.empty)):
                hints_missing.append(f"{cls.__name__}.{name}: {hints.get(name, 'unresolved')}")
    assert not hints_missing, (
        "Lightning arguments whose annotation admits nonsense and that have no domain in "
        f"distlab/lightning_domains.py CLASS_DOMAINS: {hints_missing}"
    )


def test_every_entry_names_an_argument_lightning_has():
    """No stale entry: each class named exists in the three packages and has each argument named."""
    exported = {cls.__name__: cls for _, cls in CLASSES}
    for owner, entries in CLASS_DOMAINS.items():
        assert owner in exported, f"CLASS_DOMAINS names {owner}, which Lightning does not export"
        missing = set(entries) - set(_arguments(exported[owner]))
        assert not missing, f"CLASS_DOMAINS[{owner!r}] names arguments {owner} lacks: {missing}"


def _trainer_takes(where: str, cls: type) -> bool:
    """Whether the Trainer's annotation for ``where`` accepts ``cls`` (this Lightning's LitLogger derives from
    lightning.fabric's Logger, so no Trainer takes it: the parser refuses it in one line, tested below)."""
    import lightning as L

    def classes(hint: Any) -> list[type]:
        if isinstance(hint, type):
            return [hint]
        return [c for a in typing.get_args(hint) for c in classes(a)]

    hint = typing.get_type_hints(L.Trainer.__init__)[where]
    return any(issubclass(cls, base) for base in classes(hint) if base not in (bool, str, type(None)))


def _cases() -> list[tuple[str, str, type, str, Any]]:
    """(id, Trainer argument, a concrete class that takes it, argument, domain) for every declared entry."""
    cases = []
    for owner, entries in CLASS_DOMAINS.items():
        candidates = [
            (w, c) for w, c in CLASSES if owner in {b.__name__ for b in c.__mro__} and _trainer_takes(w, c)
        ]
        if not candidates:
            continue
        where, cls = next(
            ((w, c) for w, c in candidates if not inspect.isabstract(c) and c.__name__ == owner), None
        ) or next((w, c) for w, c in candidates if not inspect.isabstract(c))
        for name, domain in entries.items():
            if domain != PASSED_ON:
                cases.append((f"{cls.__name__}.{name}", where, cls, name, domain))
    return cases


CASES = _cases()
REFUSED: list[Any] = []


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> Places:
    return Places.under(tmp_path_factory.mktemp("places"))


@pytest.fixture(scope="module")
def trainer_only(tmp_path_factory) -> Path:
    cfg = yaml.safe_load((CONFIGS / "debug.yaml").read_text())
    path = tmp_path_factory.mktemp("configs") / "debug_trainer.yaml"
    cfg["trainer"].pop("callbacks", None)
    path.write_text(yaml.safe_dump(cfg))
    return path


def _outside_at_the_cli(cls: type, name: str, domain: Any, value: Any) -> bool:
    """Whether ``value``, typed on a command line, is outside ``domain``: Lightning's own annotation either
    refuses it or turns it into something outside (``version=1.5`` becomes the text "1.5": a valid version)."""
    from jsonargparse import ArgumentParser

    from distlab.domains import conforms

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--x", type=_annotations(cls).get(name, Any))
    try:
        parsed = parser.parse_args([f"--x={cli_text(value)}"]).x
    except Exception:  # noqa: BLE001 - the parser refuses it
        return True
    return not conforms(domain, parsed)


def _required(cls: type, but: str, places: Places) -> list[tuple[str, str]]:
    """Inside values for ``cls``'s required arguments other than ``but`` (from their declared domains)."""
    declared, out = domains_of(cls), []
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name in ("self", but) or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not p.empty:
            continue
        out.append((name, cli_text(inside_value(declared.get(name, _annotations(cls).get(name)), places))))
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_cli_refuses_lightning_values_outside_their_domain(case, places, trainer_only, tmp_path, capsys):
    _, where, cls, name, domain = case
    values = [v for v in outside_values(domain, places) if _outside_at_the_cli(cls, name, domain, v)]
    assert values, f"no value outside {domain!r} was found for {case[0]}"
    class_path = f"{cls.__module__.split('.')[0]}.pytorch.{where if where != 'logger' else 'loggers'}"
    class_path = f"{class_path.replace('.profiler', '.profilers')}.{cls.__name__}"
    add = "+=" if where == "callbacks" else "="
    for value in values:
        run = tmp_path / "run"
        args = [
            "fit",
            "--config",
            str(trainer_only),
            f"--trainer.default_root_dir={run}",
            f"--trainer.{where}{add}{class_path}",
            *(f"--trainer.{where}.{k}={v}" for k, v in _required(cls, name, places)),
            f"--trainer.{where}.{name}={cli_text(value)}",
        ]
        _, shown = refused_in_one_line(args, name, capsys)
        assert not run.exists(), f"{shown}: something was written"
        REFUSED.append(value)


UNTAKEN = [(w, c) for w, c in CLASSES if not inspect.isabstract(c) and not _trainer_takes(w, c)]


@pytest.mark.parametrize("entry", UNTAKEN, ids=[c.__name__ for _, c in UNTAKEN])
def test_a_class_the_trainer_cannot_take_is_refused_in_one_line(entry, trainer_only, tmp_path, capsys):
    where, cls = entry
    add = "+=" if where == "callbacks" else "="
    with pytest.raises(SystemExit) as info:
        main(
            [
                "fit",
                "--config",
                str(trainer_only),
                f"--trainer.default_root_dir={tmp_path / 'run'}",
                f"--trainer.{where}{add}{cls.__name__}",
            ]
        )
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("distlab: error:")]
    assert info.value.code == 2 and len(lines) == 1, lines
    assert f"{cls.__name__} is not a" in lines[0], lines[0]


def test_zz_print_the_walk(capsys):
    """The closing count (runs last in this module)."""
    n_args = sum(len(_arguments(c)) for _, c in CLASSES)
    with capsys.disabled():
        print(
            f"\nLightning's callbacks/loggers/profilers: {len(CLASSES)} classes, {n_args} arguments walked; "
            f"{len(CASES)} declared domains fed through the CLI ({len(REFUSED)} outside values refused)"
        )
    assert len(CASES) >= 80


TRAINER_ARGUMENTS = [n for n in inspect.signature(lightning.Trainer.__init__).parameters if n != "self"]


@pytest.mark.parametrize("option", sorted(LIGHTNING_1_TRAINER_OPTIONS))
def test_a_lightning_1_trainer_argument_is_named_with_what_replaced_it(option, tmp_path, capsys):
    """Every removed argument in the table is absent from the installed Trainer (a Lightning that brings one back
    fails here), and the CLI names what replaced it, from the command line and from a config file."""
    assert option not in TRAINER_ARGUMENTS, (
        f"Lightning {lightning.__version__} has Trainer({option}=...) again"
    )
    base = ["fit", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={tmp_path / 'run'}"]
    line, _ = refused_in_one_line([*base, f"--trainer.{option}=1"], f"trainer.{option}=1", capsys)
    assert LIGHTNING_1_TRAINER_OPTIONS[option] in line and "Lightning 1.x" in line, line
    config = tmp_path / "old.yaml"
    config.write_text(yaml.safe_dump({"trainer": {option: 1}}))
    line, _ = refused_in_one_line([*base, "--config", str(config)], f"trainer.{option}", capsys)
    assert LIGHTNING_1_TRAINER_OPTIONS[option] in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argument", TRAINER_ARGUMENTS)
def test_a_misspelt_trainer_argument_is_named_with_the_nearest_one(argument, tmp_path, capsys):
    """Each Trainer argument of the installed Lightning with its last two letters swapped (not a prefix, which
    argparse takes as an abbreviation): one line that names the argument meant."""
    typo = argument[:-2] + argument[-1] + argument[-2]
    args = ["fit", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={tmp_path / 'run'}"]
    line, shown = refused_in_one_line([*args, f"--trainer.{typo}=1"], f"trainer.{typo}=1", capsys)
    assert f"is not a Trainer argument (did you mean {argument!r}?)" in line, shown


def test_each_lightning_default_lies_in_its_declared_domain():
    """A domain that refuses the class's own default refuses a user who never set the argument (SWA's
    ``device=torch.device('cpu')`` was refused so): every default Lightning declares must conform."""
    from distlab.domains import conforms

    outside = []
    for _, cls in CLASSES:
        declared = domains_of(cls)
        for name, p in inspect.signature(cls.__init__).parameters.items():
            domain = declared.get(name)
            if domain is None or domain == PASSED_ON or p.default is p.empty:
                continue
            if not conforms(domain, p.default):
                outside.append(f"{cls.__name__}.{name}={p.default!r} (declared {domain!r})")
    assert not outside, f"Lightning defaults outside distlab's declared domains: {outside}"
