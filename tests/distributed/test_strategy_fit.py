"""Lightning fits with DistMuonAdamW == a 1-process fit on the concatenated batch; resume across world sizes.

The data module gives rank r rows [r*B, (r+1)*B) of the same global batch a 1-process run with batch
W*B sees, so the oracle is exact up to float summation order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distlab.cli import main
from tests.helpers.callbacks import load_rank_weights
from tests.helpers.cli import CONFIGS, rank_weights_config

GLOBAL_BATCH = 6
STEPS = 6
TOL = dict(rtol=1e-4, atol=1e-5)  # losses
# Weights: Adam divides by sqrt(v), so an embedding row whose gradient is ~0 turns reduction-order rounding
# into an O(lr) relative change of that row's tiny update (debug embedding lr ~1). Measured: 1 element of
# 8224 off by 6.4e-5 after 6 steps; everything else agrees to 1e-6.
WEIGHT_TOL = dict(rtol=1e-3, atol=2e-4)


def fit(tmp_path: Path, name: str, world: int, strategy: str, *extra: str) -> list[dict]:
    out = tmp_path / name
    trainer = {"devices": world, "strategy": strategy}
    cfg = rank_weights_config(out, out / "weights", trainer)
    main(
        [
            "fit",
            "--config",
            str(CONFIGS / "debug.yaml"),
            "--config",
            cfg,
            "--model.optimizer=muon",
            f"--data.batch_size={GLOBAL_BATCH // world}",
            f"--trainer.max_steps={STEPS}",
            "--trainer.limit_val_batches=0",
            "--model.max_grad_norm=1e9",  # never clips; the optimizer reports the synced gradient's norm
            # fp32 Newton-Schulz on every host: in bf16 a last-bit difference from the summation order can
            # flip a rounding and grow (measured: a grad norm 1.9e-4 off after 4 steps), hiding real drift.
            "--model.ns_dtype=float32",
            *extra,
        ]
    )
    return load_rank_weights(out / "weights", world)


def assert_ranks_identical(ranks: list[dict]) -> None:
    for r in ranks[1:]:
        for k, v in ranks[0]["state"].items():
            assert torch.equal(v, r["state"][k]), f"rank {r['rank']} differs at {k}"


def assert_matches(ranks: list[dict], oracle: dict) -> None:
    # Per-step loss: the mean of the equal-sized rank halves is the loss of the concatenated batch.
    mean_losses = torch.tensor([r["losses"] for r in ranks]).mean(0)
    torch.testing.assert_close(mean_losses, torch.tensor(oracle["losses"]), **TOL)
    # The gradient every rank's optimizer worked with is the 1-process gradient (not a sum over ranks).
    assert len(oracle["grad_norms"]) == STEPS
    for r in ranks:
        torch.testing.assert_close(torch.tensor(r["grad_norms"]), torch.tensor(oracle["grad_norms"]), **TOL)
    for k, v in oracle["state"].items():
        torch.testing.assert_close(ranks[0]["state"][k], v, **WEIGHT_TOL, msg=lambda m, k=k: f"{k}: {m}")


def one_rank_sync_trainer(tmp_path: Path, max_steps: int = 1):
    """A one-process Trainer under OptimizerSyncDDPStrategy: where its refusals and notes are made."""
    import lightning as L

    from distlab.strategies import OptimizerSyncDDPStrategy

    return L.Trainer(accelerator="cpu", devices=1, strategy=OptimizerSyncDDPStrategy(), max_steps=max_steps,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False, default_root_dir=tmp_path)  # fmt: skip


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> dict:
    return fit(tmp_path_factory.mktemp("oracle"), "one", 1, "auto")[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_optimizer_sync_strategy_equals_one_process(tmp_path, oracle, world):
    ranks = fit(tmp_path, "sync", world, "ddp_optimizer_sync_spawn")
    assert {r["strategy"] for r in ranks} == {"OptimizerSyncDDPStrategy"}
    assert_ranks_identical(ranks)
    assert_matches(ranks, oracle)
    assert oracle["losses"][-1] < oracle["losses"][0]  # it trained


@pytest.mark.timeout(300)
def test_plain_ddp_with_distmuon_equals_one_process(tmp_path, oracle):
    # Lightning's ddp averages in backward; the module picks grad_sync="averaged" (no second reduction).
    ranks = fit(tmp_path, "ddp", 2, "ddp_spawn")
    assert_ranks_identical(ranks)
    assert_matches(ranks, oracle)


@pytest.mark.timeout(120)
def test_optimizer_sync_refuses_plain_torch_optimizer(tmp_path):
    # A module that returns a non-syncing optimizer must fail in one line, not train unsynchronised.

    from distlab.data import TextDataModule
    from distlab.errors import ConfigError
    from tests.helpers.modules import PlainAdamWModule

    trainer = one_rank_sync_trainer(tmp_path)
    model = PlainAdamWModule(depth=1, aspect_ratio=32, head_dim=16, sequence_len=16)
    with pytest.raises(ConfigError, match="AdamW does not sync gradients"):
        trainer.fit(model, TextDataModule(seq_len=16, batch_size=2, max_val_windows=2))


@pytest.mark.timeout(120)
def test_an_optimizer_over_tensors_that_are_not_the_modules_is_refused(tmp_path):
    # P17 of the guard list: an optimizer built over a copy of the net trained nothing and said nothing.
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from distlab.errors import ConfigError
    from distlab.optim import DistMuonAdamW, muon_param_groups

    class OptimizesACopy(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self):
            return DistMuonAdamW(muon_param_groups(torch.nn.Linear(4, 2), verbose=False))

    trainer = one_rank_sync_trainer(tmp_path)
    with pytest.raises(ConfigError, match=r"updates 2 tensor\(s\) that are not parameters of OptimizesACopy"):
        trainer.fit(OptimizesACopy(), DataLoader(TensorDataset(torch.randn(4, 4)), batch_size=2))


@pytest.mark.timeout(120)
def test_trainable_parameters_no_optimizer_updates_are_named(tmp_path, caplog):
    # The guard list's p19: param groups that forgot the head trained the rest, and the head never, without a word.
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from distlab.optim import DistAdamW

    class ForgetsTheHead(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.body, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
            self.frozen = torch.nn.Linear(4, 4).requires_grad_(False)  # left out on purpose: no note

        def training_step(self, batch, batch_idx):
            return self.head(self.body(batch[0])).square().mean()

        def configure_optimizers(self):
            return DistAdamW(self.body.parameters(), lr=0.1)

    module = ForgetsTheHead()
    head = module.head.weight.detach().clone()
    trainer = one_rank_sync_trainer(tmp_path, max_steps=2)
    with caplog.at_level("INFO"):
        trainer.fit(module, DataLoader(TensorDataset(torch.randn(4, 4)), batch_size=2))
    assert torch.equal(module.head.weight, head)  # what the note is about: it did not train
    notes = [r.getMessage() for r in caplog.records if "in no optimizer" in r.getMessage()]
    assert len(notes) == 1 and "2 trainable parameter(s) of ForgetsTheHead" in notes[0], notes
    assert "['head.weight', 'head.bias']" in notes[0]


@pytest.mark.timeout(400)
def test_resume_same_and_different_world_sizes(tmp_path):
    # Reference: 2 ranks, 6 steps, checkpoint every 3 steps (optimizer state consolidated from both ranks).
    ckpt_cb = (
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.every_n_train_steps=3",
        "--trainer.callbacks.save_top_k=-1",
        f"--trainer.callbacks.dirpath={tmp_path / 'ckpt'}",
        "--trainer.callbacks.filename={step}",
    )
    ref = fit(tmp_path, "ref", 2, "ddp_optimizer_sync_spawn", *ckpt_cb)
    step3 = tmp_path / "ckpt" / "step=3.ckpt"
    assert step3.exists()
    full = torch.load(step3, weights_only=True)
    n_params = sum(len(g["params"]) for g in full["optimizer_states"][0]["param_groups"])
    assert len(full["optimizer_states"][0]["state"]) == n_params  # every rank's shard made it in

    same = fit(tmp_path, "same", 2, "ddp_optimizer_sync_spawn", f"--ckpt_path={step3}")
    for k, v in ref[0]["state"].items():
        assert torch.equal(same[0]["state"][k], v), f"same-world resume is not bit-identical at {k}"
    for world, strategy in ((3, "ddp_optimizer_sync_spawn"), (1, "auto")):
        resumed = fit(tmp_path, f"w{world}", world, strategy, f"--ckpt_path={step3}")
        assert resumed[0]["global_step"] == STEPS
        assert_ranks_identical(resumed)
        for k, v in ref[0]["state"].items():
            torch.testing.assert_close(resumed[0]["state"][k], v, **WEIGHT_TOL)


def two_rank_spawn_fit(tmp_path: Path):
    import lightning as L

    from distlab.data import TextDataModule
    from distlab.modules import GPTLightningModule
    from distlab.testing import TINY_GPT

    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_optimizer_sync_spawn", max_steps=1,
                        limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(GPTLightningModule(**TINY_GPT), TextDataModule(seq_len=32, batch_size=2))
    assert trainer.state.finished  # (a spawned fit returns its state to this process, not its step count)
    return trainer.strategy.cluster_environment.main_port


@pytest.mark.timeout(120)
def test_the_rendezvous_port_is_held_from_before_the_ranks_start(tmp_path, monkeypatch):
    """A port found free, then bound by rank 0 once it has started, can be taken in between ("address already in
    use", twice in the suite). Here another socket tries to take MASTER_PORT just as the ranks start: the
    launcher's own store already listens there, so it cannot, and the fit runs."""
    import os
    import socket

    import torch.multiprocessing as mp

    taken, start_processes = [], mp.start_processes

    def start_after_another_bind(*args, **kwargs):
        other = socket.socket()
        try:
            other.bind(("", int(os.environ["MASTER_PORT"])))
            other.listen()
            taken.append(other)
        except OSError:
            other.close()
        return start_processes(*args, **kwargs)

    monkeypatch.setattr(mp, "start_processes", start_after_another_bind)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    try:
        two_rank_spawn_fit(tmp_path)
    finally:
        for s in taken:
            s.close()
    assert not taken, "the ranks' port was free for another process to take as they started"


@pytest.mark.timeout(120)
def test_a_master_port_an_earlier_fit_still_listens_on_is_not_reused(tmp_path, monkeypatch):
    """Lightning leaves MASTER_PORT set, and an in-process fit its process group, whose store listens on that port: a
    later spawned fit in the same process (a notebook's second fit) failed with "address already in use"."""
    import socket

    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        monkeypatch.setenv("MASTER_PORT", str(held.getsockname()[1]))
        assert two_rank_spawn_fit(tmp_path) != held.getsockname()[1]
