"""Plant named, realistic bugs in a copy of distlab; the tests that guard each one must fail.

    python scripts/mutation_check.py               # every mutation (~20 min on 2 cores)
    python scripts/mutation_check.py --only sum_not_mean no_initial_broadcast
    python scripts/mutation_check.py --list
    make mutation

Each mutation is a list of exact edits (file, the text it replaces, the replacement) and the pytest
selections that must catch it. An edit whose text no longer occurs exactly once makes the mutation
"stale", not silently skipped: tests/unit/test_mutation_list.py keeps the list in step with the code.
The copy lives in a temporary folder; PYTHONPATH points there, so spawned ranks import the copy too.
Prints one row per mutation (caught / SURVIVED / stale) and exits 1 unless every mutation is caught.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPT, EVAL, RZV = (
    "distlab/optim/dist_optim.py",
    "distlab/callbacks/exact_eval.py",
    "distlab/callbacks/rank_zero_validation.py",
)
ES, LOCAL = "distlab/callbacks/early_stopping.py", "distlab/distributed/rank_local.py"
ZERO1, SHARDED = "distlab/optim/zero1.py", "distlab/optim/sharded.py"
SPEED = "distlab/callbacks/speed.py"


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    edits: tuple[tuple[str, str, str], ...]  # (file, exact old text, new text)
    tests: tuple[str, ...]  # pytest arguments, run as one selection


MUTATIONS = (
    # ---- the optimizer -------------------------------------------------------------------------------
    Mutation(
        "sum_not_mean",
        "gradients summed over ranks, not averaged (no /W after the reduce-scatter)",
        (
            (
                ZERO1,
                "reduce_scatter_sum(self._pack_grads(pieces), self.group).div_(L.world)",
                "reduce_scatter_sum(self._pack_grads(pieces), self.group)",
            ),
            (ZERO1, ".then(lambda g: g[0].div_(W))", ".then(lambda g: g[0])"),
            (ZERO1, ".then(lambda g: g.div_(W))", ".then(lambda g: g)"),
        ),
        ("tests/optim/test_dist_optim.py", "-k", "synced_gradient and world2"),
    ),
    Mutation(
        "reduction_applied_twice",
        "an async reduction's result is recomputed on every wait (the /W division runs again after clipping)",
        (("distlab/distributed/collectives.py", "        if self._result is None:\n", "        if True:\n"),),
        ("tests/distributed/test_collectives.py", "-k", "2"),
    ),
    Mutation(
        "gloo_reduce_scatter_keeps_own_chunk",
        "gloo's reduce_scatter (an all_to_all) keeps only this rank's contribution, not the sum over ranks",
        (
            (
                "distlab/distributed/collectives.py",
                "        for w in range(1, W):",
                "        for w in range(1, 1):",
            ),
        ),
        ("tests/distributed/test_collectives.py",),
    ),
    Mutation(
        "missing_all_gather",
        "the updated pieces are never gathered back to the other ranks",
        ((ZERO1, "                self._write_back(piece, block)  # block: (W, n)", "                pass"),),
        ("tests/optim/test_dist_optim.py", "-k", "matches_torch_oracle and world2"),
    ),
    Mutation(
        "wrong_owner_round_robin",
        "ranks disagree on who owns a bucket's last Muon matrices (a rank-dependent round-robin offset)",
        (
            (
                "distlab/optim/layout.py",
                "last[(offset + i) % world] = j",
                "last[(offset + i + rank) % world] = j",
            ),
        ),
        ("tests/optim/test_dist_optim.py", "-k", "matches_torch_oracle and world3"),
    ),
    Mutation(
        "dropped_optimizer_shard_on_save",
        "consolidate_state_dict keeps only the saving rank's Muon momentum",
        (
            (
                ZERO1,
                '                    if j is not None and has[j]:\n                        full[j] = {"momentum_buffer"',
                '                    if j is not None and has[j] and i == to:\n                        full[j] = {"momentum_buffer"',
            ),
        ),
        ("tests/optim/test_checkpoint.py",),
    ),
    Mutation(
        "auto_always_reduce",
        "grad_sync='auto' reduces again gradients a DDP wrapper already averaged",
        ((OPT, '("averaged" if identical else "reduce"), True', '"reduce", True'),),
        ("tests/distributed/test_grad_sync_modes.py", "-k", "auto_mode"),
    ),
    Mutation(
        "auto_always_averaged",
        "grad_sync='auto' never reduces: each rank steps with its own gradients",
        ((OPT, '("averaged" if identical else "reduce"), True', '"averaged", True'),),
        ("tests/optim/test_conv_and_auto.py", "-k", "zero1 and 2"),
    ),
    Mutation(
        "kernel_lr_from_4d_shape",
        "a conv kernel's Muon learning-rate scaling reads (out, in) instead of its 2-D view (out, in*kh*kw)",
        (
            (
                "distlab/optim/functional.py",
                "param.add_(ortho.view(param.shape), alpha=-adjust_lr(lr, adjust_lr_fn, shape))",
                "param.add_(ortho.view(param.shape), alpha=-adjust_lr(lr, adjust_lr_fn, param.shape))",
            ),
        ),
        ("tests/optim/test_conv_and_auto.py", "-k", "one_process"),
    ),
    Mutation(
        "newton_schulz_on_local_shard",
        "under FSDP2 each rank orthogonalises its own rows instead of the whole matrix on its owner",
        (
            (
                SHARDED,
                "        ortho = orthogonalize_on_owners(",
                "        ortho = {j: self._newton_schulz_rows(j, u) for j, u in updates.items()} or orthogonalize_on_owners(",
            ),
            (
                SHARDED,
                "    def _newton_schulz(self, j: int, full: Tensor) -> Tensor:",
                "    def _newton_schulz_rows(self, j, rows):\n"
                "        from distlab.optim.functional import newton_schulz\n\n"
                "        group = self.opt.param_groups[self.layout.group_of[j]]\n"
                "        return newton_schulz(rows, group['ns_coefficients'], group['ns_steps'], group['eps'], rows.dtype)\n\n"
                "    def _newton_schulz(self, j: int, full: Tensor) -> Tensor:",
            ),
        ),
        ("tests/fsdp/test_fsdp2_optim.py", "-k", "bit_exact"),
    ),
    Mutation(
        "dcp_metadata_unpickled",
        "a sharded checkpoint's .metadata is unpickled without the allow-list (its payload runs)",
        (
            (
                "distlab/checkpoint.py",
                "        _MetadataUnpickler(io.BytesIO(meta.read_bytes())).load()",
                "        pickle.loads(meta.read_bytes())",
            ),
        ),
        ("tests/cli/test_bad_inputs.py", "-k", "sharded"),
    ),
    Mutation(
        "checkpoint_class_trusted",
        "the class a --ckpt_path checkpoint names is imported and used instead of the config's",
        (
            (
                "distlab/cli.py",
                '        if named and model is not None and named != model.get("class_path"):',
                "        if False:",
            ),
            (
                "distlab/cli.py",
                '        hparams.pop("_instantiator", None)\n',
                '        hparams.pop("_instantiator", None)\n        if hparams.get("_class_path"):\n            __import__(hparams["_class_path"].rpartition(".")[0])\n',
            ),
        ),
        ("tests/cli/test_bad_inputs.py", "-k", "another_class or another"),
    ),
    Mutation(
        "restart_starts_over",
        "a job restarted by torchrun starts from step 0 instead of resuming from its last checkpoint",
        (
            (
                "distlab/cli.py",
                '            self.config_init["fit"]["ckpt_path"] = "last"\n',
                "            pass\n",
            ),
        ),
        ("tests/slow/test_torchrun.py", "-k", "restart"),
    ),
    Mutation(
        "collective_errors_raw",
        "a collective that times out surfaces as gloo's bare message, without the rank or the collective",
        (
            (
                "distlab/distributed/collectives.py",
                "    text = str(e)\n    world, rank = world_info(group)\n",
                "    return e\n    text = str(e)\n    world, rank = world_info(group)\n",
            ),
        ),
        ("tests/distributed/test_collective_failures.py",),
    ),
    Mutation(
        "stop_request_ignored",
        "a preempted SLURM job is not checkpointed when the scheduler warns (the stop request is never seen)",
        (
            (
                "distlab/callbacks/preemption.py",
                '        if all_reduce(asked, "max").item() == 0:',
                "        if True:",
            ),
        ),
        ("tests/slow/test_slurm.py", "-k", "preempted"),
    ),
    # ---- strategies ---------------------------------------------------------------------------------
    Mutation(
        "no_initial_broadcast",
        "ddp_optimizer_sync does not start every rank from rank 0's weights",
        (
            (
                "distlab/strategies/optimizer_sync_ddp.py",
                "        broadcast_module_states(self.model)",
                "        pass",
            ),
        ),
        ("tests/user/test_user_module.py", "-k", "ddp_optimizer_sync_spawn-2"),
    ),
    Mutation(
        "fsdp2_no_initial_broadcast",
        "FSDP2 shards each rank's own initial weights",
        (
            (
                "distlab/parallel/parallelize.py",
                "    broadcast_module_states(pl_module, mesh.get_group())",
                "    pass",
            ),
        ),
        ("tests/user/test_user_module.py", "-k", "fsdp2_spawn-2"),
    ),
    Mutation(
        "spawn_states_shared",
        "spawned ranks keep the metric states the launcher put in shared memory",
        (("distlab/distributed/spawn.py", "    cloned = 0\n", "    return 0\n"),),
        ("tests/user/test_user_module.py", "-k", "ddp_spawn-2"),  # val_seen counts 14 of 7 samples
    ),
    # ---- validation ---------------------------------------------------------------------------------
    Mutation(
        "rzv_never_validates",
        "RankZeroValidation never triggers",
        ((RZV, "        if step > self._last_step and due:", "        if False:"),),
        ("tests/matrix/test_callback_matrix.py", "-k", "RankZeroValidation-auto-ddp_optimizer_sync"),
    ),
    Mutation(
        "rzv_skips_last_batch",
        "rank-0 validation skips its last batch",
        (
            (
                EVAL,
                "            for i, batch in enumerate(loader):",
                "            for i, batch in list(enumerate(loader))[:-1]:",
            ),
        ),
        ("tests/callbacks/test_rank_safe_callbacks.py", "-k", "rank_zero_and_distributed and 2"),
    ),
    Mutation(
        "rzv_drops_partial_batch",
        "validation drops a partial last batch",
        ((EVAL, "            drop_last=self.drop_last,", "            drop_last=True,"),),
        ("tests/callbacks/test_rank_safe_callbacks.py", "-k", "rank_zero_and_distributed and 2"),
    ),
    Mutation(
        "mean_not_weighted",
        "self.log's epoch mean ignores the batch size (a mean of batch means)",
        (
            (
                EVAL,
                "            entry.total = entry.total + value * size",
                "            entry.total, size = entry.total + value, 1",
            ),
        ),
        ("tests/user/test_user_module.py", "-k", "one_process"),
    ),
    Mutation(
        "padding_in_distributed_validation",
        "distributed validation pads the shards with duplicates, as DistributedSampler does",
        (
            (
                EVAL,
                "self._run_steps(recorder, self.data.loader(shard_indices(n, rank, world)), most)",
                "self._run_steps(recorder, self.data.loader([i % n for i in range(rank, n + (-n) % world, world)]), most)",
            ),
        ),
        ("tests/callbacks/test_rank_safe_callbacks.py", "-k", "rank_zero_and_distributed and 3"),
    ),
    Mutation(
        "padding_pass_counts",
        "the extra forwards that keep FSDP2 ranks in step are counted in the metrics",
        ((EVAL, "                _restore(self.metrics, saved)", "                pass"),),
        ("tests/user/test_user_module.py", "-k", "ddp_optimizer_sync_spawn-3"),
    ),
    Mutation(
        "no_metric_sync",
        "distributed validation never syncs the torchmetrics states",
        ((EVAL, "        m.sync(\n", "        continue\n        m.sync(\n"),),
        ("tests/user/test_user_module.py", "-k", "ddp_spawn-2"),
    ),
    Mutation(
        "no_agreement_check",
        "epoch-end values computed from rank-local data are accepted",
        ((EVAL, "                same = (math.isnan(v)", "                same = True or (math.isnan(v)"),),
        ("tests/distributed/test_rank_local.py", "-k", "refuses_what"),
    ),
    Mutation(
        "validate_uses_lightnings_loop",
        "distlab validate / test run Lightning's padded loop instead of the exact evaluation",
        (
            (
                RZV,
                "            self._patched_loop.run = lambda: self._run_loop(trainer, pl_module, stage)",
                "            pass",
            ),
        ),
        ("tests/matrix/test_recipe_matrix.py", "-k", "digits_cpu and ddp_spawn"),
    ),
    # ---- rank-local code ------------------------------------------------------------------------------
    Mutation(
        "collectives_not_forbidden",
        "rank-local work may start a collective (it hangs until the process-group timeout)",
        (
            (
                LOCAL,
                "    for module, name in _targets():\n        original",
                "    for module, name in []:\n        original",
            ),
        ),
        ("tests/distributed/test_rank_local.py", "-k", "refused_and_sharded"),
    ),
    Mutation(
        "sample_on_rank_zero_under_fsdp2",
        "SampleText samples on rank 0 alone under FSDP2 (a forward is collective there)",
        ((LOCAL, "    if has_sharded_params(module):\n", "    if False:\n"),),
        ("tests/matrix/test_callback_matrix.py", "-k", "SampleText-default-fsdp2_spawn"),
    ),
    # ---- early stopping -----------------------------------------------------------------------------
    Mutation(
        "nan_check_skipped",
        "a NaN loss on one rank is not checked",
        (
            (
                ES,
                "        if not self.check_finite_loss:\n            return",
                "        if True:\n            return",
            ),
        ),
        ("tests/callbacks/test_rank_safe_callbacks.py", "-k", "nan_on_rank_one"),
    ),
    Mutation(
        "early_stop_per_rank",
        "every rank makes its own early-stopping decision",
        (
            (
                ES,
                "        if trainer.is_global_zero:\n            try:\n                decision = self._decide(trainer)",
                "        if True:\n            try:\n                decision = self._decide(trainer)",
            ),
            (
                ES,
                "        decision = broadcast_from_rank_zero(decision)  # every rank, unconditionally",
                "        pass",
            ),
        ),
        ("tests/callbacks/test_rank_safe_callbacks.py", "-k", "different_or_missing"),
    ),
    Mutation(
        "early_stop_at_epoch_end",
        "early stopping ignores RankZeroValidation and waits for a train-epoch end",
        ((RZV, "                cb._check_on_train_epoch_end = False", "                pass"),),
        ("tests/user/test_user_module.py", "-k", "ddp_optimizer_sync_spawn-2"),
    ),
    # ---- observability and logs ----------------------------------------------------------------------
    Mutation(
        "speed_counts_validation",
        "SpeedMonitor counts validation time as training time",
        ((SPEED, "time.perf_counter() - self._t0 - self._excluded - rzv", "time.perf_counter() - self._t0"),),
        ("tests/callbacks/test_speed_monitor.py", "-k", "hand_arithmetic"),
    ),
    Mutation(
        "speed_ignores_accumulation",
        "SpeedMonitor counts one micro-batch per optimizer step under gradient accumulation",
        ((SPEED, "n_micro = trainer.accumulate_grad_batches", "n_micro = 1"),),
        ("tests/callbacks/test_speed_monitor.py", "-k", "hand_arithmetic"),
    ),
    Mutation(
        "speed_window_never_moves",
        "each SpeedMonitor line averages from step 2 instead of the steps since the previous line",
        ((SPEED, "            self._mark = now\n", "            pass\n"),),
        ("tests/callbacks/test_speed_monitor.py", "-k", "hand_arithmetic"),
    ),
    Mutation(
        "resume_deletes_log",
        "a resumed fit's CSV logger deletes the metrics.csv of the steps before the checkpoint (Lightning's default)",
        (
            (
                "distlab/cli.py",
                "(AppendingCSVLogger if resume else CSVLogger)",
                "(CSVLogger if resume else CSVLogger)",
            ),
        ),
        ("tests/cli/test_checkpoints.py", "-k", "resumed"),
    ),
    Mutation(
        "optimizer_flops_miss_a_matmul",
        "the optimizer's Newton-Schulz FLOP count leaves out A @ A (SpeedMonitor's HFU too low)",
        (
            (
                "distlab/optim/functional.py",
                "return steps * (4 * k * k * w + 2 * k**3)",
                "return steps * (4 * k * k * w)",
            ),
        ),
        ("tests/optim/test_api.py", "-k", "flops"),
    ),
    Mutation(
        "class_after_recipe_not_first",
        "--model X typed after a recipe is parsed after it: the recipe's model values meet no class",
        (
            (
                "distlab/cli.py",
                "    if not moved:\n        return list(argv)",
                "    if True:\n        return list(argv)",
            ),
        ),
        ("tests/cli/test_configs.py", "-k", "class"),
    ),
    Mutation(
        "monitored_metric_traceback",
        "Lightning's ModelCheckpoint error for a metric nobody logs stays a traceback wall",
        (
            (
                "distlab/cli.py",
                '("MisconfigurationException", "could not find the monitored key"),',
                '("MisconfigurationException", "no such message"),',
            ),
        ),
        ("tests/cli/test_errors.py", "-k", "monitored"),
    ),
    Mutation(
        "bf16_newton_schulz_on_any_avx512",
        "Newton-Schulz defaults to bf16 on any AVX-512 CPU, where bf16 is emulated and 57-80x slower",
        (
            (
                "distlab/optim/functional.py",
                'return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))',
                'return bool(caps.get("avx512_bf16") or caps.get("amx_bf16") or caps.get("avx512_f"))',
            ),
        ),
        ("tests/optim/test_api.py", "-k", "native_bf16"),
    ),
    Mutation(
        "hfu_one_peak_for_every_dtype",
        "HFU divides bf16 Newton-Schulz FLOPs by the fp32 peak (a fast bf16 unit inflates it)",
        ((SPEED, "f / peak for f, peak in zip(", "f / self.peak_flops for f, peak in zip("),),
        ("tests/callbacks/test_speed_monitor.py", "-k", "own_peak"),
    ),
    Mutation(
        "module_ns_dtype_ignored",
        "GPTLightningModule(ns_dtype=...) never reaches the optimizer (the host's default wins)",
        (
            (
                "distlab/modules/gpt_module.py",
                "ns_dtype=self.hparams.ns_dtype",
                "ns_dtype=None",
            ),
        ),
        ("tests/unit/test_model.py", "-k", "ns_dtype"),
    ),
    Mutation(
        "ns_dtype_not_agreed",
        "each rank reads Newton-Schulz's default dtype off its own host: mixed hosts round in two dtypes",
        (
            (
                OPT,
                "lacking = any_rank([not native_bf16_matmul(device)], engine.group, device)[0]",
                "lacking = not native_bf16_matmul(device)",
            ),
        ),
        ("tests/optim/test_conv_and_auto.py", "-k", "agreed"),
    ),
)


def applicable(m: Mutation, root: Path = REPO) -> list[str]:
    """Problems that make ``m`` stale here (an edit's text not found exactly once); [] when it applies."""
    problems = []
    for path, old, _ in m.edits:
        count = (root / path).read_text().count(old)
        if count != 1:
            problems.append(f"{path}: the text to replace occurs {count} times: {old[:60]!r}")
    return problems


def copy_tree(dst: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    for f in files:
        src = REPO / f
        if src.is_file() and not f.startswith((".venv/", "runs/")):
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)


def run(m: Mutation, root: Path, timeout: int) -> tuple[str, str, float]:
    """Apply ``m`` in ``root``, run its tests, restore. Returns (verdict, evidence, seconds)."""
    problems = applicable(m, root)
    if problems:
        return "stale", problems[0], 0.0
    originals = {path: (root / path).read_text() for path, _, _ in m.edits}
    try:
        for path, old, new in m.edits:
            (root / path).write_text((root / path).read_text().replace(old, new))
        env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-p",
            "no:cacheprovider",
            "--timeout=300",
            *m.tests,
        ]
        t0 = time.monotonic()
        try:
            out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "caught", f"the tests hung past {timeout}s", time.monotonic() - t0
        seconds = time.monotonic() - t0
        lines = out.stdout.strip().splitlines()
        if out.returncode == 0:
            return "SURVIVED", lines[-1] if lines else "", seconds
        if out.returncode == 5:  # pytest: no test collected or selected
            return "stale", "the selection ran no test", seconds
        failed = next((ln for ln in lines if ln.startswith(("FAILED", "ERROR"))), lines[-1] if lines else "")
        return "caught", failed[:150], seconds
    finally:
        for path, text in originals.items():
            (root / path).write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", help="mutation names to run")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per mutation's test run")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    unknown = set(args.only or ()) - {m.name for m in MUTATIONS}
    if unknown:
        sys.exit(f"mutation_check: unknown mutation(s) {sorted(unknown)}; run --list to see the names")
    if args.list:
        for m in chosen:
            print(f"{m.name:36} {m.what}  [{' '.join(m.tests)}]")
        return
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="distlab_mutation_") as tmp:
        root = Path(tmp)
        copy_tree(root)
        print(f"{'mutation':36} {'verdict':9} {'s':>5}  evidence", flush=True)
        for m in chosen:
            verdict, evidence, seconds = run(m, root, args.timeout)
            verdicts.append(verdict)
            print(f"{m.name:36} {verdict:9} {seconds:5.0f}  {evidence}", flush=True)
    caught = verdicts.count("caught")
    print(
        f"{caught} of {len(verdicts)} caught; {verdicts.count('SURVIVED')} survived; {verdicts.count('stale')} stale"
    )
    sys.exit(0 if caught == len(verdicts) else 1)


if __name__ == "__main__":
    main()
