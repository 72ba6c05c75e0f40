"""The Lightning-parity matrix: each Trainer feature a user turns on x each distlab strategy, against Lightning's ``ddp``.

A user's own LightningModule (tests/helpers/parity.py: BatchNorm buffers, a data-independent buffer, every rank
starting from other weights, DistMuonAdamW with fp32 Newton-Schulz) must train under ``ddp_optimizer_sync`` and
``fsdp2`` to what Lightning's ``ddp`` gives it, for every feature in ``FEATURES``: the final weights and buffers on
every rank, the logged values, the learning rates, the step and epoch reached, and what the feature is about
(checkpoint files and their weights, the stop step, the log line) - or the strategy refuses the feature in one
line before the first training batch (distlab's ConfigError, or a refusal Lightning itself makes), and the cell
says which. Where one process on the
concatenated batches means the same training, it must equal the oracle too.

A new strategy joins by an entry in ``STRATEGIES``, a new feature by an entry in ``FEATURES`` (both in
tests/helpers/parity.py). All fits of the selected cells share one 2-rank gloo job (one process start); the
``*_spawn`` launchers are checked once, on the row that combines several features (:func:`test_spawn_launchers`).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch

from distlab.testing import run_distributed
from tests.helpers.parity import (
    FEATURES,
    ORACLE,
    STRATEGIES,
    WORLD,
    Feature,
    ParityData,
    ParityModule,
    checkpoint_weights,
    make_callbacks,
    one_process_fit,
    parity_job,
)

BY_NAME = {f.name: f for f in FEATURES}
CELLS = [(f.name, s) for f in FEATURES for s in STRATEGIES]
# One process vs 2 ranks: the gradient is the mean of 8 samples vs the mean of two means of 4 - the last bit
# differs, and Muon's Newton-Schulz and Adam's normalisation carry it through 6 steps.
ONE_PROCESS_ATOL = 2e-6  # measured up to 2.1e-7 on this host
# Logged values are computed from weights within the cell's tolerance: relative 1e-5 then, else bit-equal.
METRIC_RTOL = 1e-5
# Setting up the matrix runs every selected cell's fits (about 25 s on 2 cores); the first test pays for it.
JOB_TIMEOUT_S = 300


def _selected_features(session) -> list[str]:
    """The features of this module's selected tests (``-k`` runs only the fits it needs)."""
    mine = [
        item for item in session.items if getattr(getattr(item, "module", None), "__name__", "") == __name__
    ]
    names = {
        item.callspec.params["feature"]
        for item in mine
        if "feature" in getattr(getattr(item, "callspec", None), "params", {})
    }
    if any(getattr(item, "originalname", "") == "test_feature_took_effect" for item in mine):
        names.add("baseline")  # the effects compare with it
    if any(getattr(item, "originalname", "") == "test_spawn_launchers" for item in mine):
        names.add("combined")
    return [f.name for f in FEATURES if f.name in names]


@pytest.fixture(scope="module")
def matrix(request, tmp_path_factory) -> dict[tuple[str, str], list[dict]]:
    """{(feature, strategy): [rank 0's result, rank 1's]} for the selected cells, oracle included."""
    names = _selected_features(request.session)
    root = tmp_path_factory.mktemp("parity")
    by_rank = run_distributed(parity_job, WORLD, names, str(root), timeout=JOB_TIMEOUT_S)
    return {key: [r[key] for r in by_rank] for key in by_rank[0]}


def _close(got: dict, ref: dict, atol: float, what: str) -> None:
    assert got.keys() == ref.keys(), f"{what}: {sorted(got)} vs {sorted(ref)}"
    for name in ref:
        torch.testing.assert_close(
            got[name], ref[name], atol=atol, rtol=0, msg=lambda m, name=name: f"{what} {name}: {m}"
        )


def _refusal(out: dict, expected: str | tuple[str, str], where: str) -> None:
    kind, text = expected if isinstance(expected, tuple) else ("ConfigError", expected)
    assert out.get("error_type") == kind, f"{where}: expected a one-line {kind}, got {out.get('error')!r}"
    assert "\n" not in out["error"], f"{where}: the refusal is not one line: {out['error']!r}"
    assert text in out["error"], f"{where}: {out['error']!r} does not say {text!r}"
    assert out["batches"] == 0, (
        f"{where}: refused after {out['batches']} training batches, not before training"
    )


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
@pytest.mark.parametrize("feature,strategy", CELLS, ids=[f"{f}-{s}" for f, s in CELLS])
def test_cell(matrix, feature: str, strategy: str) -> None:
    f: Feature = BY_NAME[feature]
    outs, oracle = matrix[(feature, strategy)], matrix[(feature, ORACLE)]
    if f.oracle_raises is not None:  # ddp itself cannot train it here: every strategy must refuse it up front
        for r, ref in enumerate(oracle):
            assert f.oracle_raises in ref.get("error", ""), f"oracle rank {r}: {ref.get('error')!r}"
    else:
        for r, ref in enumerate(oracle):
            assert "error" not in ref, f"the oracle failed on rank {r}:\n{ref['traceback']}"
    if strategy in f.refused:
        for r, out in enumerate(outs):
            _refusal(out, f.refused[strategy], f"{strategy} rank {r}")
        return
    atol = f.tolerance(strategy)
    for r, (out, ref) in enumerate(zip(outs, oracle, strict=True)):
        where = f"{feature} under {strategy}, rank {r} (tolerance {atol}: {f.why})"
        assert "error" not in out, f"{where}:\n{out['traceback']}"
        assert (out["step"], out["epoch"], out["batches"]) == (ref["step"], ref["epoch"], ref["batches"]), (
            where
        )
        _close(out["state"], ref["state"], atol, where)  # weights and buffers (BatchNorm's differ per rank)
        assert out["lrs"] == pytest.approx(ref["lrs"], rel=1e-12), where
        assert out["metrics"].keys() == ref["metrics"].keys(), where
        for name, value in ref["metrics"].items():
            assert out["metrics"][name] == pytest.approx(value, rel=METRIC_RTOL if atol else 0), (
                f"{where}: {name}"
            )
        assert out.get("checkpoints") == ref.get("checkpoints"), f"{where}: checkpoint files"
        if f.told is not None and r == 0:
            assert any(f.told in line for line in out["told"]), (
                f"{where}: rank 0 did not say {f.told!r}: {out['told']}"
            )
    params = [k for k in outs[0]["state"] if k not in dict(ParityModule(**f.module).net.named_buffers())]
    for r, out in enumerate(outs[1:], start=1):  # every rank holds the same weights, bit for bit
        _close(
            {k: out["state"][k] for k in params}, {k: outs[0]["state"][k] for k in params}, 0.0, f"rank {r}"
        )
    if outs[0].get("checkpoints") and f.resume_at is None:  # what was saved at each step, not only when
        for name in outs[0]["checkpoints"]:
            got = checkpoint_weights(Path(outs[0]["root"]) / "ckpt" / name)
            ref = checkpoint_weights(Path(oracle[0]["root"]) / "ckpt" / name)
            _close(got, ref, atol, f"{feature} under {strategy}: checkpoint {name}")


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
@pytest.mark.parametrize("feature", [f.name for f in FEATURES if f.effect is not None])
def test_feature_took_effect(matrix, feature: str) -> None:
    """A cell has teeth only if the feature did something in the oracle's run (a clip threshold never reached, a
    scheduler never stepped, an early stop that never comes would compare nothing): ``Feature.effect``."""
    f = BY_NAME[feature]
    ref, base = matrix[(feature, ORACLE)][0], matrix[("baseline", ORACLE)][0]
    seen = {k: ref.get(k) for k in ("step", "epoch", "batches", "lrs0", "lrs", "checkpoints")}
    seen["max grad norm, max |g|"] = (
        [max(v) for v in zip(*ref["grad_stats"], strict=True)] if ref.get("grad_stats") else None
    )
    assert f.effect(ref, base), f"{feature}: the oracle's run does not show the feature at work: {seen}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("feature", [f.name for f in FEATURES if f.one_process])
def test_one_process(matrix, tmp_path, feature: str) -> None:
    """One process on the concatenated batches (the ranks' global batch) equals the oracle: the oracle itself is
    right, not only the strategies equal to it."""
    f = BY_NAME[feature]
    ref = matrix[(feature, ORACLE)][0]
    one = one_process_fit(f, tmp_path)
    assert one["step"] == ref["step"]
    assert one["lrs"] == pytest.approx(ref["lrs"], rel=1e-12)
    _close(one["state"], ref["state"], ONE_PROCESS_ATOL, f"{feature}: one process vs ddp on 2 ranks")


# ---- the *_spawn launchers, once, on the row that combines several features -----------------------------
def _spawn_fit(strategy: str, feature: Feature, root: Path) -> tuple[dict, list[str]]:
    import lightning as L

    from distlab.strategies import FSDP2Strategy, OptimizerSyncDDPStrategy

    cls = {"ddp_optimizer_sync": OptimizerSyncDDPStrategy, "fsdp2": FSDP2Strategy}[strategy]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=WORLD,
        # both start methods of distlab's launcher, once each
        strategy=cls(
            start_method="spawn" if strategy == "ddp_optimizer_sync" else "forkserver",
            timeout=timedelta(seconds=60),
        ),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        callbacks=make_callbacks(feature.callbacks, root),
        **feature.trainer,
    )
    module = ParityModule(**feature.module)
    trainer.fit(module, ParityData(**feature.data))  # spawn: rank 0's weights come back to this process
    state = {k: v.detach().clone() for k, v in module.net.state_dict().items()}
    return state, sorted(p.name for p in (root / "ckpt").iterdir())


@pytest.mark.timeout(JOB_TIMEOUT_S + 180)
def test_spawn_launchers(matrix, tmp_path, monkeypatch) -> None:
    """Each strategy's ``*_spawn`` variant (the launcher CPU CI and notebooks use) on the "combined" row
    (clipping, accumulation, a per-step scheduler, dict batches from a custom collate_fn, periodic checkpoints):
    rank 0's weights and buffers, returned to this process by the launcher, and the checkpoint files equal the
    oracle's."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # the ranks' DistributedSampler seed, as in the matrix's job
    f = BY_NAME["combined"]
    ref = matrix[("combined", ORACLE)][0]
    for strategy in STRATEGIES:
        state, ckpts = _spawn_fit(strategy, f, tmp_path / strategy)
        assert ckpts == ref["checkpoints"], strategy
        _close(state, ref["state"], f.tolerance(strategy), f"{strategy}_spawn vs ddp (tolerance: {f.why})")


def test_matrix_is_data() -> None:
    """Every feature is a valid row: unique names, refusals only for known strategies, a one-process check only
    where one process sees the same batches, tolerances stated with a reason."""
    assert len(BY_NAME) == len(FEATURES)
    for f in FEATURES:
        assert set(f.refused) <= set(STRATEGIES), f.name
        if f.oracle_raises is not None:
            assert set(f.refused) == set(STRATEGIES), (
                f"{f.name}: ddp cannot train it here, so every strategy must refuse it"
            )
        if f.one_process:
            assert f.module.get("batchnorm") is False and f.data.get("kind", "tensor") == "tensor", f.name
        if any(f.tolerance(s) for s in STRATEGIES):
            assert f.why != Feature.why, f"{f.name}: say why its tolerance is not 0"


def test_grad_scaler_refused() -> None:
    """precision="16-mixed" on CUDA comes with a gradient scaler, which skips a step when its rank's gradients
    hold an inf: under ddp_optimizer_sync those are local, so ranks would skip different steps and hang. CPU runs
    have no scaler (the matrix's precision_16_mixed row), so a stand-in scaler shows the refusal here."""
    from types import SimpleNamespace

    from lightning.pytorch.plugins.precision import MixedPrecision
    from lightning.pytorch.trainer.states import TrainerFn

    from distlab.errors import ConfigError
    from distlab.strategies import OptimizerSyncDDPStrategy

    class EnabledScaler:
        def is_enabled(self) -> bool:
            return True

    plugin = MixedPrecision(precision="16-mixed", device="cuda", scaler=EnabledScaler())
    strategy = OptimizerSyncDDPStrategy(precision_plugin=plugin)
    trainer = SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.FITTING), gradient_clip_val=None)
    with pytest.raises(ConfigError, match="ranks would skip different steps"):
        strategy.check_trainer(trainer)
