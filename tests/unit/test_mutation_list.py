"""`make mutation` stays in step with the code (scripts/mutation_check.py and its three modules):

- every named historic bug's anchor still resolves to exactly one place in the code it names, and names tests
  that exist (a refactor updates the anchor; no bug is retired silently);
- an anchor is code, not text: reformatting and comments do not move it;
- every distlab file that tool mutants are drawn from has test files that cover it (derived, not listed);
- every mutant triaged as equivalent still exists;
- a run that needed a timeout to end is a hang, never a catch.
"""

from __future__ import annotations

import ast
import importlib
import sys

import pytest

from tests.helpers.cli import REPO

sys.path.insert(0, str(REPO / "scripts"))
named = importlib.import_module("mutation_named")
tool = importlib.import_module("mutation_tool")
check = importlib.import_module("mutation_check")
equivalents = importlib.import_module("mutation_equivalents")

# The bugs planted by hand over the project's history: each stays (converted, not dropped) unless a named
# decision retires it here.
HISTORIC = {
    "sum_not_mean", "reduction_applied_twice", "gloo_reduce_scatter_keeps_own_chunk", "missing_all_gather",
    "wrong_owner_round_robin", "dropped_optimizer_shard_on_save", "auto_always_reduce", "auto_always_averaged",
    "kernel_lr_from_4d_shape", "newton_schulz_on_local_shard", "dcp_metadata_unpickled",
    "checkpoint_class_trusted", "restart_starts_over", "collective_errors_raw", "stop_request_ignored",
    "no_initial_broadcast", "fsdp2_no_initial_broadcast", "spawn_states_shared", "rzv_never_validates",
    "rzv_skips_last_batch", "rzv_drops_partial_batch", "mean_not_weighted", "padding_in_distributed_validation",
    "padding_pass_counts", "no_metric_sync", "no_agreement_check", "validate_uses_lightnings_loop",
    "collectives_not_forbidden", "sample_on_rank_zero_under_fsdp2", "nan_check_skipped", "early_stop_per_rank",
    "early_stop_at_epoch_end", "speed_counts_validation", "speed_ignores_accumulation",
    "speed_window_never_moves", "resume_deletes_log", "optimizer_flops_miss_a_matmul",
    "class_after_recipe_not_first", "monitored_metric_traceback", "bf16_newton_schulz_on_any_avx512",
    "hfu_one_peak_for_every_dtype", "module_ns_dtype_ignored", "ns_dtype_not_agreed",
}  # fmt: skip


def test_every_named_bug_resolves_and_names_existing_tests():
    names = [b.name for b in named.BUGS]
    assert len(names) == len(set(names))
    assert HISTORIC <= set(names), sorted(HISTORIC - set(names))
    for bug in named.BUGS:
        assert named.problems(bug) == [], bug.name
        files = [t for t in bug.tests if t.startswith("tests/")]
        assert files and all((REPO / f.split("::")[0]).is_file() for f in files), bug.name


def test_an_anchor_is_code_not_text():
    edit = named.Edit("m.py", "C.f", "total = total + value * size", "total = total + value")
    want = "class C:\n    def f(self, total, value, size):\n        total = total + value\n        return total\n"
    for text in (
        "class C:\n    def f(self, total, value, size):\n        total = total + value * size\n        return total\n",
        "class C:\n    def f(self, total, value, size):\n        total = (total +  # the weighted sum\n"
        "                 value*size)\n        return total\n",
    ):
        planted = named.apply(text, [edit])
        assert ast.unparse(ast.parse(planted)) == ast.unparse(ast.parse(want))
    twice = "def f(a):\n    a = a + 1\n    a = a + 1\n"
    with pytest.raises(named.Stale, match="occurs 2 times"):
        named.apply(twice, [named.Edit("m.py", "f", "a = a + 1", "pass")])
    with pytest.raises(named.Stale):
        named.apply(twice, [named.Edit("m.py", "g", "a = a + 1", "pass")])


def test_every_mutated_file_has_covering_tests():
    covering = tool.coverage_map()
    for f in tool.target_files():
        if not tool.has_code(f):
            continue  # nothing to mutate (re-exports only)
        tests = check.covering_tests(f)
        assert tests, f"{f}: no test file refers to it or to a module importing it"
        assert all((REPO / t).is_file() for t in tests), f
    # derived, not listed: the optimizer's internals are covered by the tests of what users construct
    assert "tests/optim/test_dist_optim.py" in covering["distlab/optim/zero1_comm.py"]
    assert "tests/user/test_user_module.py" in covering["distlab/callbacks/exact_eval.py"]


def test_every_equivalent_mutant_still_exists():
    # Enumerating mutants needs cosmic-ray, which only `make mutation` installs (the ".[mutation]" extra); there,
    # mutation_check.py reports a record that matches no mutant as stale too.
    pytest.importorskip("cosmic_ray", reason="cosmic-ray is installed by make mutation, not make test")
    records = equivalents.EQUIVALENT
    assert len({e.key for e in records}) == len(records)
    for e in records:
        assert e.reason.strip(), e
        text = (REPO / e.file).read_text()
        candidates = [
            m
            for m in tool.enumerate_mutants(e.file, text)[0]
            if (m.qualname, tool.short_operator(m.operator), m.before) == (e.function, e.operator, e.before)
        ]
        assert any(m.key(text) == e.key for m in candidates), f"no longer a mutant (triage again): {e}"


def test_a_timeout_is_a_hang_never_a_catch(tmp_path):
    rc, _, seconds = check.run_command([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path, 0.5)
    assert rc is None and seconds < 10
    assert check.classify(None, "", 0.5)[0] == "HANG"
    timed_out = (
        "+++++++++++++++++++ Timeout +++++++++++++++++++\n"
        "FAILED tests/x.py::test_y - Failed: Timeout (>300.0s) from pytest-timeout.\n1 failed in 300s"
    )
    assert check.classify(1, timed_out, 900)[0] == "HANG"
    waited = "FAILED tests/x.py::test_y[a b] - RuntimeError: TimeoutError: distributed job j (world 2) hung for > 120s"
    assert check.classify(1, waited, 900)[0] == "HANG"
    caught = "FAILED tests/x.py::test_y[a b] - AssertionError: 3 != 4\n1 failed, 2 passed in 1s"
    assert check.classify(1, caught, 900) == (
        "caught",
        "FAILED tests/x.py::test_y[a b] - AssertionError: 3 != 4",
        "tests/x.py::test_y[a b]",
    )
    assert check.classify(0, "3 passed in 1s", 900)[0] == "SURVIVED"
    assert check.classify(2, "ERROR tests/x.py - ImportError: boom", 900)[0] == "error"
