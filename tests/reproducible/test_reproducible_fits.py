"""Reproducible mode through the CLI: the debug GPT trained 12 steps on 1, 2, 4 and 8 ranks (8 oversubscribed on
a 2-core machine), with gradient clipping on, ends with the same weights and optimizer state (max difference 0) and
the same validation numbers; a run resumed on another world size ends where the uninterrupted one does."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from distlab.cli import main
from tests.helpers.cli import CONFIGS

STEPS = 12
REPRODUCIBLE = [
    "--trainer.strategy=distlab.strategies.OptimizerSyncDDPStrategy",
    "--trainer.strategy.start_method=forkserver",
    "--trainer.strategy.reproducible=true",
]


def fit(run: Path, world: int, *extra: str) -> None:
    main(
        ["fit", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={run}", f"--trainer.devices={world}",
         *REPRODUCIBLE, f"--trainer.max_steps={STEPS}", f"--trainer.val_check_interval={STEPS}", "--model.max_grad_norm=0.5",
         "--model.ns_dtype=float32", *extra]
    )  # fmt: skip


def final(run: Path) -> dict:
    ckpt = torch.load(next((run / "checkpoints").glob(f"*step={STEPS}*.ckpt")), weights_only=True)
    with open(run / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val_loss")]
    return {"weights": ckpt["state_dict"], "optimizer": ckpt["optimizer_states"][0]["state"], "val": rows[-1]}


def assert_same(a: dict, b: dict, what: str) -> None:
    for k, v in a["weights"].items():
        assert torch.equal(v, b["weights"][k]), (
            f"{what}: weight {k} differs by {(v - b['weights'][k]).abs().max()}"
        )
    for i, st in a["optimizer"].items():
        for name, t in st.items():
            assert torch.equal(t, b["optimizer"][i][name]), f"{what}: optimizer state {i}.{name} differs"


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict:
    run = tmp_path_factory.mktemp("reproducible") / "w1"
    fit(run, 1)
    return final(run)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 4, 8])
def test_every_world_size_trains_the_same_bits(one_process, tmp_path, world):
    fit(tmp_path / f"w{world}", world)
    got = final(tmp_path / f"w{world}")
    assert_same(one_process, got, f"{world} ranks vs 1")
    assert got["val"] == one_process["val"]  # val_loss, val_bpb, ... to the last printed digit


@pytest.mark.timeout(600)
def test_a_run_resumed_on_another_world_size_ends_where_the_uninterrupted_one_does(one_process, tmp_path):
    every_6 = [
        "--trainer.callbacks+=ModelCheckpoint",
        "--trainer.callbacks.every_n_train_steps=6",
        "--trainer.callbacks.save_top_k=-1",
    ]
    fit(tmp_path / "w4", 4, *every_6)
    halfway = next((tmp_path / "w4" / "checkpoints").glob("*step=6*.ckpt"))
    fit(tmp_path / "w2", 2, f"--ckpt_path={halfway}")
    assert_same(one_process, final(tmp_path / "w2"), "4 ranks to step 6, resumed on 2")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "extra, said",
    [
        (
            ["--trainer.devices=3"],
            "runs on a power-of-two number of ranks, and this run has 3; run on 1, 2, 4, 8 ranks",
        ),
        (
            ["--trainer.devices=2", "--trainer.accumulate_grad_batches=3"],
            "trainer.accumulate_grad_batches=3 under reproducible mode",
        ),
        (["--trainer.devices=2", "--trainer.strategy.micro_shards=6"], "micro_shards=6 is not accepted"),
    ],
    ids=["world-does-not-divide", "accumulation-set", "not-a-power-of-two"],
)
def test_what_the_mode_cannot_make_equal_is_refused_in_one_line(tmp_path, capsys, extra, said):
    with pytest.raises(SystemExit) as info:
        main(
            [
                "fit",
                "--config",
                str(CONFIGS / "debug.yaml"),
                f"--trainer.default_root_dir={tmp_path / 'run'}",
                *REPRODUCIBLE,
                *extra,
            ]
        )
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("distlab: error:")]
    assert info.value.code == 2 and len(lines) == 1 and said in lines[0], lines
    assert not (tmp_path / "run").exists()
