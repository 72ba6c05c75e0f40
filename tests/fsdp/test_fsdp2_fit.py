"""Lightning fits with strategy fsdp2_spawn (FSDP2 + DistMuonAdamW sharded) == a 1-process fit; DCP resume.

Like tests/distributed/test_strategy_fit.py: rank r gets rows [r*B, (r+1)*B) of the global batch the
1-process run sees, so the oracle is exact up to float summation order (FSDP2's reduce-scatter vs one
backward). Tolerances as there: losses 1e-4 relative; weights rtol 1e-3 / atol 2e-4 because AdamW
divides by sqrt(v), turning rounding of a near-zero embedding gradient into a visible change of that one
element (the debug embedding lr is ~1); Muon matrices agree to ~1e-6.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distlab.checkpoint import export_consolidated, export_safetensors, load_gpt
from distlab.cli import main
from distlab.models.gpt import GPT, GPTConfig
from tests.helpers.callbacks import load_rank_weights
from tests.helpers.cli import CONFIGS, write_yaml
from tests.helpers.shards import assert_shards_tile

GLOBAL_BATCH, STEPS = 6, 6
TOL = dict(rtol=1e-4, atol=1e-5)
WEIGHT_TOL = dict(rtol=1e-3, atol=2e-4)
CKPT = (
    "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
    "--trainer.callbacks.every_n_train_steps=3",
    "--trainer.callbacks.save_top_k=-1",
    "--trainer.callbacks.filename={step}",
)


def fit(
    tmp_path: Path,
    name: str,
    world: int,
    *extra: str,
    preset: str | None = "fsdp2_cpu.yaml",
    callbacks: tuple[dict, ...] = (),
) -> list[dict]:
    out = tmp_path / name
    trainer = {
        "default_root_dir": str(out / "run"),
        "devices": world,
        "callbacks": [
            {
                "class_path": "tests.helpers.callbacks.SaveRankWeights",
                "init_args": {"dirpath": str(out / "weights")},
            },
            *callbacks,
        ],
    }
    presets = ["--config", str(CONFIGS / "trainer" / preset)] if preset else ["--trainer.strategy=auto"]
    main(
        [
            "fit",
            "--config",
            str(CONFIGS / "debug.yaml"),
            *presets,
            "--config",
            write_yaml(out / "extra.yaml", {"trainer": trainer}),
            "--model.optimizer=muon",
            # fp32 Newton-Schulz on every host, as in test_strategy_fit.py: in bf16 a summation-order
            # difference can flip a rounding and grow (measured: an embedding element 0.099 off after 6 steps).
            "--model.ns_dtype=float32",
            f"--data.batch_size={GLOBAL_BATCH // world}",
            f"--trainer.max_steps={STEPS}",
            "--trainer.limit_val_batches=0",
            *extra,
        ]
    )
    return load_rank_weights(out / "weights", world)


def assert_matches(ranks: list[dict], oracle: dict) -> None:
    mean_losses = torch.tensor([r["losses"] for r in ranks]).mean(0)
    torch.testing.assert_close(mean_losses, torch.tensor(oracle["losses"]), **TOL)
    for k, v in oracle["state"].items():
        torch.testing.assert_close(ranks[0]["state"][k], v, **WEIGHT_TOL, msg=lambda m, k=k: f"{k}: {m}")


def assert_shards_match(ranks: list[dict], reference: dict) -> None:
    """FSDP2: each rank's own rows equal the reference's rows there (comparing the ranks' gathered copies
    would prove nothing: an all-gather hands every rank the same tensor)."""
    assert_shards_tile([r["shards"] for r in ranks], reference, **WEIGHT_TOL)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> dict:
    return fit(tmp_path_factory.mktemp("oracle"), "one", 1, preset=None)[0]


@pytest.fixture(scope="module")
def ref(tmp_path_factory) -> tuple[list[dict], Path]:
    """2 ranks, 6 steps, a sharded (DCP) checkpoint folder every 3 steps."""
    tmp = tmp_path_factory.mktemp("fsdp2")
    ranks = fit(tmp, "ref", 2, *CKPT, f"--trainer.callbacks.dirpath={tmp / 'ckpt'}")
    return ranks, tmp / "ckpt"


@pytest.mark.timeout(300)
def test_fsdp2_fit_equals_one_process(ref, oracle):
    ranks, _ = ref
    assert {r["strategy"] for r in ranks} == {"FSDP2Strategy"}
    assert_shards_match(ranks, oracle["state"])
    assert_matches(ranks, oracle)
    assert oracle["losses"][-1] < oracle["losses"][0]


@pytest.mark.timeout(300)
def test_checkpoint_is_sharded_and_exports_to_plain_gpt(ref, tmp_path):
    ranks, ckpt = ref
    final = ckpt / f"step={STEPS}.ckpt"
    assert final.is_dir() and len(list(final.glob("*.distcp"))) == 2  # one shard file per rank
    out = export_consolidated(final, tmp_path / "gpt.ckpt")
    model = load_gpt(out)
    for name, t in model.state_dict().items():
        assert torch.equal(t, ranks[0]["state"][f"model.{name}"]), name
    shared = load_gpt(export_safetensors(final, tmp_path / "gpt.safetensors"))  # no pickle on the way
    for name, t in shared.state_dict().items():
        assert torch.equal(t, ranks[0]["state"][f"model.{name}"]), name
    plain = GPT(GPTConfig(depth=1, aspect_ratio=32, head_dim=16, sequence_len=32))  # debug.yaml's model
    sd = torch.load(out, weights_only=True)["state_dict"]
    plain.load_state_dict({k.removeprefix("model."): v for k, v in sd.items()})


@pytest.mark.timeout(300)
def test_a_damaged_shard_of_the_checkpoint_folder_is_refused_naming_it(ref, tmp_path):
    """Every DCP folder carries an integrity record written with it; one changed byte in a shard is found, and a
    resume from that folder is refused in one line naming the shard (a copy is damaged; the fixture's stays)."""
    import shutil

    from distlab.checkpoint.integrity import RECORD, check_intact, damage
    from distlab.errors import ConfigError

    _, ckpt = ref
    final = ckpt / f"step={STEPS}.ckpt"
    assert (final / RECORD).is_file() and damage(final) is None
    copy = shutil.copytree(final, tmp_path / final.name)
    shard = sorted(copy.glob("*.distcp"))[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, inside the tensor bytes
    shard.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=rf"is damaged: {shard.name} differs from the CRC-32"):
        check_intact(copy)


@pytest.mark.timeout(400)
def test_resume_same_and_other_world_sizes(ref, tmp_path):
    ranks, ckpt = ref
    step3 = ckpt / "step=3.ckpt"
    same = fit(tmp_path, "same", 2, f"--ckpt_path={step3}")
    for k, v in ranks[0]["state"].items():
        assert torch.equal(same[0]["state"][k], v), f"same-world resume is not bit-identical at {k}"
    for world in (3, 1):  # DCP reshards params and the DTensor optimizer state onto the new world size
        resumed = fit(tmp_path, f"w{world}", world, f"--ckpt_path={step3}")
        assert resumed[0]["global_step"] == STEPS
        assert_shards_match(resumed, ranks[0]["state"])  # the uninterrupted 2-rank run
        for k, v in ranks[0]["state"].items():
            torch.testing.assert_close(
                resumed[0]["state"][k], v, **WEIGHT_TOL, msg=lambda m, k=k: f"{k}: {m}"
            )


ASYNC = "--trainer.strategy.async_save=true"


@pytest.mark.timeout(400)
def test_async_saves_write_the_same_checkpoints_and_resume_bit_identically(ref, tmp_path):
    """async_save: training is unchanged, each folder holds the step it is named after (the state was copied
    before the next steps changed it: equal to the synchronous run's folder, tensor for tensor), complete with its
    integrity record and no partial folder left; a resume from one is bit-identical to the uninterrupted run."""
    from distlab.checkpoint import checkpoint_step
    from distlab.checkpoint.integrity import damage

    ranks, ckpt = ref
    folder = tmp_path / "ckpt_async"
    got = fit(tmp_path, "async", 2, *CKPT, f"--trainer.callbacks.dirpath={folder}", ASYNC)
    for k, v in ranks[0]["state"].items():
        assert torch.equal(got[0]["state"][k], v), k
    assert sorted(p.name for p in folder.iterdir()) == ["step=3.ckpt", "step=6.ckpt"]  # nothing hidden left
    for name in ("step=3.ckpt", "step=6.ckpt"):
        assert damage(folder / name) is None and (folder / name / "integrity.json").is_file()
        ours = torch.load(export_consolidated(folder / name, tmp_path / f"a{name}"), weights_only=True)
        theirs = torch.load(export_consolidated(ckpt / name, tmp_path / f"s{name}"), weights_only=True)
        assert checkpoint_step(folder / name) == checkpoint_step(ckpt / name) == int(name[5])
        for k, v in theirs["state_dict"].items():
            assert torch.equal(ours["state_dict"][k], v), (name, k)
    resumed = fit(tmp_path, "async_resume", 2, f"--ckpt_path={folder / 'step=3.ckpt'}", ASYNC)
    for k, v in ranks[0]["state"].items():
        assert torch.equal(resumed[0]["state"][k], v), f"resume from an async checkpoint differs at {k}"


@pytest.mark.timeout(400)
def test_a_rank_killed_during_a_background_save_leaves_no_checkpoint_under_its_name(tmp_path):
    """SIGKILL on every rank while step 4's folder is being written in the background: no step=4.ckpt exists (only
    the hidden partial folder), and what a restarted job continues from is step 2, complete and intact."""
    from distlab.checkpoint import newest_checkpoint
    from distlab.checkpoint.integrity import damage

    folder = tmp_path / "ckpt"
    kill = {"class_path": "tests.helpers.callbacks.KillDuringBackgroundSave"}
    every2 = [a.replace("every_n_train_steps=3", "every_n_train_steps=2") for a in CKPT]
    with pytest.raises(BaseException):  # noqa: B017,PT011 - the ranks died: Lightning's launcher raises
        fit(tmp_path, "killed", 2, *every2, f"--trainer.callbacks.dirpath={folder}", ASYNC, callbacks=(kill,))
    names = sorted(p.name for p in folder.iterdir())
    assert "step=4.ckpt" not in names and ".step=4.ckpt.partial" in names, names
    assert newest_checkpoint([folder]) == folder / "step=2.ckpt"
    assert damage(folder / "step=2.ckpt") is None
