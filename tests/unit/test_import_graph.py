"""distlab's modules import one way: no cycle, however an import is written (top level, under TYPE_CHECKING, or
inside a function), and the optimizer's communication and math modules never reach back into the optimizer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "distlab"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The distlab module a dotted import name lands in (a package's __init__ for a name it defines)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """Every distlab module ``module`` imports, anywhere in its file."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {_owner(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:  # `from pkg import module` depends on that module, not only on pkg
                found.add(
                    _owner(f"{base}.{alias.name}") if f"{base}.{alias.name}" in MODULES else _owner(base)
                )
    return {m for m in found if m and m != module}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_checker_finds_a_cycle_hidden_under_type_checking():
    """The oracle itself: a back-import under TYPE_CHECKING or inside a function still closes a cycle."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    # the optimizer's own modules are found and resolved as the real ones
    assert "distlab.optim.layout" in imports_of("distlab.optim.zero1_comm")


def test_distlab_has_no_import_cycle():
    graph = {m: imports_of(m) for m in MODULES}
    assert cycles(graph) == []


@pytest.mark.parametrize(
    "module", ["distlab.optim.zero1_comm", "distlab.optim.fsdp2_comm", "distlab.optim.functional"]
)
def test_communication_and_math_never_see_the_optimizer(module):
    """The comm modules take tensors and a layout, the math module takes tensors: neither imports the optimizer,
    names it, or reads an ``opt`` / ``optimizer`` object's attributes."""
    assert not imports_of(module) & {"distlab.optim", "distlab.optim.dist_optim"}
    tree = ast.parse(MODULES[module].read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    attrs = {
        n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }
    assert not names & {"DistMuonAdamW", "DistMuon", "DistAdamW"}
    assert not attrs & {"opt", "optimizer"}


def test_the_math_module_issues_no_collective():
    assert not {m for m in imports_of("distlab.optim.functional") if m.startswith("distlab.distributed")}
    source = MODULES["distlab.optim.functional"].read_text()
    assert "torch.distributed" not in source


def _external_imports(module: str) -> set[str]:
    """Every non-distlab module ``module`` imports, anywhere in its file (top-level names and dotted ones)."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
    return {m for m in found if not m.startswith("distlab")}


def test_only_the_cli_package_imports_the_parser_or_the_cli():
    """The core stands alone: nothing outside distlab/cli/ imports jsonargparse, Lightning's CLI or distlab.cli, so a
    Python user's Trainer gets every rule from the classes themselves and no parser is needed to use them."""
    offenders = []
    for module in MODULES:
        if module == "distlab.cli" or module.startswith("distlab.cli.") or module == "distlab.__main__":
            continue
        external = _external_imports(module)
        parser = sorted(
            m for m in external if m.split(".")[0] == "jsonargparse" or m.startswith("lightning.pytorch.cli")
        )
        cli = sorted(m for m in imports_of(module) if m == "distlab.cli" or m.startswith("distlab.cli."))
        if parser or cli:
            offenders.append(f"{module}: {parser + cli}")
    assert not offenders, "outside distlab/cli/:\n" + "\n".join(offenders)


def test_the_import_check_finds_an_import_of_the_parser():
    """The check has teeth: a module text that imports jsonargparse inside a function is found."""
    tree = ast.parse("def f():\n    from jsonargparse.typing import register_type\n")
    found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "jsonargparse.typing" in found


def test_importing_the_optimizers_loads_neither_the_parser_nor_the_cli():
    """In a fresh interpreter: ``import distlab.optim`` brings no jsonargparse and no distlab.cli."""
    import subprocess
    import sys

    code = "import sys, distlab.optim; print(sorted(m for m in sys.modules if m.split('.')[0] == 'jsonargparse' or m.startswith('distlab.cli')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.strip() == "[]", out.stdout


def test_both_communications_implement_the_declared_interface():
    """Zero1Comm and FSDP2Comm are interchangeable to the step: each has every method of the Comm protocol with its
    parameters (keyword-only ones by name), and sets every attribute it declares."""
    import inspect

    from distlab.optim.fsdp2_comm import FSDP2Comm
    from distlab.optim.layout import Comm
    from distlab.optim.zero1_comm import Zero1Comm

    methods = {n: f for n, f in vars(Comm).items() if inspect.isfunction(f) and not n.startswith("_")}
    assert len(methods) >= 6
    for cls in (Zero1Comm, FSDP2Comm):
        for name, declared in methods.items():
            assert hasattr(cls, name), f"{cls.__name__} lacks {name}"
            want = list(inspect.signature(declared).parameters)
            got = list(inspect.signature(getattr(cls, name)).parameters)
            if isinstance(inspect.getattr_static(cls, name), staticmethod):
                got = ["self", *got]
            assert got == want, f"{cls.__name__}.{name}{got} is not the protocol's {want}"
        source = inspect.getsource(cls)
        for attr in Comm.__annotations__:
            assert f"self.{attr}" in source or f"    {attr} = " in source, f"{cls.__name__} never sets {attr}"
