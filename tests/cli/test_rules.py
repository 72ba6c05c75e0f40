"""Every rule across fields, and every check that needs the built objects, refuses its case in one line before
anything is written.

The rules are data (``CROSS_FIELD_RULES`` in distlab/preflight.py); ``CASES`` below holds at least one input
per rule, and ``test_every_rule_has_a_case`` fails when a rule is added without one. Each case runs the real
CLI in this process: exit 2, one line naming what the rule is about, no traceback, no run folder.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from distlab.cli import main
from distlab.preflight import CROSS_FIELD_RULES
from tests.helpers.cli import CONFIGS

DEBUG = ["--config", str(CONFIGS / "debug.yaml")]
MONITOR = [
    "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
    "--trainer.callbacks.monitor=val_loss",
]
GPT, TEXT = "distlab.modules.GPTLightningModule", "distlab.data.TextDataModule"
CNN, DIGITS = "distlab.modules.ImageClassifier", "distlab.data.DigitsDataModule"


def _trainer_only(tmp: Path) -> list[str]:
    cfg = yaml.safe_load((CONFIGS / "debug.yaml").read_text())
    path = tmp / "trainer_only.yaml"
    path.write_text(yaml.safe_dump({"trainer": cfg["trainer"]}))
    return ["--config", str(path)]


# rule name -> [(case id, args after the subcommand (with {T}: the trainer-only config), expected text)]
CASES: dict[str, list[tuple[str, list[str], str]]] = {
    "_fit_has_an_end": [
        ("no max_steps", [*DEBUG, "--trainer.max_steps=-1"], "trainer.max_steps must be a positive integer"),
        (
            "min beyond max",
            [*DEBUG, "--trainer.min_steps=100"],
            "trainer.min_steps=100 is beyond trainer.max_steps=8",
        ),
    ],
    "_model_and_data_fit_together": [
        (
            "gpt on digits",
            ["{T}", "--model", GPT, "--data", DIGITS],
            "GPTLightningModule trains on TextDataModule",
        ),
        (
            "cnn on text",
            ["{T}", "--model", CNN, "--data", TEXT],
            "ImageClassifier trains on DigitsDataModule",
        ),
    ],
    "_window_fits_context": [
        ("window", [*DEBUG, "--data.seq_len=64"], "data.seq_len=64 exceeds the model context")
    ],
    "_vocabulary_holds_tokens": [
        ("vocab", [*DEBUG, "--model.vocab_size=10"], "model.vocab_size=10 is smaller")
    ],
    "_classes_cover_labels": [
        (
            "classes",
            ["{T}", "--model", CNN, "--model.n_classes=5", "--data", DIGITS],
            "model.n_classes=5 but the digits",
        )
    ],
    "_options_take_effect": [
        ("muon-only", [*DEBUG, "--model.optimizer=adamw", "--model.muon_momentum=0.5"], "only apply to Muon"),
        (
            "warmdown of a constant schedule",
            [*DEBUG, "--model.schedule=constant", "--model.warmdown_ratio=0.9"],
            "model.warmdown_ratio=0.9 has no effect under model.schedule='constant'",
        ),
        (
            "floor of a constant schedule",
            [*DEBUG, "--model.schedule=constant", "--model.min_lr_ratio=0.5"],
            "model.min_lr_ratio=0.5 has no effect",
        ),
        (
            "warmdown of a cosine schedule",
            [*DEBUG, "--model.schedule=cosine", "--model.warmdown_ratio=0.9"],
            "has no effect under model.schedule='cosine'",
        ),
        (
            "micro_shards without reproducible mode",
            [
                *DEBUG,
                "--trainer.strategy=distlab.strategies.OptimizerSyncDDPStrategy",
                "--trainer.strategy.micro_shards=16",
            ],
            "trainer.strategy.micro_shards=16 is read only in reproducible mode",
        ),
        (
            "clip algorithm without a value",
            [*DEBUG, "--trainer.gradient_clip_algorithm=norm"],
            "clips nothing without trainer.gradient_clip_val",
        ),
    ],
    "_switches_agree": [
        (
            "barebones with logging",
            [*DEBUG, "--trainer.barebones=true", "--trainer.enable_model_summary=true"],
            "this config sets trainer.log_every_n_steps=1, trainer.enable_model_summary=True; to measure raw speed set "
            "--trainer.log_every_n_steps=null --trainer.enable_model_summary=false",
        ),
        (
            "barebones with a checkpoint callback",
            [*DEBUG, "--trainer.barebones=true", "--trainer.log_every_n_steps=null", *MONITOR[:1]],
            "and remove ModelCheckpoint from trainer.callbacks",
        ),
        (
            "checkpoint callback with checkpointing off",
            [*DEBUG, "--trainer.enable_checkpointing=false", *MONITOR[:1]],
            "trainer.enable_checkpointing=false, but trainer.callbacks holds ModelCheckpoint",
        ),
        (
            "progress bar callback with the bar off",
            [*DEBUG, "--trainer.callbacks+=lightning.pytorch.callbacks.TQDMProgressBar"],
            "trainer.enable_progress_bar=false, but trainer.callbacks holds TQDMProgressBar",
        ),
    ],
    "_ranks_get_their_share": [
        (
            "digits on two processes without Lightning's sampler",
            [
                "--config",
                str(CONFIGS / "digits_cpu.yaml"),
                "--trainer.devices=2",
                "--trainer.strategy=ddp_spawn",
                "--trainer.use_distributed_sampler=false",
            ],
            "the 2 x 1 processes would all train on the same batches",
        ),
    ],
    "_validation_is_reached": [
        ("validation off", [*DEBUG, *MONITOR, "--trainer.limit_val_batches=0"], "turns validation off"),
        (
            "beyond max_steps",
            [*DEBUG, *MONITOR, "--trainer.val_check_interval=100"],
            "is beyond trainer.max_steps",
        ),
        (
            "beyond max_steps counted in batches",
            [*DEBUG, *MONITOR, "--trainer.accumulate_grad_batches=4", "--trainer.val_check_interval=40"],
            "trainer.val_check_interval=40 is beyond trainer.max_steps=8 x accumulate_grad_batches=4 = 32 batches",
        ),
        (
            "epoch end never comes",
            [*DEBUG, *MONITOR, "--trainer.val_check_interval=null", "--trainer.check_val_every_n_epoch=1"],
            "never runs on an endless data stream",
        ),
        (
            "a share of a never-ending epoch",
            [*DEBUG, "--trainer.val_check_interval=0.5", "--trainer.check_val_every_n_epoch=1"],
            "trainer.val_check_interval=0.5 is a share of an epoch, and the training data is an endless stream",
        ),
    ],
    "_evaluation_has_batches": [
        ("validate nothing", ["validate", *DEBUG, "--trainer.limit_val_batches=0"], "evaluates nothing")
    ],
    "_limits_suit_the_data": [
        ("fraction of a stream", [*DEBUG, "--trainer.limit_train_batches=0.5"], "endless stream"),
        (
            "overfit on a fraction of a stream",
            [*DEBUG, "--trainer.overfit_batches=0.5"],
            "overfit_batches=0.5 is a fraction",
        ),
    ],
    "_precision_fits_the_device": [
        ("fp16 on cpu", [*DEBUG, "--trainer.precision=16-mixed"], "trainer.precision='16-mixed' is float16"),
        ("fsdp1 on cpu", [*DEBUG, "--trainer.strategy=fsdp"], "set trainer.strategy=fsdp2"),
        (
            "fsdp1 class on cpu",
            [*DEBUG, "--trainer.strategy=lightning.pytorch.strategies.FSDPStrategy"],
            "is Lightning's FSDPStrategy, which runs on CUDA GPUs only",
        ),
    ],
    "_data_paths_are_distinct": [
        ("twice", [*DEBUG, "--data.paths=[{F},{F}]"], "twice"),
        ("a folder and a file inside it", [*DEBUG, "--data.paths=[{D},{F}]"], "which is inside"),
    ],
    "_callbacks_suit_the_strategy": [
        (
            "EMA weights under FSDP2",
            [
                *DEBUG,
                "--trainer.strategy=fsdp2",
                "--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging",
            ],
            "trainer.callbacks has EMAWeightAveraging, Lightning's weight averaging",
        ),
        (
            "SWA under FSDP2",
            [
                *DEBUG,
                "--trainer.strategy=fsdp2",
                "--trainer.callbacks+=lightning.pytorch.callbacks.StochasticWeightAveraging",
                "--trainer.callbacks.swa_lrs=0.01",
            ],
            "trainer.callbacks has StochasticWeightAveraging",
        ),
    ],
    # ~1e14 parameters: more than any machine's memory (counted on the meta device, never built)
    "_model_fits_in_memory": [
        (
            "far too large",
            [*DEBUG, "--model.depth=200", "--model.aspect_ratio=1024"],
            "the model is too large for this machine",
        )
    ],
}


def test_every_rule_has_a_case():
    assert {rule.__name__ for rule in CROSS_FIELD_RULES} == set(CASES), (
        "each rule in CROSS_FIELD_RULES needs a case here"
    )


CASE_LIST = [(rule, *case) for rule, cases in CASES.items() for case in cases]


@pytest.mark.parametrize("rule, name, args, expected", CASE_LIST, ids=[f"{c[0]}-{c[1]}" for c in CASE_LIST])
def test_each_rule_refuses_its_case_before_anything_is_written(rule, name, args, expected, tmp_path, capsys):
    if rule == "_precision_fits_the_device" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    text = tmp_path / "a.txt"
    text.write_text("some text\n" * 50)
    args = [a.replace("{F}", str(text)).replace("{D}", str(tmp_path)) for a in args]
    expanded = [w for a in args for w in (_trainer_only(tmp_path) if a == "{T}" else [a])]
    sub = expanded[0] if expanded[0] in ("validate", "test", "predict") else "fit"
    expanded = expanded[1:] if sub != "fit" else expanded
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        main([sub, *expanded, f"--trainer.default_root_dir={run}"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("distlab: error:")]
    assert info.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert expected in lines[0], lines[0]
    assert not run.exists(), "the run folder was created"


# ---- checks that need the built objects (after the rules, still before anything is written) --------------------
def _refused(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("distlab: error:")]
    assert info.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


def test_a_subcommand_needs_its_loader(tmp_path, capsys):
    line = _refused(["predict", *DEBUG, f"--trainer.default_root_dir={tmp_path / 'run'}"], capsys)
    assert (
        "predict runs on predict_dataloader(), and neither TextDataModule nor GPTLightningModule" in line
    ), line
    assert not (tmp_path / "run").exists()


def test_token_ids_beyond_the_vocabulary_are_refused(tmp_path, capsys):
    import numpy as np

    from distlab.data.corpus import write_bin_shard

    for name in ("train.bin", "val.bin"):
        write_bin_shard(tmp_path / name, np.arange(0, 1000, dtype=np.uint16))  # ids up to 999 > 257
    line = _refused(
        ["fit", *DEBUG, f"--data.paths=[{tmp_path}]", f"--trainer.default_root_dir={tmp_path / 'run'}"],
        capsys,
    )
    assert "holds token id 999, but model.vocab_size=257" in line, line


@pytest.mark.parametrize(
    "alias, expected",
    [("best", "a new distlab command has none"), ("hpc", "no hpc_ckpt_*.ckpt"), ("last", "no last*.ckpt")],
)
@pytest.mark.parametrize("subcommand", ["fit", "validate"])
def test_a_checkpoint_alias_that_names_nothing_is_refused(subcommand, alias, expected, tmp_path, capsys):
    if alias == "last":
        args = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint"]
    else:
        args = []
    line = _refused(
        [subcommand, *DEBUG, *args, f"--ckpt_path={alias}", f"--trainer.default_root_dir={tmp_path / 'run'}"],
        capsys,
    )
    assert expected in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("subcommand", ["fit", "validate"])
def test_a_bare_state_dict_is_not_a_checkpoint_to_resume(subcommand, tmp_path, capsys):
    bare = tmp_path / "weights.pt"
    torch.save({"state_dict": {"model.w": torch.zeros(2)}}, bare)
    line = _refused(
        [subcommand, *DEBUG, f"--ckpt_path={bare}", f"--trainer.default_root_dir={tmp_path / 'run'}"], capsys
    )
    assert "is not a Lightning checkpoint (no pytorch-lightning_version, global_step)" in line, line


def test_a_warmup_beyond_max_steps_is_said_not_refused(tmp_path, caplog):
    """A recipe shrunk for a quick check (its warmup longer than the run) trains, and says so in one line."""
    import logging

    with caplog.at_level(logging.INFO):
        main(["fit", *DEBUG, "--model.warmup_steps=100", f"--trainer.default_root_dir={tmp_path / 'run'}"])
    assert (
        "model.warmup_steps=100 is beyond trainer.max_steps=8: the learning rate never reaches" in caplog.text
    )


def test_a_fit_that_will_not_validate_or_log_says_so_not_refused(tmp_path, caplog):
    """Lightning's defaults (validation at epoch ends) on the endless text stream, and a logging interval beyond
    the run: it trains, and one note each says what will not happen and what to set."""
    import logging

    args = [
        "--trainer.val_check_interval=null",
        "--trainer.check_val_every_n_epoch=1",
        "--trainer.log_every_n_steps=50",
    ]
    with caplog.at_level(logging.INFO):
        main(
            ["fit", *DEBUG, *args, "--trainer.max_steps=2", f"--trainer.default_root_dir={tmp_path / 'run'}"]
        )
    assert "this fit will not validate; set trainer.val_check_interval to a step count" in caplog.text
    assert (
        "trainer.log_every_n_steps=50 is beyond trainer.max_steps=2: no training loss is logged"
        in caplog.text
    )


def test_the_barebones_advice_taken_trains(tmp_path, capsys):
    """The settings the barebones refusal names, added to the same command, make a fit that Lightning accepts."""
    args = [*DEBUG, "--trainer.barebones=true", "--trainer.enable_model_summary=true", *MONITOR[:1]]
    line = _refused(["fit", *args, f"--trainer.default_root_dir={tmp_path / 'refused'}"], capsys)
    fixes = re.findall(r"--trainer\.\w+=\S+?(?=[ ,])", line)
    assert fixes, line
    kept = [a for a in args if a != MONITOR[0]] if "remove ModelCheckpoint" in line else args
    main(["fit", *kept, *fixes, f"--trainer.default_root_dir={tmp_path / 'run'}"])


def test_a_named_profiler_given_options_is_told_the_class_form_that_works(tmp_path, capsys):
    """``--trainer.profiler=simple --trainer.profiler.dirpath=...``: a name takes no options; the class form the
    refusal gives, run as written, profiles into that folder."""
    option = f"--trainer.profiler.dirpath={tmp_path / 'profile'}"
    line = _refused(
        ["fit", *DEBUG, "--trainer.profiler=simple", option, f"--trainer.default_root_dir={tmp_path / 'no'}"],
        capsys,
    )
    assert "trainer.profiler is the name 'simple', which takes no options" in line, line
    taken = line.split("name its class instead: ", 1)[1].split()
    assert taken[-1] == option, line
    main(
        [
            "fit",
            *DEBUG,
            *taken,
            "--trainer.profiler.filename=prof",
            f"--trainer.default_root_dir={tmp_path / 'run'}",
        ]
    )
    assert list((tmp_path / "profile").glob("*prof.txt")), list((tmp_path / "profile").iterdir())


def test_overlapping_schedules_and_epoch_end_callbacks_are_said_not_refused(tmp_path, caplog):
    """A warmup that runs into the warmdown, and a callback (a user's: the check reads the hooks it overrides) that
    acts only at epoch ends on the endless stream: it trains, and one note each says what will not happen as meant."""
    import logging

    args = [
        "--model.warmup_steps=2",
        "--model.warmdown_ratio=0.5",
        "--trainer.max_steps=2",
        "--trainer.callbacks+=tests.helpers.callbacks.EpochEndOnly",
        "--trainer.callbacks+=Timer",
        "--trainer.callbacks.interval=epoch",
        "--trainer.callbacks+=OnExceptionCheckpoint",
        f"--trainer.callbacks.dirpath={tmp_path / 'on_exception'}",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
    ]
    with caplog.at_level(logging.INFO):
        main(["fit", *DEBUG, *args])
    assert "model.warmup_steps=2 runs into the warmdown (the last 1 of trainer.max_steps=2" in caplog.text
    assert "EpochEndOnly acts at training-epoch boundaries only (on_train_epoch_end)" in caplog.text
    assert "ModelCheckpoint acts" not in caplog.text and "RankZeroValidation acts" not in caplog.text
    assert "Timer(interval=epoch) acts at the end of a training epoch" in caplog.text  # chosen by a setting
    assert (
        "OnExceptionCheckpoint is a Checkpoint callback, so Lightning adds no ModelCheckpoint" in caplog.text
    )


def test_a_validation_interval_counts_batches_not_optimizer_steps():
    """With accumulation, val_check_interval (batches) may exceed max_steps (optimizer steps) and still be reached."""
    from distlab.preflight import check_parsed

    monitor = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"monitor": "val_loss"},
    }
    trainer = {
        "max_steps": 8,
        "accumulate_grad_batches": 4,
        "val_check_interval": 12,
        "check_val_every_n_epoch": None,
    }
    check_parsed(
        "fit", {"trainer": {**trainer, "callbacks": [monitor]}}
    )  # 32 batches: validates at 12 and 24
