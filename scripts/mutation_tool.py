"""Tool-generated mutants for `make mutation`: cosmic-ray's operators over distlab/, a seeded sample, and the
test files that cover each source file (derived from the tests' own references, never a hand list).

    python scripts/mutation_tool.py --count                 # mutants and sites per file
    python scripts/mutation_tool.py --covers distlab/optim/zero1_comm.py
    python scripts/mutation_tool.py --sample 5 --seed 1     # what a run would draw (no tests run)

scripts/mutation_check.py runs them. Why cosmic-ray and not mutmut: cosmic-ray's operators are plain
source-to-source edits (parso), so a mutant is one edited file in a temporary copy that spawned ranks,
torchrun workers and CLI subprocesses import like any other; mutmut 3 compiles every mutant of a file into
trampolines selected by an environment variable and records which tests reach which function in-process,
which misses what runs in spawned ranks, and its wrappers change the signatures jsonargparse reads.

A mutant's key (file, function, operator, the statement before and after, as ``ast.unparse`` writes them)
does not move when code elsewhere changes, so a triaged equivalent mutant (scripts/mutation_equivalents.py)
is recognised in later runs.
"""

from __future__ import annotations

import argparse
import ast
import copy
import functools
import random
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Every distlab module is mutated except the tests' own multi-rank harness and the `python -m` stub.
NOT_MUTATED = ("distlab/testing.py", "distlab/__main__.py")
# Operators that take arguments (VariableReplacer/VariableInserter) need a per-project configuration.
ARGUMENT_OPERATORS = ("core/VariableReplacer", "core/VariableInserter")
# What cosmic-ray's ExceptionReplacer writes needs cosmic-ray importable in every rank; this expression is the
# same mutant (a handler for an exception nobody raises) with nothing to import.
_NEVER_RAISED = "type('CosmicRayTestingException', (Exception,), {})"


def target_files() -> list[str]:
    """Repository-relative paths of the files mutants are drawn from."""
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "distlab").rglob("*.py"))
    return [f for f in files if f not in NOT_MUTATED]


def has_code(file: str) -> bool:
    """Whether ``file`` holds anything to mutate (not only imports, a docstring and ``__all__``)."""
    for node in _parse(REPO / file).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        ):
            continue
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
            continue
        return True
    return False


@functools.cache
def operators() -> tuple[tuple[str, object], ...]:
    import cosmic_ray.plugins

    out = []
    for name in cosmic_ray.plugins.operator_names():
        cls = cosmic_ray.plugins.get_operator(name)
        if name not in ARGUMENT_OPERATORS and not cls.arguments():
            out.append((name, cls()))
    return tuple(out)


def short_operator(name: str) -> str:
    return (
        name.split("/", 1)[1].replace("ReplaceBinaryOperator_", "").replace("ReplaceComparisonOperator_", "")
    )


# ---- where a mutant sits: its statement and function, from the standard ast ------------------------------
_BODIES = ("body", "orelse", "finalbody", "handlers", "cases")


def _header(stmt: ast.stmt) -> str:
    """A statement as ast.unparse writes it; a compound statement without its nested statements."""
    if not any(getattr(stmt, f, None) for f in _BODIES):
        return ast.unparse(stmt)
    node = copy.deepcopy(stmt)
    for sub in ast.walk(node):
        for f in _BODIES:
            block = getattr(sub, f, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                setattr(sub, f, [ast.Pass()] if f == "body" else [])
            elif f == "handlers" and block:
                for h in block:
                    h.body = [ast.Pass()]
    lines = [ln for ln in ast.unparse(node).splitlines() if ln.strip() != "pass"]
    return "\n".join(lines)


class SourceIndex:
    """Statements of one source text with their positions, functions and the lines that are not code to mutate."""

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.tree = ast.parse(text)
        self.stmts: list[tuple[tuple[int, int], tuple[int, int], tuple, ast.stmt, str]] = []
        self.skipped: list[tuple[tuple[int, int], tuple[int, int], str]] = []
        self._walk(self.tree, (), "")

    def _span(self, node: ast.AST) -> tuple[tuple[int, int], tuple[int, int]]:
        start = (node.lineno, node.col_offset)
        for d in getattr(node, "decorator_list", ()):  # a decorated definition starts at its first `@`
            start = min(start, (d.lineno, d.col_offset - 1))
        return start, (node.end_lineno, node.end_col_offset)

    def _skip(self, node: ast.AST | None, why: str) -> None:
        if node is not None:
            self.skipped.append((*self._span(node), why))

    def _walk(self, node: ast.AST, path: tuple, qual: str) -> None:
        for field, value in ast.iter_fields(node):
            items = value if isinstance(value, list) else [value]
            for i, child in enumerate(items):
                if not isinstance(child, ast.AST):
                    continue
                sub = (*path, (field, i))
                name = qual
                if isinstance(child, ast.stmt):
                    self.stmts.append((*self._span(child), sub, child, qual or "<module>"))
                    self._skip_non_code(child)
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{qual}.{child.name}" if qual else child.name
                if isinstance(child, ast.arg):
                    self._skip(child.annotation, "annotation")
                self._walk(child, sub, name)

    def _skip_non_code(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._skip(stmt.returns, "annotation")
        elif isinstance(stmt, ast.AnnAssign):
            self._skip(stmt.annotation, "annotation")
        elif isinstance(stmt, ast.If):
            test = ast.unparse(stmt.test)
            if test in ("TYPE_CHECKING", "typing.TYPE_CHECKING", "__name__ == '__main__'"):
                self._skip(stmt, "not run by the package")
        elif isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets
        ):
            self._skip(stmt, "__all__")

    def byte_col(self, line: int, col: int) -> int:
        """parso counts columns in characters, the ast in UTF-8 bytes."""
        return len(self.lines[line - 1][:col].encode())

    def skip_reason(self, line: int, col: int) -> str | None:
        pos = (line, self.byte_col(line, col))
        return next((why for a, b, why in self.skipped if a <= pos < b), None)

    def statement_at(self, line: int, col: int):
        """(path, statement, qualname) of the innermost statement holding the position."""
        pos = (line, self.byte_col(line, col))
        best = None
        for a, b, path, stmt, qual in self.stmts:
            if a <= pos < b and (best is None or len(path) > len(best[0])):
                best = (path, stmt, qual)
        if best and isinstance(best[1], (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            path, stmt, qual = best  # in a signature, a default or a decorator: that function's
            best = (path, stmt, stmt.name if qual == "<module>" else f"{qual}.{stmt.name}")
        return best

    def at_path(self, path: tuple) -> ast.stmt:
        node = self.tree
        for field, i in path:
            value = getattr(node, field)
            node = value[i] if isinstance(value, list) else value
        return node


@dataclass(frozen=True)
class Mutant:
    file: str  # repository-relative
    operator: str  # cosmic-ray's name, e.g. core/ReplaceBinaryOperator_Add_Sub
    occurrence: int  # cosmic-ray's index of this operator's positions in the file
    line: int
    col: int  # characters, as parso counts
    qualname: str  # the enclosing function or class (<module> at the top level)
    before: str  # the mutated statement (a compound statement's header) before the mutation
    variant: int = 0  # an operator's n-th mutation of one node (NumberReplacer: 0 is +1, 1 is -1)

    @property
    def name(self) -> str:
        """Unique in a run, and what --only takes: file:line:column operator[/variant]."""
        tail = f"/{self.variant}" if self.variant else ""
        return f"{self.file.removeprefix('distlab/')}:{self.line}:{self.col} {short_operator(self.operator)}{tail}"

    def mutated_source(self, text: str) -> str | None:
        """The file's text with this mutant applied (None when the position no longer exists)."""
        import cosmic_ray.plugins
        from cosmic_ray.mutating import mutate_code

        op = cosmic_ray.plugins.get_operator(self.operator)()
        out = mutate_code(text, op, self.occurrence)
        return None if out is None else out.replace("CosmicRayTestingException", _NEVER_RAISED)

    def after(self, text: str) -> str:
        """The mutated statement (header) after the mutation, as ast.unparse writes it."""
        index = SourceIndex(text)
        path, _, _ = index.statement_at(self.line, self.col)
        mutated = self.mutated_source(text)
        try:
            return _header(SourceIndex(mutated).at_path(path))
        except SyntaxError:
            return "<not valid Python>"

    def key(self, text: str) -> tuple[str, str, str, str, str]:
        return (self.file, self.qualname, short_operator(self.operator), self.before, self.after(text))


def enumerate_mutants(file: str, text: str | None = None) -> tuple[list[Mutant], dict[str, int]]:
    """Every cosmic-ray mutant of ``file`` on code that runs (returns them and the skipped counts by reason)."""
    from cosmic_ray.ast import ast_nodes, get_ast

    text = (REPO / file).read_text() if text is None else text
    index = SourceIndex(text)
    nodes = list(ast_nodes(get_ast(text)))
    mutants, skipped = [], defaultdict(int)
    for name, op in operators():
        occurrence = 0
        for node in nodes:
            for variant, ((line, col), _) in enumerate(op.mutation_positions(node)):
                why = index.skip_reason(line, col)
                if why:
                    skipped[why] += 1
                else:
                    found = index.statement_at(line, col)
                    if found is None:  # not inside any statement (cannot happen for parsed code)
                        skipped["outside a statement"] += 1
                    else:
                        _, stmt, qual = found
                        mutants.append(
                            Mutant(file, name, occurrence, line, col, qual, _header(stmt), variant)
                        )
                occurrence += 1
    return mutants, dict(skipped)


def all_mutants(files: list[str] | None = None) -> list[Mutant]:
    out = []
    for f in files or target_files():
        out.extend(enumerate_mutants(f)[0])
    return out


def draw(mutants: list[Mutant], n: int, seed: int) -> list[Mutant]:
    """``n`` mutants, spread over files and sites: files in a seeded order, round robin; in each file a site
    (a position any operator mutates) not drawn yet; at the site one of its operators. Drawing sites rather
    than mutants keeps the 11 replacements of one ``+`` from outweighing a lone ``if``."""
    rng = random.Random(seed)
    sites: dict[str, dict[tuple[int, int], list[Mutant]]] = defaultdict(lambda: defaultdict(list))
    for m in mutants:
        sites[m.file][(m.line, m.col)].append(m)
    files = sorted(sites)
    rng.shuffle(files)
    remaining = {f: sorted(sites[f]) for f in files}
    out: list[Mutant] = []
    while len(out) < n and any(remaining.values()):
        for f in files:
            if len(out) == n:
                break
            if remaining[f]:
                site = remaining[f].pop(rng.randrange(len(remaining[f])))
                out.append(rng.choice(sites[f][site]))
    return out


# ---- which test files cover a source file -------------------------------------------------------------------
# A test file covers a distlab module when the test, or a tests/ or scripts/ module it imports or names (jobs run
# on spawned ranks, helper modules, scripts run as subprocesses), or a configs/ YAML it names, refers to a name
# the module defines (an import, an attribute, a `distlab.x.Name` class path). A module no test refers to is
# covered through the modules that import it; the tests of its importers in its own package are added (a mutant in
# distlab/optim/zero1_comm.py is caught by tests that call DistMuonAdamW), those of importers in other packages only
# while the module has no test of its own (distlab/domains.py is imported everywhere). New tests and modules join by themselves;
# tests/unit/test_mutation_list.py fails when a mutated file resolves to no test.
_DOTTED = re.compile(r"\bdistlab(?:\.[A-Za-z_]\w*)+")
# Files that name every module without testing it (the mutation scripts and their own test).
_NOT_EVIDENCE = ("scripts/mutation_", "tests/unit/test_mutation_list.py")


def _modname(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    """The module an ``import from`` in ``path`` names, relative imports made absolute."""
    if not node.level:
        return node.module or ""
    package = _modname(path).split(".")
    package = package[: len(package) - node.level + (path.name == "__init__.py")]
    return ".".join([*package, *([node.module] if node.module else [])])


@functools.cache
def _distlab_index() -> tuple[dict[str, Path], dict[Path, dict[str, str]]]:
    """Module name -> file; file -> {top-level name: "" if defined there, else the dotted name it imports}."""
    files = sorted((REPO / "distlab").rglob("*.py"))
    names: dict[Path, dict[str, str]] = {}
    for p in files:
        table: dict[str, str] = {}
        for node in _parse(p).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                table[node.name] = ""
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    table.update((n.id, "") for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.ImportFrom):
                mod = _absolute(p, node)
                table.update((a.asname or a.name, f"{mod}.{a.name}") for a in node.names)
        names[p] = table
    return {_modname(p): p for p in files}, names


@functools.cache
def resolve(dotted: str) -> frozenset[Path]:
    """The distlab file defining what ``dotted`` names, re-exports followed (statically: nothing is imported)."""
    modules, names = _distlab_index()
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        mod = ".".join(parts[:i])
        if mod not in modules:
            continue
        base = modules[mod]
        if i == len(parts):
            return frozenset({base})
        target = names[base].get(parts[i])
        if target and target.split(".")[0] == "distlab" and target != dotted:
            return resolve(target) or frozenset({base})
        return frozenset({base})
    return frozenset()


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _exported(package: str) -> frozenset[Path]:
    """Every distlab file whose names ``package`` re-exports (a test iterating ``package.__all__`` uses all)."""
    modules, names = _distlab_index()
    base = modules.get(package)
    if base is None:
        return frozenset()
    out: set[Path] = set()
    for target in names[base].values():
        if target.split(".")[0] == "distlab":
            out |= resolve(target)
    return frozenset(out)


_ENV = re.compile(r"\bDISTLAB_[A-Z][A-Z_]*\b")


@functools.cache
def _env_readers() -> dict[str, frozenset[Path]]:
    """DISTLAB_* environment variable -> the distlab files whose code names it (the ones that read it)."""
    modules, _ = _distlab_index()
    out: dict[str, set[Path]] = defaultdict(set)
    for p in modules.values():
        for n in ast.walk(_parse(p)):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and _ENV.fullmatch(n.value):
                out[n.value].add(p)
    return {k: frozenset(v) for k, v in out.items()}


@functools.cache
def _references(path: Path) -> frozenset[Path]:
    return _tree_references(_parse(path))


def _tree_references(tree: ast.Module) -> frozenset[Path]:
    out: set[Path] = set()
    aliases: dict[str, str] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").split(".")[0] == "distlab":
            for a in n.names:
                out |= resolve(f"{n.module}.{a.name}")
        elif isinstance(n, ast.Import):
            for a in n.names:
                if a.name.split(".")[0] == "distlab":
                    aliases[a.asname or "distlab"] = a.name if a.asname else "distlab"
                    out |= resolve(a.name)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            for dotted in _DOTTED.findall(n.value):
                out |= resolve(dotted)
            for variable in _ENV.findall(
                n.value
            ):  # a test that sets DISTLAB_X covers the module that reads it
                out |= _env_readers().get(variable, frozenset())
            if (
                "distlab" in n.value and "import" in n.value
            ):  # a script run in a subprocess: its imports count
                try:
                    out |= _tree_references(ast.parse(n.value))
                except SyntaxError:
                    pass
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute):
            chain, x = [], n
            while isinstance(x, ast.Attribute):
                chain.append(x.attr)
                x = x.value
            if isinstance(x, ast.Name) and x.id in aliases:
                dotted = ".".join([aliases[x.id], *reversed(chain)])
                if dotted.endswith(".__all__"):
                    out |= _exported(dotted.removesuffix(".__all__"))
                else:
                    out |= resolve(dotted)
    return frozenset(out)


def _closure(test: Path) -> tuple[set[Path], set[Path]]:
    """The test file and the tests/ and scripts/ modules it imports or names; the configs/ files it names."""
    aux = {p.name: p for p in [*(REPO / "tests").rglob("*.py"), *(REPO / "scripts").glob("*.py")]}
    configs = REPO / "configs"
    seen: set[Path] = set()
    yamls: set[Path] = set()
    todo = [test]
    while todo:
        p = todo.pop()
        if p in seen or str(p.relative_to(REPO)).startswith(_NOT_EVIDENCE):
            continue
        seen.add(p)
        for n in ast.walk(_parse(p)):
            names = []
            if (
                isinstance(n, ast.ImportFrom)
                and n.level == 0
                and (n.module or "").split(".")[0] in ("tests", "scripts")
            ):
                names = [n.module, *(f"{n.module}.{a.name}" for a in n.names)]
            elif isinstance(n, ast.Import):
                names = [a.name for a in n.names if a.name.split(".")[0] in ("tests", "scripts")]
            for m in names:
                f = REPO / (m.replace(".", "/") + ".py")
                if f.is_file():
                    todo.append(f)
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                for piece in re.split(r"[\s/]", n.value):
                    if piece.endswith(".py") and piece in aux:
                        todo.append(aux[piece])
                    elif piece == "*.yaml":
                        yamls |= set(configs.rglob("*.yaml"))
                    elif piece.endswith(".yaml"):
                        yamls |= set(configs.rglob(piece))
    return seen, yamls


@functools.cache
def coverage_map() -> dict[str, tuple[str, ...]]:
    """distlab file -> the test files that cover it (repository-relative, sorted)."""
    modules, _ = _distlab_index()
    direct: dict[Path, set[Path]] = defaultdict(set)
    for test in sorted((REPO / "tests").rglob("test_*.py")):
        if str(test.relative_to(REPO)).startswith(_NOT_EVIDENCE):
            continue
        files, yamls = _closure(test)
        refs: set[Path] = set()
        for f in files:
            refs |= _references(f)
        for y in yamls:
            for dotted in _DOTTED.findall(y.read_text()):
                refs |= resolve(dotted)
        for r in refs:
            direct[r].add(test)
    importers: dict[Path, set[Path]] = defaultdict(set)
    for p in modules.values():
        for n in ast.walk(_parse(p)):
            targets: set[Path] = set()
            if isinstance(n, ast.ImportFrom):
                mod = _absolute(p, n)
                if mod.split(".")[0] == "distlab":
                    for a in n.names:
                        targets |= resolve(f"{mod}.{a.name}")
            elif isinstance(n, ast.Import):
                for a in n.names:
                    if a.name.split(".")[0] == "distlab":
                        targets |= resolve(a.name)
            for t in targets - {p}:
                # a package's __init__ re-exports; its tests (the public API's) are not the module's
                if p.name != "__init__.py":
                    importers[t].add(p)
    out = {}
    for p in modules.values():
        tests = set(direct[p]).union(*(direct[m] for m in importers[p] if m.parent == p.parent))
        level = {p}
        while not tests and level:  # up the import graph until some test is found
            level = set().union(*(importers[m] for m in level)) - {p}
            tests = set().union(*(direct[m] for m in level))
        out[str(p.relative_to(REPO))] = tuple(sorted(str(t.relative_to(REPO)) for t in tests))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", action="store_true", help="mutants and sites per file")
    parser.add_argument("--covers", nargs="+", metavar="FILE", help="the test files that cover these files")
    parser.add_argument("--sample", type=int, help="draw this many mutants and print them")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.covers:
        cov = coverage_map()
        for f in args.covers:
            print(f, *cov.get(f, ("(not a distlab file)",)), sep="\n  ")
    if args.count:
        for f in target_files():
            ms, skipped = enumerate_mutants(f)
            print(
                f"{f:45} {len(ms):5} mutants {len({(m.line, m.col) for m in ms}):4} sites  skipped {skipped}"
            )
    if args.sample:
        for m in draw(all_mutants(), args.sample, args.seed):
            text = (REPO / m.file).read_text()
            print(f"{m.name:50} {m.qualname:40} {m.before!r} -> {m.after(text)!r}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
