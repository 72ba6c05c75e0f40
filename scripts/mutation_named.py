"""Named historic bugs for `make mutation`: each is planted by edits anchored on code, not on text.

An edit names a function (its qualname, ``<module>`` for the top level), the code to replace in it (an
expression, or one or more consecutive statements) and the code to put there. The old code is matched on
``ast.unparse``, so reformatting, comments, quotes and line breaks never break an anchor; it must occur exactly
once in that function, else the bug is "stale" (tests/unit/test_mutation_list.py fails: a refactor updates the
anchor, it never silently retires the bug). Each bug names the pytest selection that must catch it.

    python scripts/mutation_check.py --part named [--only NAME ...]   # runs them
    python scripts/mutation_named.py --show NAME                      # the diff a bug plants
"""

from __future__ import annotations

import argparse
import ast
import difflib
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Edit:
    file: str
    function: str  # qualname of the function or class holding the code; "<module>" for the top level
    old: str  # an expression, or consecutive statements, as code
    new: str  # what replaces it (statements for statements; an expression for an expression)


@dataclass(frozen=True)
class Bug:
    name: str
    what: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]  # pytest arguments, run as one selection


class Stale(Exception):
    """An edit's anchor does not resolve to exactly one place."""


# ---- anchors ------------------------------------------------------------------------------------------------
def _clean(code: str) -> str:
    """Code as written in this file: one line, or lines after an opening newline, indented as a block."""
    return textwrap.dedent(code).strip("\n")


def _code(text: str) -> list[ast.stmt]:
    return ast.parse(_clean(text)).body


def _is_expression(stmts: list[ast.stmt]) -> bool:
    return len(stmts) == 1 and isinstance(stmts[0], ast.Expr)


def _scope(tree: ast.Module, qualname: str) -> ast.AST:
    node: ast.AST = tree
    if qualname == "<module>":
        return node
    for part in qualname.split("."):
        found = [
            n
            for n in ast.iter_child_nodes(node)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part
        ]
        if len(found) != 1:
            raise Stale(f"{qualname}: {len(found)} definitions named {part!r}")
        node = found[0]
    return node


def _statement_lists(scope: ast.AST):
    for node in ast.walk(scope):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _offset(lines: list[str], line: int, byte_col: int) -> int:
    """Character offset in the text of an ast position (the ast counts columns in UTF-8 bytes)."""
    before = sum(len(ln) for ln in lines[: line - 1])
    return before + len(lines[line - 1].encode()[:byte_col].decode())


_ATOMS = (ast.Name, ast.Constant, ast.Attribute, ast.Call, ast.Subscript, ast.List, ast.Dict, ast.Set)


def locate(text: str, edit: Edit) -> tuple[int, int, str]:
    """(start, end, replacement): where in ``text`` the edit's old code is and what goes there."""
    tree = ast.parse(text)
    scope = _scope(tree, edit.function)
    old, new = _code(edit.old), _code(edit.new)
    lines = text.splitlines(keepends=True)
    if _is_expression(old) and _is_expression(new):
        want = ast.unparse(old[0].value)
        hits = [(n, n) for n in ast.walk(scope) if isinstance(n, ast.expr) and ast.unparse(n) == want]
        body = _clean(edit.new)
        atom = isinstance(new[0].value, _ATOMS) and "\n" not in body
        replacement = body if atom else f"({body})"
    else:
        want = [ast.unparse(s) for s in old]
        hits = [
            (block[i], block[i + len(want) - 1])
            for block in _statement_lists(scope)
            for i in range(len(block) - len(want) + 1)
            if [ast.unparse(s) for s in block[i : i + len(want)]] == want
        ]
        replacement = None
    if len(hits) != 1:
        raise Stale(f"{edit.file}: {edit.function}: {edit.old.strip()[:70]!r} occurs {len(hits)} times")
    first, last = hits[0]
    start = _offset(lines, first.lineno, first.col_offset)
    end = _offset(lines, last.end_lineno, last.end_col_offset)
    if replacement is None:
        indent = lines[first.lineno - 1][: start - _offset(lines, first.lineno, 0)]
        body = _clean(edit.new).splitlines()
        replacement = "\n".join([body[0], *(indent + ln if ln else ln for ln in body[1:])])
    return start, end, replacement


def apply(text: str, edits: list[Edit]) -> str:
    """``text`` with every edit applied, one after another (each anchored on the text the previous left)."""
    for e in edits:
        start, end, replacement = locate(text, e)
        text = text[:start] + replacement + text[end:]
    ast.parse(text)  # a planted bug is valid Python
    return text


def mutated_files(bug: Bug, root: Path = REPO) -> dict[str, str]:
    """file -> its text with the bug planted (raises Stale when an anchor does not resolve)."""
    out: dict[str, str] = {}
    for e in bug.edits:
        out[e.file] = apply(out.get(e.file) or (root / e.file).read_text(), [e])
    return out


def problems(bug: Bug, root: Path = REPO) -> list[str]:
    """Why ``bug`` cannot be planted in ``root`` ([] when it can)."""
    try:
        planted = mutated_files(bug, root)
    except Stale as e:
        return [str(e)]
    except SyntaxError as e:
        return [f"the planted code is not valid Python: {e}"]
    same = [
        f for f, t in planted.items() if ast.dump(ast.parse(t)) == ast.dump(ast.parse((root / f).read_text()))
    ]
    return [f"{f}: the edits change nothing" for f in same]


# ---- the bugs -------------------------------------------------------------------------------------------------
OPT, EVAL, RZV = (
    "distlab/optim/dist_optim.py",
    "distlab/callbacks/exact_eval.py",
    "distlab/callbacks/rank_zero_validation.py",
)
ES, LOCAL = "distlab/callbacks/early_stopping.py", "distlab/distributed/rank_local.py"
ZERO1, SHARDED = "distlab/optim/zero1_comm.py", "distlab/optim/fsdp2_comm.py"
SPEED, CLI, COLL = (
    "distlab/callbacks/speed.py",
    "distlab/cli/app.py",
    "distlab/distributed/collectives.py",
)
CLI_CKPT = "distlab/cli/checkpoint.py"

BUGS = (
    # ---- the optimizer -------------------------------------------------------------------------------
    Bug(
        "sum_not_mean",
        "gradients summed over ranks, not averaged (no /W after the reduce-scatter)",
        (
            Edit(
                ZERO1,
                "Zero1Comm._reduce_coalesced",
                "g.div_(L.world)",
                "g",
            ),
            Edit(ZERO1, "Zero1Comm._reduce_piece", "g[0].div_(W)", "g[0]"),
            Edit(ZERO1, "Zero1Comm._reduce_piece", "g.div_(W)", "g"),
        ),
        ("tests/optim/test_dist_optim.py", "-k", "synced_gradient and world2"),
    ),
    Bug(
        "reduction_applied_twice",
        "an async reduction's result is recomputed on every wait (the /W division runs again after clipping)",
        (Edit(COLL, "Pending.wait", "self._result is None", "True"),),
        ("tests/distributed/test_collectives.py", "-k", "2"),
    ),
    Bug(
        "gloo_reduce_scatter_keeps_own_chunk",
        "gloo's reduce_scatter (an all_to_all) keeps only this rank's contribution, not the sum over ranks",
        (Edit(COLL, "_gloo_reduce_scatter.finish", "range(1, W)", "range(1, 1)"),),
        ("tests/distributed/test_collectives.py",),
    ),
    Bug(
        "missing_all_gather",
        "the updated pieces are never gathered back to the other ranks",
        (
            Edit(
                ZERO1,
                "Zero1Comm.gather",
                "self._write_back([self.pieces[i] for i in ids], blocks, apply_muon)",
                "pass",
            ),
        ),
        ("tests/optim/test_dist_optim.py", "-k", "matches_torch_oracle and world2"),
    ),
    Bug(
        "wrong_owner_round_robin",
        "ranks disagree on who owns a bucket's last Muon matrices (a rank-dependent round-robin offset)",
        (
            Edit(
                "distlab/optim/layout.py",
                "Layout.build",
                "last[(offset + i) % world] = j",
                "last[(offset + i + rank) % world] = j",
            ),
        ),
        ("tests/optim/test_dist_optim.py", "-k", "matches_torch_oracle and world3"),
    ),
    Bug(
        "dropped_optimizer_shard_on_save",
        "consolidate_state_dict keeps only the saving rank's Muon momentum",
        (
            Edit(
                ZERO1,
                "Zero1Comm.consolidate_state",
                """
                        if j is not None and has[j]:
                            full.setdefault(j, {})[key] = bufs[i].clone()""",
                """
                        if j is not None and has[j] and i == to:
                            full.setdefault(j, {})[key] = bufs[i].clone()""",
            ),
        ),
        ("tests/optim/test_checkpoint.py",),
    ),
    Bug(
        "auto_always_reduce",
        "grad_sync='auto' reduces again gradients a DDP wrapper already averaged",
        (
            Edit(
                OPT,
                "DistMuonAdamW._resolve_mode",
                'mode = "averaged" if identical and nonzero else "reduce"',
                'mode = "reduce"',
            ),
        ),
        ("tests/distributed/test_grad_sync_modes.py", "-k", "auto_mode"),
    ),
    Bug(
        "auto_always_averaged",
        "grad_sync='auto' never reduces: each rank steps with its own gradients",
        (
            Edit(
                OPT,
                "DistMuonAdamW._resolve_mode",
                'mode = "averaged" if identical and nonzero else "reduce"',
                'mode = "averaged"',
            ),
        ),
        ("tests/optim/test_conv_and_auto.py", "-k", "zero1 and 2"),
    ),
    Bug(
        "kernel_lr_from_4d_shape",
        "a conv kernel's Muon learning-rate scaling reads (out, in) instead of its 2-D view (out, in*kh*kw)",
        (
            Edit(
                "distlab/optim/dist_optim.py",
                "DistMuonAdamW._by_group_and_shape",
                "(L.group_of[j], matrix_shape(L.params[j]))",
                "(L.group_of[j], tuple(L.params[j].shape[:2]))",
            ),
        ),
        ("tests/optim/test_conv_and_auto.py", "-k", "one_process"),
    ),
    Bug(
        "newton_schulz_on_local_shard",
        "under FSDP2 each rank orthogonalises its own rows instead of the whole matrix on its owner",
        (
            Edit(
                SHARDED,
                "FSDP2Comm.orthogonalize",
                "orthogonalize_on_owners",
                """
                lambda chunks, shapes, updates, *rest: {
                    j: __import__("distlab.optim.functional", fromlist=["newton_schulz"]).newton_schulz(
                        u.reshape(u.shape[0], -1), dtype=u.dtype
                    )
                    for j, u in updates.items()
                }""",
            ),
        ),
        ("tests/fsdp/test_fsdp2_optim.py", "-k", "bit_exact"),
    ),
    Bug(
        "dcp_metadata_unpickled",
        "a sharded checkpoint's .metadata is unpickled without the allow-list (its payload runs)",
        (
            Edit(
                "distlab/checkpoint/reading.py",
                "check_dcp_metadata",
                "_MetadataUnpickler(io.BytesIO(meta.read_bytes())).load()",
                "pickle.loads(meta.read_bytes())",
            ),
        ),
        ("tests/cli/test_refusals.py", "-k", "sharded"),
    ),
    Bug(
        "checkpoint_class_trusted",
        "the class a --ckpt_path checkpoint names is imported and used instead of the config's",
        (
            Edit(
                CLI_CKPT,
                "apply_checkpoint_settings",
                'named and model is not None and named != model.get("class_path")',
                "False",
            ),
            Edit(
                CLI_CKPT,
                "apply_checkpoint_settings",
                'hparams.pop("_instantiator", None)',
                """
                hparams.pop("_instantiator", None)
                if hparams.get("_class_path"):
                    __import__(hparams["_class_path"].rpartition(".")[0])""",
            ),
        ),
        ("tests/cli/test_refusals.py", "-k", "another"),
    ),
    Bug(
        "restart_starts_over",
        "a job restarted by torchrun starts from step 0 instead of resuming from its last checkpoint",
        (Edit(CLI, "DistlabCLI.before_fit", 'fit["ckpt_path"] = str(newest)', "pass"),),
        ("tests/slow/test_torchrun.py", "-k", "restart"),
    ),
    Bug(
        "collective_errors_raw",
        "a collective that times out surfaces as gloo's bare message, without the rank or the collective",
        (Edit(COLL, "_explain", "text = str(e)", "return e"),),
        ("tests/distributed/test_collective_failures.py",),
    ),
    Bug(
        "stop_request_ignored",
        "a preempted SLURM job is not checkpointed when the scheduler warns (the stop request is never seen)",
        (
            Edit(
                "distlab/callbacks/preemption.py",
                "CheckpointOnStopRequest.on_train_batch_end",
                'all_reduce(asked, "max").item() == 0',
                "True",
            ),
        ),
        ("tests/slow/test_slurm.py", "-k", "preempted"),
    ),
    # ---- strategies ---------------------------------------------------------------------------------
    Bug(
        "no_initial_broadcast",
        "ddp_optimizer_sync does not start every rank from rank 0's weights",
        (
            Edit(
                "distlab/strategies/optimizer_sync_ddp.py",
                "OptimizerSyncDDPStrategy.configure_ddp",
                "broadcast_module_states(self.model)",
                "pass",
            ),
        ),
        ("tests/user/test_user_module.py", "-k", "ddp_optimizer_sync_spawn-2"),
    ),
    Bug(
        "fsdp2_no_initial_broadcast",
        "FSDP2 shards each rank's own initial weights",
        (
            Edit(
                "distlab/parallel/parallelize.py",
                "shard_lightning_module",
                "broadcast_module_states(pl_module, mesh_group(mesh))",
                "pass",
            ),
        ),
        ("tests/user/test_user_module.py", "-k", "fsdp2_spawn-2"),
    ),
    Bug(
        "spawn_states_shared",
        "spawned ranks keep the metric states the launcher put in shared memory",
        (Edit("distlab/distributed/spawn.py", "unshare_tensors", "cloned = 0", "return 0"),),
        ("tests/user/test_user_module.py", "-k", "ddp_spawn-2"),  # val_seen counts 14 of 7 samples
    ),
    # ---- validation ---------------------------------------------------------------------------------
    Bug(
        "rzv_never_validates",
        "RankZeroValidation never triggers",
        (Edit(RZV, "RankZeroValidation._validate_if_due", "step > self._last_step and due", "False"),),
        ("tests/matrix/test_callback_matrix.py", "-k", "RankZeroValidation-auto-ddp_optimizer_sync"),
    ),
    Bug(
        "rzv_skips_last_batch",
        "rank-0 validation skips its last batch",
        (
            Edit(
                EVAL,
                "ExactEvaluator._run_steps",
                "enumerate(self.data[k].loader(indices))",
                "list(enumerate(self.data[k].loader(indices)))[:-1]",
            ),
        ),
        ("tests/callbacks/test_rank_safe_callbacks.py", "-k", "rank_zero_and_distributed and 2"),
    ),
    Bug(
        "rzv_drops_partial_batch",
        "validation drops a partial last batch",
        (Edit("distlab/callbacks/eval_data.py", "EvalData.loader", "self.drop_last", "True"),),
        ("tests/callbacks/test_rank_safe_callbacks.py", "-k", "rank_zero_and_distributed and 2"),
    ),
    Bug(
        "mean_not_weighted",
        "self.log's epoch mean ignores the batch size (a mean of batch means)",
        (
            Edit(
                "distlab/callbacks/eval_logging.py",
                "LogRecorder.log",
                "entry.total = entry.total + value * size",
                "entry.total, size = entry.total + value, 1",
            ),
        ),
        ("tests/user/test_user_module.py", "-k", "one_process"),
    ),
    Bug(
        "padding_in_distributed_validation",
        "distributed validation pads the shards with duplicates, as DistributedSampler does",
        (
            Edit(
                EVAL,
                "ExactEvaluator._run_distributed",
                "shard_indices(n, rank, world)",
                "[i % n for i in range(rank, n + (-n) % world, world)]",
            ),
        ),
        ("tests/callbacks/test_rank_safe_callbacks.py", "-k", "rank_zero_and_distributed and 3"),
    ),
    Bug(
        "padding_pass_counts",
        "the extra forwards that keep FSDP2 ranks in step are counted in the metrics",
        (Edit(EVAL, "ExactEvaluator._run_steps", "restore(self.metrics, saved)", "pass"),),
        ("tests/user/test_user_module.py", "-k", "ddp_optimizer_sync_spawn-3"),
    ),
    Bug(
        "no_metric_sync",
        "distributed validation never syncs the torchmetrics states",
        (
            Edit(
                "distlab/callbacks/eval_metrics.py",
                "sync_metrics",
                """
                m.sync(
                    dist_sync_fn=gather_for_metrics,
                    process_group=group,
                    should_sync=True,
                    distributed_available=lambda: True,
                )""",
                "continue",
            ),
        ),
        ("tests/user/test_user_module.py", "-k", "ddp_spawn-2"),
    ),
    Bug(
        "no_agreement_check",
        "epoch-end values computed from rank-local data are accepted",
        (
            Edit(
                EVAL,
                "ExactEvaluator._combine",
                "(math.isnan(v) and math.isnan(ref)) or math.isclose(v, ref, rel_tol=AGREEMENT_RTOL, abs_tol=1e-12)",
                "True",
            ),
        ),
        ("tests/distributed/test_rank_local.py", "-k", "refuses_what"),
    ),
    Bug(
        "validate_uses_lightnings_loop",
        "distlab validate / test run Lightning's padded loop instead of the exact evaluation",
        (
            Edit(
                RZV,
                "RankZeroValidation.setup",
                "patch(self._patched_loop, 'run', lambda: self._run_loop(trainer, pl_module, stage))",
                "pass",
            ),
        ),
        ("tests/matrix/test_recipe_matrix.py", "-k", "digits_cpu and ddp_spawn"),
    ),
    # ---- rank-local code ------------------------------------------------------------------------------
    Bug(
        "collectives_not_forbidden",
        "rank-local work may start a collective (it hangs until the process-group timeout)",
        (Edit(LOCAL, "forbid_collectives", "_targets()", "[]"),),
        ("tests/distributed/test_rank_local.py", "-k", "refused_and_sharded"),
    ),
    Bug(
        "sample_on_rank_zero_under_fsdp2",
        "SampleText samples on rank 0 alone under FSDP2 (a forward is collective there)",
        (Edit(LOCAL, "on_rank_zero", "has_sharded_params(module)", "False"),),
        ("tests/matrix/test_callback_matrix.py", "-k", "SampleText-default-fsdp2_spawn"),
    ),
    # ---- early stopping -----------------------------------------------------------------------------
    Bug(
        "nan_check_skipped",
        "a NaN loss on one rank is not checked",
        (Edit(ES, "SyncEarlyStopping.on_before_optimizer_step", "not self.check_finite_loss", "True"),),
        ("tests/callbacks/test_rank_safe_callbacks.py", "-k", "nan_on_rank_one"),
    ),
    Bug(
        "early_stop_per_rank",
        "every rank makes its own early-stopping decision",
        (
            Edit(ES, "SyncEarlyStopping._run_early_stopping_check", "trainer.is_global_zero", "True"),
            Edit(
                ES,
                "SyncEarlyStopping._run_early_stopping_check",
                "decision = broadcast_from_rank_zero(decision)",
                "pass",
            ),
        ),
        ("tests/callbacks/test_rank_safe_callbacks.py", "-k", "different_or_missing"),
    ),
    Bug(
        "early_stop_at_epoch_end",
        "early stopping ignores RankZeroValidation and waits for a train-epoch end",
        (
            Edit(
                "distlab/compat.py",
                "check_early_stopping_on_validation",
                "callback._check_on_train_epoch_end = False",
                "pass",
            ),
        ),
        ("tests/user/test_user_module.py", "-k", "ddp_optimizer_sync_spawn-2"),
    ),
    # ---- observability and logs ----------------------------------------------------------------------
    Bug(
        "speed_counts_validation",
        "SpeedMonitor counts validation time as training time",
        (
            Edit(
                SPEED,
                "SpeedMonitor._training_seconds",
                "time.perf_counter() - self._t0 - self._excluded - rzv",
                "time.perf_counter() - self._t0",
            ),
        ),
        ("tests/callbacks/test_speed_monitor.py", "-k", "hand_arithmetic"),
    ),
    Bug(
        "speed_ignores_accumulation",
        "SpeedMonitor counts one micro-batch per optimizer step under gradient accumulation",
        (
            Edit(
                SPEED,
                "SpeedMonitor.on_train_batch_end",
                "n_micro = trainer.accumulate_grad_batches",
                "n_micro = 1",
            ),
        ),
        ("tests/callbacks/test_speed_monitor.py", "-k", "hand_arithmetic"),
    ),
    Bug(
        "speed_window_never_moves",
        "each SpeedMonitor line averages from step 2 instead of the steps since the previous line",
        (
            Edit(
                SPEED,
                "SpeedMonitor.on_train_batch_end",
                "self._report(trainer, self._mark, now, device)\nself._mark = now",
                "self._report(trainer, self._mark, now, device)",
            ),
        ),
        ("tests/callbacks/test_speed_monitor.py", "-k", "hand_arithmetic"),
    ),
    Bug(
        "hsdp_state_rows_of_the_replica",
        "optimizer state loaded onto HSDP shards takes the rows of the replica coordinate, not the shard coordinate",
        (
            Edit(
                "distlab/optim/fsdp2_comm.py",
                "shard_like",
                "shard_rows(p.shape[0], mesh.size(-1), mesh.get_local_rank(-1))",
                "shard_rows(p.shape[0], mesh.size(-1), mesh.get_local_rank(0))",
            ),
        ),
        ("tests/fsdp/test_hsdp.py", "-k", "rows_torch"),
    ),
    Bug(
        "resume_lr_unscheduled",
        "the first resumed step trains at the checkpoint's rate, not at this run's schedule (changed lr or max_steps)",
        (
            Edit(
                "distlab/callbacks/resume.py",
                "ConfiguredOptimizerSettings.on_train_start",
                'group["lr"] = rate',
                'group["lr"] = group["lr"]',
            ),
        ),
        ("tests/cli/test_checkpoints.py", "-k", "first_resumed_step or every_optimizer_setting"),
    ),
    Bug(
        "rotary_sign",
        "rotary embedding's second half turned the wrong way: not a rotation, attention sees absolute positions",
        (Edit("distlab/models/gpt.py", "apply_rotary", "x2 * cos - x1 * sin", "x2 * cos + x1 * sin"),),
        ("tests/unit/test_model.py", "-k", "rotary"),
    ),
    Bug(
        "accuracy_per_class_mean",
        "the classifier logs the mean of per-class accuracies (torchmetrics' default) as val_acc",
        (
            Edit(
                "distlab/modules/classifier.py",
                "ImageClassifier.__init__",
                'self.val_acc = MulticlassAccuracy(n_classes, average="micro")',
                "self.val_acc = MulticlassAccuracy(n_classes)",
            ),
        ),
        ("tests/unit/test_metric_oracles.py",),
    ),
    Bug(
        "flops_at_context_length",
        "a batch's FLOPs count attention over the model's context, not over the batch's length",
        (
            Edit(
                "distlab/modules/gpt_module.py",
                "GPTLightningModule.flops_of",
                "self.model.flops_per_token(seq_len=seq_len)",
                "self.model.flops_per_token()",
            ),
        ),
        ("tests/unit/test_model.py", "-k", "flops"),
    ),
    Bug(
        "micro_shards_one_permutation",
        "MicroShards computes its permutation once: every epoch repeats the first one's order",
        (
            Edit(
                "distlab/data/micro_shards.py",
                "MicroShards._order",
                'getattr(self, "_cached", (None,))[0] != epoch',
                'not hasattr(self, "_cached")',
            ),
        ),
        ("tests/unit/test_metric_oracles.py",),
    ),
    Bug(
        "comm_fraction_of_the_window",
        "SpeedMonitor divides communication seconds per step by the report window's seconds, not the step's",
        (
            Edit(
                "distlab/callbacks/speed.py",
                "SpeedMonitor._report",
                "sum(sec for sec, _ in comm.values()) / step_s",
                "sum(sec for sec, _ in comm.values()) / seconds",
            ),
        ),
        ("tests/callbacks/test_speed_monitor.py", "-k", "communication"),
    ),
    Bug(
        "broadcast_src_as_global_rank",
        "a broadcast over a subgroup reads src as a global rank (audit 27: the wrong rank's values, or a failure)",
        (
            Edit(
                "distlab/distributed/collectives.py",
                "broadcast",
                "dist.get_global_rank(group, src) if group is not None else src",
                "src",
            ),
        ),
        ("tests/distributed/test_collectives.py::test_broadcasts_over_a_subgroup_read_src_as_a_group_rank",),
    ),
    Bug(
        "stop_request_decided_per_rank",
        "a stop file seen by one rank stops only that rank (the others never save; the save's barrier waits)",
        (
            Edit(
                "distlab/callbacks/preemption.py",
                "CheckpointOnStopRequest.on_train_batch_end",
                'all_reduce(asked, "max").item() == 0',
                "asked.item() == 0",
            ),
        ),
        ("tests/callbacks/test_stop_request_one_rank.py",),
    ),
    Bug(
        "last_ckpt_left_stale",
        "a resume that ends on a step checkpoint's save leaves last.ckpt at the earlier run's step",
        (
            Edit(
                "distlab/callbacks/preemption.py",
                "SaveUnsavedSteps._save_unsaved",
                "(trainer.global_step <= self.saved_step and not stale_last) or trainer.global_step == 0",
                "trainer.global_step <= self.saved_step or trainer.global_step == 0",
            ),
        ),
        ("tests/cli/test_checkpoints.py", "-k", "brings_last"),
    ),
    Bug(
        "mesh_traffic_no_ring_factor",
        "MeshTraffic counts an all-reduce once, not as a reduce-scatter plus an all-gather (HSDP's replica bytes halve)",
        (
            Edit(
                "distlab/distributed/mesh_traffic.py",
                "_counting",
                "_RING_FACTOR.get(name, 1.0) * (world - 1) / world * _buffer_bytes(args, kwargs)",
                "(world - 1) / world * _buffer_bytes(args, kwargs)",
            ),
        ),
        ("tests/distributed/test_mesh_traffic.py",),
    ),
    Bug(
        "mesh_traffic_group_ignored",
        "MeshTraffic files every call under the mesh's first dimension, whatever group it ran on",
        (
            Edit(
                "distlab/distributed/mesh_traffic.py",
                "MeshTraffic._add",
                'dim = self._dims.get(group, "other")',
                "dim = next(iter(self._dims.values()))",
            ),
        ),
        ("tests/distributed/test_mesh_traffic.py",),
    ),
    Bug(
        "resume_deletes_log",
        "a resumed fit's CSV logger deletes the metrics.csv of the steps before the checkpoint (Lightning's default)",
        (
            Edit(
                "distlab/cli/run_folder.py",
                "default_loggers",
                "AppendingCSVLogger if resume else CSVLogger",
                "CSVLogger",
            ),
        ),
        ("tests/cli/test_checkpoints.py", "-k", "resumed"),
    ),
    Bug(
        "optimizer_flops_miss_a_matmul",
        "the optimizer's Newton-Schulz FLOP count leaves out A @ A (SpeedMonitor's HFU too low)",
        (
            Edit(
                "distlab/optim/functional.py",
                "newton_schulz_flops",
                "steps * (4 * k * k * w + 2 * k**3)",
                "steps * (4 * k * k * w)",
            ),
        ),
        ("tests/optim/test_api.py", "-k", "flops"),
    ),
    Bug(
        "class_after_recipe_not_first",
        "--model X typed after a recipe is parsed after it: the recipe's model values meet no class",
        (
            Edit(
                "distlab/cli/argv.py",
                "classes_first",
                "len(on_line) != 1 or in_files or on_line[0][0] < sub",
                "True",
            ),
        ),
        ("tests/cli/test_configs.py", "-k", "class"),
    ),
    Bug(
        "monitored_metric_traceback",
        "Lightning's ModelCheckpoint error for a metric nobody logs stays a traceback wall",
        (
            Edit(
                "distlab/cli/errors.py",
                "refused_line",
                'type(x).__name__ == "MisconfigurationException"',
                'type(x).__name__ == "NoSuchException"',
            ),
        ),
        ("tests/cli/test_errors.py", "-k", "monitored"),
    ),
    Bug(
        "bf16_newton_schulz_on_any_avx512",
        "Newton-Schulz defaults to bf16 on any AVX-512 CPU, where bf16 is emulated and 57-80x slower",
        (
            Edit(
                "distlab/perf.py",
                "native_bf16_matmul",
                'caps.get("avx512_bf16") or caps.get("amx_bf16")',
                'caps.get("avx512_bf16") or caps.get("amx_bf16") or caps.get("avx512_f")',
            ),
        ),
        ("tests/optim/test_api.py", "-k", "native_bf16"),
    ),
    Bug(
        "hfu_one_peak_for_every_dtype",
        "HFU divides bf16 Newton-Schulz FLOPs by the fp32 peak (a fast bf16 unit inflates it)",
        (Edit(SPEED, "SpeedMonitor._report", "f / peak", "f / self.peak_flops"),),
        ("tests/callbacks/test_speed_monitor.py", "-k", "own_peak"),
    ),
    Bug(
        "module_ns_dtype_ignored",
        "GPTLightningModule(ns_dtype=...) never reaches the optimizer (the host's default wins)",
        (
            Edit(
                "distlab/modules/gpt_module.py",
                "GPTLightningModule.configure_optimizers",
                "self.hparams.ns_dtype",
                "None",
            ),
        ),
        ("tests/unit/test_model.py", "-k", "ns_dtype"),
    ),
    Bug(
        "ns_dtype_not_agreed",
        "each rank reads Newton-Schulz's default dtype off its own host: mixed hosts round in two dtypes",
        (
            Edit(
                OPT,
                "DistMuonAdamW._agree_ns_dtype",
                "lacking = any_rank([lacking], group, device)[0]",
                "lacking = lacking",
            ),
        ),
        ("tests/optim/test_conv_and_auto.py", "-k", "agreed"),
    ),
    # ---- a planted-bug audit's survivors (2026-11-25), caught since -------------------------------------------
    Bug(
        "min_reduced_as_max",
        "a validation value logged with reduce_fx='min' is reduced across ranks with max",
        (
            Edit(
                "distlab/callbacks/exact_eval.py",
                "ExactEvaluator._combine",
                '("min", "min")',
                '("min", "max")',
            ),
        ),
        ("tests/distributed/test_rank_local.py", "-k", "every_reduction"),
    ),
    Bug(
        "half_a_shard_passes",
        "a token shard cut short by less than half its tokens passes the length check (then mmap fails raw)",
        (
            Edit(
                "distlab/data/corpus.py",
                "read_bin_shard",
                "(size := path.stat().st_size) != offset + 2 * n",
                "(size := path.stat().st_size) < offset + n",
            ),
        ),
        ("tests/unit/test_data.py", "-k", "shard"),
    ),
    Bug(
        "resume_ignores_accumulation",
        "distlab's data resumes at global_step micro-batches, not global_step x accumulate_grad_batches",
        (
            Edit(
                "distlab/data/datamodule.py",
                "TextDataModule.train_dataloader",
                "t.global_step * t.accumulate_grad_batches",
                "t.global_step",
            ),
        ),
        ("tests/user/test_data_resume.py", "-k", "accumulation"),
    ),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--show", nargs="*", metavar="NAME", help="print the diff each bug plants (all if none)"
    )
    args = parser.parse_args()
    for bug in BUGS:
        if args.show and bug.name not in args.show:
            continue
        print(f"== {bug.name}: {bug.what}")
        try:
            for f, text in mutated_files(bug).items():
                old = (REPO / f).read_text().splitlines()
                print("\n".join(difflib.unified_diff(old, text.splitlines(), f, f, n=1, lineterm="")))
        except Stale as e:
            print(f"   STALE: {e}")


if __name__ == "__main__":
    sys.exit(main())
