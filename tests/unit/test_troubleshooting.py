"""TROUBLESHOOTING.md cannot drift from the code.

- Every test it cites (``tests/....py::name``, optionally ``[param id]``) exists: the file, and a test
  function or class of that name in it; a ``✓ `row``` cites a row of the golden refusals
  (tests/cli/test_refusals.py). Every other repository path it names (configs/, scripts/, distlab/)
  exists.
- Every message it presents as distlab's is in distlab's source. Convention: the tables whose header
  starts ``| distlab message |``; their first cell's backticked text is the message, ``…`` standing for
  a value (quotes included). Split on ``…``, each piece of 8 or more characters must appear in a string
  literal under distlab/ (implicit concatenation and f-strings joined, their fields read as ``…``) or in
  its source text. A cell tagged ``(Lightning)``, ``(jsonargparse)``, ``(argparse)`` or ``(torch)`` quotes
  another package and is not checked here (its ✓ row checks the CLI output).

Pure text work: no distlab import, well under a second.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from tests.helpers.cli import REPO

DOC = REPO / "TROUBLESHOOTING.md"
BAD_INPUTS = "tests/cli/test_refusals.py"  # its GOLDEN rows, cited as ✓ `row id`
FOREIGN = re.compile(r"\((Lightning|jsonargparse|argparse|torch)\)")
TEST_REF = re.compile(r"(tests/[\w/]+\.py)(?:::(\w+)(?:\[([^\]`]+)\])?)?")
REPO_PATH = re.compile(r"(?<![\w/.])((?:configs|scripts|distlab)/[\w/.=-]*\w)")
ROW_REF = re.compile(r"✓ `([^`]+)`")
MIN_PIECE = 8


def _cells(line: str) -> list[str]:
    """A markdown table row's cells; a ``|`` inside a backtick span does not split."""
    cells, cur, in_code = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [*cells, cur.strip()]


def distlab_rows(text: str) -> list[tuple[int, list[str]]]:
    """(line number, cells) of every row of every ``| distlab message |`` table."""
    rows, in_table = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            in_table = False
            continue
        cells = _cells(line)
        if cells[0].lower() == "distlab message":
            in_table = True
        elif in_table and not set(cells[0]) <= set("-: "):
            rows.append((n, cells))
    return rows


def _literal_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
    return None


@functools.cache
def distlab_source() -> str:
    """distlab/**/*.py and scripts/*.py as written, plus every string literal as Python joins it (f-string
    fields -> …)."""
    parts = []
    for path in [*sorted((REPO / "distlab").rglob("*.py")), *sorted((REPO / "scripts").glob("*.py"))]:
        source = path.read_text()
        parts.append(source)
        parts += [t for node in ast.walk(ast.parse(source)) if (t := _literal_text(node)) is not None]
    return "\n".join(parts)


def message_problems(text: str) -> list[str]:
    source = distlab_source()
    problems = []
    for n, cells in distlab_rows(text):
        if FOREIGN.search(cells[0]):
            continue
        fragments = re.findall(r"`([^`]+)`", cells[0])
        if not fragments:
            problems.append(f"line {n}: no `message` in the first cell: {cells[0]!r}")
        for fragment in fragments:
            pieces = [p for p in fragment.split("…") if len(p.strip()) >= MIN_PIECE]
            if not pieces:
                problems.append(f"line {n}: {fragment!r} has no piece of {MIN_PIECE}+ characters to check")
            problems += [
                f"line {n}: {p!r} (of {fragment!r}) is not in distlab/" for p in pieces if p not in source
            ]
    return problems


def _defines(path: Path, name: str) -> bool:
    return (
        re.search(rf"^\s*(?:async\s+def|def|class)\s+{re.escape(name)}\b", path.read_text(), re.M) is not None
    )


def reference_problems(text: str) -> list[str]:
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in TEST_REF.finditer(line):
            rel, name, param = m.groups()
            path = REPO / rel
            if not path.is_file():
                problems.append(f"line {n}: {rel} does not exist")
            elif name and not _defines(path, name):
                problems.append(f"line {n}: {rel} defines no test {name!r}")
            elif param and param not in path.read_text():
                problems.append(f"line {n}: {rel} has no parameter id {param!r}")
        bad_inputs = (REPO / BAD_INPUTS).read_text()
        for row in ROW_REF.findall(line):
            if f'("{row}",' not in bad_inputs:  # a GOLDEN row's id
                problems.append(f"line {n}: ✓ `{row}` is not a row of {BAD_INPUTS}")
        for rel in REPO_PATH.findall(line):
            if not (REPO / rel).exists():
                problems.append(f"line {n}: {rel} does not exist")
    return problems


def test_the_guide_has_its_tables():
    """The parsing convention still matches the guide (else the checks below would pass vacuously)."""
    rows = distlab_rows(DOC.read_text())
    assert len(rows) >= 60, f"only {len(rows)} distlab-message rows found: did the table header change?"
    checked = [cells for _, cells in rows if not FOREIGN.search(cells[0])]
    assert len(checked) >= 50
    for _, cells in rows:
        test_cell = cells[-1]
        assert len(cells) == 4, cells
        assert test_cell == "—" or TEST_REF.search(test_cell) or ROW_REF.search(test_cell), cells


def test_every_distlab_message_is_in_the_source():
    problems = message_problems(DOC.read_text())
    assert not problems, "\n".join(problems)


def test_every_cited_test_and_path_exists():
    problems = reference_problems(DOC.read_text())
    assert not problems, "\n".join(problems)
