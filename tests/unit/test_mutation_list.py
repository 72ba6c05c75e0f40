"""scripts/mutation_check.py's bugs still apply to the code: each edit's text occurs exactly once, and each
selection names test files that exist (a refactor must update the list, never silently retire a bug)."""

from __future__ import annotations

import importlib.util
import sys

from tests.helpers.cli import REPO


def load_script():
    spec = importlib.util.spec_from_file_location("mutation_check", REPO / "scripts" / "mutation_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_mutation_applies_and_names_existing_tests():
    mc = load_script()
    names = [m.name for m in mc.MUTATIONS]
    assert len(names) == len(set(names)) >= 20
    for m in mc.MUTATIONS:
        assert mc.applicable(m) == [], m.name
        files = [t for t in m.tests if t.startswith("tests/")]
        assert files and all((REPO / f.split("::")[0]).is_file() for f in files), m.name
        assert all(old != new for _, old, new in m.edits), m.name
