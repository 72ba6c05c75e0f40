"""A fit's checkpoint, used as users do: resumed under another config (its values are said, never applied
silently), exported to safetensors for sharing without pickle, and sampled from either form."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distlab.cli import main
from tests.helpers.cli import CONFIGS

DEBUG = ["--config", str(CONFIGS / "debug.yaml")]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("fitted") / "run"
    main(
        [
            "fit",
            *DEBUG,
            f"--trainer.default_root_dir={run}",
            "--trainer.max_steps=2",
            "--trainer.val_check_interval=2",
        ]
    )
    return next((run / "checkpoints").glob("*.ckpt"))


@pytest.mark.timeout(240)
def test_values_from_the_checkpoint_that_differ_are_said(fitted, tmp_path, capsys, caplog):
    capsys.readouterr()
    caplog.clear()
    # A config file asks for depth 2 and another learning rate; the checkpoint was trained with depth 1:
    # the checkpoint's values win (its weights need them) and the line says which differed.
    other = tmp_path / "other.yaml"
    other.write_text("model:\n  init_args:\n    depth: 2\n    matrix_lr: 0.5\n")
    run = [f"--trainer.default_root_dir={tmp_path}"]
    main(["validate", *DEBUG, "--config", str(other), *run, f"--ckpt_path={fitted}"])
    said = capsys.readouterr().err + capsys.readouterr().out + caplog.text
    line = next(ln for ln in said.splitlines() if "from the checkpoint, differing from the config" in ln)
    assert "model.depth=1 (config: 2)" in line and "(config: 0.5)" in line
    assert "model.n_head" not in line  # equal values are not listed
    assert "model.betas" not in line  # the same pair, a list in the checkpoint and a tuple in the config


@pytest.mark.timeout(240)
def test_a_value_typed_on_the_command_line_beats_the_checkpoint(fitted, tmp_path, capsys, caplog):
    capsys.readouterr()
    caplog.clear()
    run = [f"--trainer.default_root_dir={tmp_path / 'lr'}"]
    main(["validate", *DEBUG, *run, "--model.matrix_lr=0.5", f"--ckpt_path={fitted}"])
    said = capsys.readouterr().err + caplog.text
    assert "kept from the command line over the checkpoint: model.matrix_lr=0.5" in said
    # a typed architecture the weights cannot fit: one line naming the mismatch, nothing else run
    run = [f"--trainer.default_root_dir={tmp_path / 'depth'}"]
    with pytest.raises(SystemExit) as stop:
        main(["validate", *DEBUG, *run, "--model.depth=2", f"--ckpt_path={fitted}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "holds weights for another model than GPTLightningModule builds" in err
    assert "trained with depth=1, and this run sets depth=2; set model.depth=1" in err
    assert "Traceback" not in err


@pytest.mark.timeout(240)
def test_export_to_safetensors_and_generate_from_it(fitted, tmp_path, capsys):
    from safetensors import safe_open

    out = tmp_path / "model.safetensors"
    main(["export", "--ckpt_path", str(fitted), "--out", str(out)])
    with safe_open(str(out), framework="pt") as f:
        keys, meta = set(f.keys()), f.metadata()
    state = torch.load(fitted, weights_only=True)["state_dict"]
    assert keys == {k for k in state if k.startswith("model.")}
    assert '"depth": 1' in meta["distlab_hyper_parameters"]
    plain = tmp_path / "plain"
    plain.write_text("")  # what the umask gives any new file: the export is shared as readily
    assert out.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
    capsys.readouterr()
    sample = ["--prompt", "def ", "--max_new_tokens", "40", "--seed", "3"]
    main(["generate", "--ckpt_path", str(fitted), *sample])
    from_ckpt = capsys.readouterr().out
    main(["generate", "--ckpt_path", str(out), *sample])
    assert capsys.readouterr().out == from_ckpt
    before = out.read_bytes()
    with pytest.raises(SystemExit) as info:  # an existing file is never replaced silently
        main(["export", "--ckpt_path", str(fitted), "--out", str(out)])
    assert info.value.code == 2 and "exists; pass --overwrite true" in capsys.readouterr().err
    assert out.read_bytes() == before


@pytest.mark.timeout(240)
def test_generate_refuses_a_setting_the_model_cannot_take_before_writing_anything(fitted, capsys):
    """A check that needs the model (top_k beyond its vocabulary) runs before the prompt is printed: a refused
    command leaves no half-written result in a redirected file."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["generate", "--ckpt_path", str(fitted), "--top_k", "100000"])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == "", out
    assert "distlab: error: --top_k 100000 is more than the model's vocabulary (257 tokens)" in err, err


@pytest.mark.timeout(240)
def test_a_resumed_fit_keeps_the_training_log_before_the_checkpoint(tmp_path):
    """Lightning's CSVLogger deletes an existing metrics.csv; a resume must append to it instead."""
    import csv

    run = tmp_path / "run"
    args = ["fit", *DEBUG, f"--trainer.default_root_dir={run}"]
    main([*args, "--trainer.max_steps=4", "--trainer.val_check_interval=4"])
    (ckpt,) = (run / "checkpoints").glob("*.ckpt")
    main([*args, "--trainer.max_steps=8", "--trainer.val_check_interval=4", f"--ckpt_path={ckpt}"])
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    train_steps = sorted(int(r["step"]) for r in rows if r.get("train_loss"))
    assert train_steps == list(range(8)), train_steps  # steps 0-3 from the first fit, 4-7 from the resume
    val_steps = sorted(int(r["step"]) for r in rows if r.get("val_loss"))
    assert len(val_steps) == 2, rows  # the first fit's validation row survived, with its column


@pytest.mark.timeout(120)
def test_weights_that_do_not_fit_say_which_keys_in_one_line(fitted, tmp_path):
    from distlab.checkpoint import load_gpt
    from distlab.errors import ConfigError

    ckpt = torch.load(fitted, weights_only=True)
    state = ckpt["state_dict"]
    assert load_gpt(fitted) is not None  # the file as written loads
    # A DDP-wrapped save (module.) loads too: the prefix is stripped.
    wrapped = {**ckpt, "state_dict": {k.replace("model.", "model.module.", 1): v for k, v in state.items()}}
    torch.save(wrapped, tmp_path / "wrapped.ckpt")
    assert load_gpt(tmp_path / "wrapped.ckpt") is not None
    # One key dropped, one extra, one of another shape: each is named.
    head = next(k for k in state if k.endswith("lm_head.weight"))
    dropped = next(k for k in state if k.endswith("wte.weight"))
    broken = {k: v for k, v in state.items() if k != dropped}
    broken["model.extra.weight"] = torch.zeros(1)
    broken[head] = torch.zeros(3, 3)
    torch.save({**ckpt, "state_dict": broken}, tmp_path / "broken.ckpt")
    with pytest.raises(ConfigError) as err:
        load_gpt(tmp_path / "broken.ckpt")
    line = str(err.value)
    assert "\n" not in line, line
    assert "1 missing key(s) (wte.weight)" in line and "1 unexpected key(s) (extra.weight)" in line, line
    assert "1 of another shape (lm_head.weight: (3, 3) in the file" in line, line


@pytest.mark.timeout(240)
def test_a_resume_with_other_data_settings_says_so(fitted, tmp_path, capsys, caplog):
    capsys.readouterr()
    caplog.clear()
    run = [
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.max_steps=3",
        "--trainer.val_check_interval=3",
    ]
    main(["fit", *DEBUG, *run, "--data.batch_size=8", f"--ckpt_path={fitted}"])
    said = capsys.readouterr().err + caplog.text
    assert (
        "resuming with other data settings than the checkpoint's run: data.batch_size=8 (checkpoint: 4)"
        in said
    )
    caplog.clear()  # an evaluation on data drawn another way than the run's says so too
    main(
        [
            "validate",
            *DEBUG,
            f"--trainer.default_root_dir={tmp_path / 'v'}",
            "--data.val_fraction=0.05",
            f"--ckpt_path={fitted}",
        ]
    )
    said = capsys.readouterr().err + caplog.text
    assert (
        "validate runs with other data settings than the checkpoint's run: data.val_fraction=0.05" in said
    ), said[-800:]


@pytest.mark.timeout(240)
def test_a_resume_that_draws_its_batches_another_way_says_so(fitted, tmp_path, capsys, caplog):
    """Reproducible mode draws micro_shards x batch_size windows per step: a resume into it from a plain run does
    not continue that run's data, though no data setting changed (and a resume under the same plan says nothing)."""
    run = ["--trainer.max_steps=3", "--trainer.val_check_interval=3", f"--ckpt_path={fitted}"]
    plain_said = "the checkpoint's run drew"
    capsys.readouterr()
    caplog.clear()
    main(["fit", *DEBUG, *run, f"--trainer.default_root_dir={tmp_path / 'same'}"])
    assert plain_said not in capsys.readouterr().err + caplog.text
    reproducible = [
        "--trainer.strategy=distlab.strategies.OptimizerSyncDDPStrategy",
        "--trainer.strategy.reproducible=true",
        "--trainer.strategy.micro_shards=4",
    ]
    main(["fit", *DEBUG, *run, *reproducible, f"--trainer.default_root_dir={tmp_path / 'repro'}"])
    said = capsys.readouterr().err + caplog.text
    assert (
        "the data is drawn as 16 windows per step (reproducible mode: batch_size 4 x micro_shards 4) from "
        in said
        and "windows, and the checkpoint's run drew 4 windows per micro step (batch_size 4 x 1 rank) from "
        in said
    ), said[-800:]


@pytest.mark.timeout(120)
@pytest.mark.skipif(
    not os.path.exists("/dev/full"), reason="needs /dev/full (a device whose writes fail: no space)"
)
def test_a_sample_that_standard_output_cannot_take_is_said_as_that(fitted):
    """`generate > file` on a full disk: the failing write is standard output's, not a run folder's."""
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "distlab", "generate", f"--ckpt_path={fitted}", "--max_new_tokens=3"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=100,
        )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "could not write the result to standard output (No space left on device)" in lines[0]
    closed = subprocess.run(  # and with standard output closed (`>&-`)
        [sys.executable, "-m", "distlab", "generate", f"--ckpt_path={fitted}", "--max_new_tokens=3"],
        stdout=None,
        stderr=subprocess.PIPE,
        text=True,
        timeout=100,
        preexec_fn=lambda: os.close(1),
    )
    lines = closed.stderr.strip().splitlines()
    assert closed.returncode == 1 and len(lines) == 1, closed.stderr
    assert "standard output is closed, so the result has nowhere to go" in lines[0]


@pytest.mark.timeout(240)
def test_validate_last_evaluates_the_fits_last_checkpoint(fitted, tmp_path, capsys):
    """``--ckpt_path last`` for validate: the fit's last.ckpt in the same run folder (Lightning alone would look in
    the evaluation's own checkpoint folder, find nothing and evaluate the initial weights with a warning)."""
    import shutil

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(fitted, run / "checkpoints" / "last.ckpt")

    def val_bpb(ckpt: str) -> str:
        capsys.readouterr()
        main(["validate", *DEBUG, f"--trainer.default_root_dir={run}", f"--ckpt_path={ckpt}"])
        out = capsys.readouterr().out
        return next(line for line in out.splitlines() if "val_bpb" in line)

    assert val_bpb("last") == val_bpb(str(run / "checkpoints" / "last.ckpt"))


@pytest.mark.timeout(240)
def test_a_resume_trains_with_the_optimizer_settings_it_was_given(fitted, tmp_path, capsys, caplog):
    """torch's load_state_dict would restore the checkpoint's lr and weight decay over the ones typed on the command
    line (which the CLI says it kept): the resumed optimizer's groups and the schedule's base rates are the new ones;
    a resume that changes nothing keeps every setting and says nothing."""
    import shutil

    def resume(folder: str, *extra: str) -> dict:
        run = tmp_path / folder
        shutil.copytree(fitted.parent.parent, run)
        ckpt = run / "checkpoints" / fitted.name
        main(
            [
                "fit",
                *DEBUG,
                f"--trainer.default_root_dir={run}",
                "--trainer.max_steps=3",
                *extra,
                f"--ckpt_path={ckpt}",
            ]
        )
        return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)

    saved = torch.load(fitted, weights_only=True)
    before = {g["name"]: g for g in saved["optimizer_states"][0]["param_groups"]}
    capsys.readouterr()
    caplog.clear()
    after = resume("changed", "--model.matrix_lr=0.05", "--model.weight_decay=0.1")
    said = capsys.readouterr().err + caplog.text
    groups = {g["name"]: g for g in after["optimizer_states"][0]["param_groups"]}
    assert before["matrix"]["initial_lr"] != 0.05 and groups["matrix"]["initial_lr"] == 0.05
    assert all(g["weight_decay"] == 0.1 for g in groups.values()), groups
    base = dict(
        zip(
            (g["name"] for g in after["optimizer_states"][0]["param_groups"]),
            after["lr_schedulers"][0]["base_lrs"],
            strict=True,
        )
    )
    assert base["matrix"] == 0.05 and base["embedding"] == before["embedding"]["initial_lr"]
    assert (
        "takes this run's settings over the checkpoint's" in said
        and "'matrix' lr (the schedule's base)" in said
    )

    caplog.clear()
    same = resume("same")  # (max_steps 2 -> 3 moves the schedule: only its rate at the resumed step is noted)
    said = capsys.readouterr().err + caplog.text
    assert not any(k in said for k in ("weight_decay", "betas", "momentum", "the schedule's base")), said
    for g in same["optimizer_states"][0]["param_groups"]:
        b = before[g["name"]]
        assert (g["weight_decay"], g["initial_lr"]) == (b["weight_decay"], b["initial_lr"]), g["name"]


@pytest.mark.timeout(240)
def test_a_changed_lr_takes_the_schedules_fraction_from_the_first_resumed_step(tmp_path):
    """A resume with a new matrix lr mid-warmup: the first resumed step trains at the checkpoint's scheduled rate
    scaled by new/old (the schedule's fraction of the new base), not at the new base itself; the other groups at the
    checkpoint's rate. Oracle: the rates the checkpoint saved, and Lightning's LearningRateMonitor reading the
    optimizer at that step."""
    import csv

    run = tmp_path / "run"
    schedule = [
        "--model.warmup_steps=10",
        "--model.warmdown_ratio=0",
    ]  # step 2 of 10 warming up: a fraction < 1
    main(["fit", *DEBUG, f"--trainer.default_root_dir={run}", "--trainer.max_steps=2", *schedule])
    ckpt = run / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True)
    groups = {g["name"]: g for g in saved["optimizer_states"][0]["param_groups"]}
    assert 0 < groups["matrix"]["lr"] < groups["matrix"]["initial_lr"], groups["matrix"]
    new = 0.05
    main(
        ["fit", *DEBUG, f"--trainer.default_root_dir={run}", "--trainer.max_steps=3", *schedule, f"--model.matrix_lr={new}",
         "--trainer.callbacks+=lightning.pytorch.callbacks.LearningRateMonitor",
         "--trainer.callbacks.logging_interval=step", f"--ckpt_path={ckpt}"]
    )  # fmt: skip
    with open(run / "metrics.csv") as f:  # the resumed run's first rates (the first run had no monitor)
        row = next(r for r in csv.DictReader(f) if any(k.startswith("lr-") and r[k] for k in r))
    logged = {k.rsplit("/", 1)[-1]: float(v) for k, v in row.items() if k.startswith("lr-") and v}
    assert set(logged) == set(groups), logged
    scale = new / groups["matrix"]["initial_lr"]
    assert logged["matrix"] == pytest.approx(groups["matrix"]["lr"] * scale, rel=1e-6), (
        logged,
        groups["matrix"],
    )
    for name in set(groups) - {"matrix"}:
        assert logged[name] == pytest.approx(groups[name]["lr"], rel=1e-6), (name, logged, groups[name])


@pytest.mark.timeout(240)
def test_each_evaluated_checkpoint_keeps_its_own_log_and_config(fitted, tmp_path):
    """Two validations in one run folder: each checkpoint's metrics.csv and config.yaml in a folder of its own (one
    folder for all evaluations: the second replaced the first's record, and their rows could not be told apart)."""
    import shutil

    import yaml

    run = tmp_path / "run"
    shutil.copytree(fitted.parent.parent, run)
    first = run / "checkpoints" / fitted.name
    second = run / "checkpoints" / "copy.ckpt"
    shutil.copy(first, second)
    for ckpt in (first, second):
        main(["validate", *DEBUG, f"--trainer.default_root_dir={run}", f"--ckpt_path={ckpt}"])
    for ckpt in (first, second):
        folder = run / "validate" / ckpt.name.removesuffix(".ckpt")
        assert (folder / "metrics.csv").is_file(), sorted(map(str, run.rglob("*")))
        assert yaml.safe_load((folder / "config.yaml").read_text())["ckpt_path"] == str(ckpt)


def test_a_resume_that_ends_on_another_checkpoints_save_brings_last_up_to_date(tmp_path, capsys):
    """A resume whose final step is saved by a step checkpoint (every_n_train_steps) still leaves last.ckpt at that
    step: the next --ckpt_path last continues from it (it once held the earlier run's step, so the steps were trained
    again and logged twice)."""
    import csv

    from distlab.checkpoint import checkpoint_step

    run = tmp_path / "run"
    every_3 = [
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.every_n_train_steps=3",
        "--trainer.callbacks.save_top_k=-1",
        "--trainer.callbacks.filename={step}",
    ]
    main(["fit", *DEBUG, f"--trainer.default_root_dir={run}", *every_3])  # steps 1-8; step=6 and last (8)
    main(
        [
            "fit",
            *DEBUG,
            f"--trainer.default_root_dir={run}",
            "--trainer.max_steps=12",
            "--ckpt_path=last",
            *every_3,
        ]
    )
    assert checkpoint_step(run / "checkpoints" / "step=12.ckpt") == 12
    assert checkpoint_step(run / "checkpoints" / "last.ckpt") == 12
    with pytest.raises(SystemExit) as info:  # nothing is left to train: refused, not steps 9-12 again
        main(
            ["fit", *DEBUG, f"--trainer.default_root_dir={run}", "--trainer.max_steps=12", "--ckpt_path=last"]
        )
    assert info.value.code == 2 and "12" in capsys.readouterr().err
    with open(run / "metrics.csv") as f:
        steps = [row["step"] for row in csv.DictReader(f) if row.get("train_loss")]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"


def test_a_fit_refused_at_its_first_validation_leaves_nothing_that_blocks_the_corrected_run(tmp_path, capsys):
    """A ModelCheckpoint monitoring a key nothing logs is found only at the first validation, after steps were
    trained and logged: the refusal (exit 2) removes the folder it created (no checkpoint: nothing to resume), so the
    corrected command runs in the same folder instead of meeting "an earlier run"."""
    run = tmp_path / "run"
    monitor = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint"]
    with pytest.raises(SystemExit) as info:
        main(
            [
                "fit",
                *DEBUG,
                f"--trainer.default_root_dir={run}",
                *monitor,
                "--trainer.callbacks.monitor=val_los",
            ]
        )
    assert info.value.code == 2 and "val_los" in capsys.readouterr().err
    assert not run.exists()
    main(
        ["fit", *DEBUG, f"--trainer.default_root_dir={run}", *monitor, "--trainer.callbacks.monitor=val_loss"]
    )
    assert (run / "checkpoints").is_dir() and any((run / "checkpoints").glob("*.ckpt"))


def _changed_value(tp, default):
    """A value inside the declared domain ``tp`` that differs from ``default`` (None if none is found)."""
    import typing

    from distlab.domains import conforms

    args = typing.get_args(tp)
    candidates = []
    if default is None:  # "derived" (matrix_lr: from the width): a value of its own
        candidates = [0.01, 0.5, 1, 2]
    elif isinstance(default, bool):
        candidates = [not default]
    elif isinstance(default, (int, float)):
        candidates = [default * 0.5, default * 2, default + 1, default - 1, 0.5, 1, 2]
        if isinstance(default, int):
            candidates = [int(c) for c in candidates if float(c).is_integer()]
    elif isinstance(default, tuple) and all(isinstance(v, float) for v in default):
        candidates = [tuple(round(v * 0.9, 6) for v in default)]
    elif typing.get_origin(tp) is typing.Literal or any(typing.get_origin(a) is typing.Literal for a in args):
        literals = [
            v for a in (tp, *args) if typing.get_origin(a) is typing.Literal for v in typing.get_args(a)
        ]
        candidates = [v for v in literals if v != default]
    return next((c for c in candidates if c != default and conforms(tp, c)), None)


def _optimizer_settings(module_cls, base: dict) -> dict:
    """The __init__ parameters of ``module_cls`` that are optimizer settings, each with a changed value: those whose
    change alters the built optimizer's param-group settings but neither the parameters' shapes nor the groups'
    names (a change of architecture or of optimizer kind is no setting a resume takes over). Read from the
    signature: a new parameter joins by being one."""
    import inspect
    import logging
    import typing

    import lightning as L

    logging.getLogger("lightning").setLevel(logging.ERROR)

    def built(**kw):
        module = module_cls(**base, **kw)
        module.trainer = L.Trainer(
            max_steps=10, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False,
        )  # fmt: skip
        out = module.configure_optimizers()
        opt = out["optimizer"] if isinstance(out, dict) else out
        groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        return groups, {k: tuple(v.shape) for k, v in module.state_dict().items()}

    reference, shapes = built()
    hints = typing.get_type_hints(module_cls.__init__)
    out = {}
    for name, p in inspect.signature(module_cls.__init__).parameters.items():
        if name == "self" or name in base or p.default is inspect.Parameter.empty:
            continue
        value = _changed_value(hints.get(name), p.default)
        if value is None:
            continue
        try:
            groups, new_shapes = built(**{name: value})
        except Exception:  # noqa: BLE001 - a value that needs another setting with it: not a lone setting
            continue

        def layout(gs):  # each group's name, kind and keys: what a change of optimizer kind alters
            return [(g.get("name"), g.get("kind"), sorted(g)) for g in gs]

        if new_shapes == shapes and layout(groups) == layout(reference) and groups != reference:
            out[name] = value
    return out


@pytest.mark.timeout(300)
def test_every_optimizer_setting_changed_on_a_resume_trains_as_a_fresh_fit_with_it(fitted, tmp_path):
    """Generated over the module's signature: each optimizer setting (found by building the optimizer, not listed)
    is changed on a resume, all at once. The oracle is a fresh fit with the same settings: at the same step both
    optimizers' param groups hold the same settings and learning rates (the schedule's place included) - a key a
    resume path forgot to take over (torch's load_state_dict restores the checkpoint's) differs."""
    import shutil

    from distlab.modules import GPTLightningModule

    debug_model = {"depth": 1, "aspect_ratio": 32, "head_dim": 16, "sequence_len": 32}
    settings = _optimizer_settings(GPTLightningModule, debug_model)
    assert {"matrix_lr", "weight_decay", "betas", "muon_momentum"} <= set(settings), settings
    flags = [
        f"--model.{k}={list(v) if isinstance(v, tuple) else v}".replace("True", "true").replace(
            "False", "false"
        )
        for k, v in settings.items()
    ]

    resumed = tmp_path / "resumed"
    shutil.copytree(fitted.parent.parent, resumed)
    lr_monitor = [
        "--trainer.callbacks+=lightning.pytorch.callbacks.LearningRateMonitor",
        "--trainer.callbacks.logging_interval=step",
    ]
    common = [
        *DEBUG,
        "--trainer.max_steps=4",
        "--trainer.val_check_interval=2",
        "--model.warmdown_ratio=0.9",
        *flags,
        *lr_monitor,
    ]
    main(
        [
            "fit",
            *common,
            f"--trainer.default_root_dir={resumed}",
            f"--ckpt_path={resumed / 'checkpoints' / fitted.name}",
        ]
    )
    main(["fit", *common, f"--trainer.default_root_dir={tmp_path / 'fresh'}"])

    def groups(run):
        saved = [torch.load(p, weights_only=True) for p in (run / "checkpoints").glob("*.ckpt")]
        ckpt = next(c for c in saved if c["global_step"] == 4)
        return [
            {k: v for k, v in g.items() if k != "params"} for g in ckpt["optimizer_states"][0]["param_groups"]
        ]

    def rates(run):  # the learning rate each step trained with, as LearningRateMonitor logged it
        import csv

        with open(run / "metrics.csv") as f:
            return {
                (r["step"], k): float(v)
                for r in csv.DictReader(f)
                for k, v in r.items()
                if k.startswith("lr-") and v
            }

    fresh_rates = rates(tmp_path / "fresh")
    resumed_rates = {
        k: v for k, v in rates(resumed).items() if int(k[0]) >= 2
    }  # the steps the resume trained
    assert resumed_rates and all(math.isclose(v, fresh_rates[k], rel_tol=1e-9) for k, v in resumed_rates.items()), (
        resumed_rates, fresh_rates)  # fmt: skip
    got, expected = groups(resumed), groups(tmp_path / "fresh")
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        for key in e:
            same = (
                math.isclose(g[key], e[key], rel_tol=1e-12) if isinstance(e[key], float) else g[key] == e[key]
            )
            assert same, (
                f"group {e.get('name')!r} {key}: resumed {g[key]!r}, a fresh fit {e[key]!r} ({settings})"
            )


@pytest.mark.timeout(120)
def test_export_and_load_from_python_refuse_what_would_lose_or_mislead(fitted, tmp_path, monkeypatch):
    """From Python: overwrite='no' (a true string) keeps the file; '~' is home, not a folder named '~'; a
    checkpoint without hyperparameters is not exported into a file nothing reads back; a CUDA map_location on a
    machine without CUDA is said as that."""
    from distlab.checkpoint import export_safetensors, load_gpt
    from distlab.errors import ConfigError

    kept = tmp_path / "keep.safetensors"
    kept.write_bytes(b"mine")
    with pytest.raises(ConfigError, match="overwrite='no' is not accepted; set overwrite to True or False"):
        export_safetensors(fitted, kept, overwrite="no")
    assert kept.read_bytes() == b"mine"
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(work)
    assert export_safetensors(fitted, "~/home.safetensors") == tmp_path / "home.safetensors"
    assert (tmp_path / "home.safetensors").is_file() and not (work / "~").exists()
    bare = torch.load(fitted, weights_only=True)
    bare.pop("hyper_parameters")
    torch.save(bare, tmp_path / "bare.ckpt")
    with pytest.raises(
        ConfigError, match="holds no hyperparameters, so an export of it could not rebuild the model"
    ):
        export_safetensors(tmp_path / "bare.ckpt", tmp_path / "bare.safetensors")
    assert not (tmp_path / "bare.safetensors").exists()
    if not torch.cuda.is_available():
        with pytest.raises(
            ConfigError, match="cannot read it .Attempting to deserialize object on a CUDA device"
        ):
            load_gpt(fitted, map_location="cuda")


@pytest.mark.timeout(120)
def test_load_from_checkpoint_names_an_export_or_another_modules_checkpoint(fitted, tmp_path):
    """Lightning's advice for these (weights_only=False; import the module) is unsafe or cannot work."""
    from distlab.checkpoint import export_safetensors
    from distlab.errors import ConfigError
    from distlab.modules import GPTLightningModule, ImageClassifier

    exported = export_safetensors(fitted, tmp_path / "m.safetensors")
    with pytest.raises(
        ConfigError, match="is a distlab export .* rebuild the GPT with distlab.checkpoint.load_gpt"
    ):
        GPTLightningModule.load_from_checkpoint(exported)
    with pytest.raises(
        ConfigError, match="written by distlab.modules.GPTLightningModule, not ImageClassifier"
    ):
        ImageClassifier.load_from_checkpoint(fitted)
    module = GPTLightningModule.load_from_checkpoint(fitted)  # its own class: Lightning's load, as before
    with pytest.raises(TypeError, match="cannot be called on an instance"):  # and Lightning's guard is kept
        module.load_from_checkpoint(fitted)
