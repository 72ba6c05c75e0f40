"""Nothing the user had is lost, and whatever fails is one line: the mechanisms behind the bad-input table.

- Folders: a checkpoint folder that cannot be written is refused before the first step; one that stops
  accepting files mid-run ends the run in one line at the first save (Lightning's own writer drops the
  PermissionError and the run would go on saving nothing).
- Resumes that cannot continue: at or beyond max_steps, ``last`` with no last checkpoint, an exported
  .safetensors given as a checkpoint - refused, the run's files untouched.
- Export writes whole files or nothing.
- The last line of defence: an internal error is one line and its traceback is in ``error.log`` (run folder)
  or a temporary file; ``DISTLAB_DEBUG=1`` re-raises it.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest
import yaml

from distlab.cli import main
from distlab.errors import ConfigError
from tests.helpers.callbacks import can_make_read_only, set_read_only
from tests.helpers.cli import CONFIGS

DEBUG = ["--config", str(CONFIGS / "debug.yaml")]
LAST = [
    "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
    "--trainer.callbacks.save_last=true",
]


def _refused(args: list[str], capsys, code: int = 2) -> str:
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("distlab: error:")]
    assert info.value.code == code, err[-2000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> Path:
    """A 2-step fit with last.ckpt (its run folder)."""
    run = tmp_path_factory.mktemp("fitted") / "run"
    main(
        [
            "fit",
            *DEBUG,
            f"--trainer.default_root_dir={run}",
            "--trainer.max_steps=2",
            "--trainer.val_check_interval=2",
            *LAST,
        ]
    )
    assert (run / "checkpoints" / "last.ckpt").is_file()
    return run


@pytest.fixture
def read_only_ok(tmp_path):
    if not can_make_read_only(tmp_path):
        pytest.skip("this machine cannot make a folder read-only for this user")


# ---- folders ---------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_an_unwritable_checkpoint_folder_is_refused_before_the_first_step(tmp_path, capsys, read_only_ok):
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    ckpts.mkdir(parents=True)
    set_read_only(ckpts)
    try:
        line = _refused(["fit", *DEBUG, f"--trainer.default_root_dir={run}", *LAST], capsys)
    finally:
        set_read_only(ckpts, False)
    assert "the checkpoint folder" in line and "cannot be written" in line, line
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints"], "the run started writing"


@pytest.mark.timeout(240)
def test_a_resume_with_other_settings_keeps_the_earlier_segments_config(tmp_path, caplog):
    """config.yaml records how a run trained: a resume into its folder with other settings keeps the earlier
    segment's as config.1.yaml; one with the same settings adds nothing."""
    run = tmp_path / "run"
    main(["fit", *DEBUG, "--trainer.max_steps=4", f"--trainer.default_root_dir={run}"])
    first = yaml.safe_load((run / "config.yaml").read_text())
    ckpt = next((run / "checkpoints").glob("*step=4.ckpt"))
    resume = [
        "fit",
        *DEBUG,
        "--trainer.max_steps=6",
        f"--trainer.default_root_dir={run}",
        f"--ckpt_path={ckpt}",
    ]
    with caplog.at_level(logging.INFO):
        main(resume)
    assert "it is kept as config.1.yaml" in caplog.text
    assert yaml.safe_load((run / "config.1.yaml").read_text()) == first
    assert yaml.safe_load((run / "config.yaml").read_text())["trainer"]["max_steps"] == 6
    from distlab.cli.run_folder import keep_earlier_config

    same = (run / "config.yaml").read_text()  # a config that says the same: nothing more kept
    assert keep_earlier_config(run, "config.yaml", same) is None and not (run / "config.2.yaml").exists()


@pytest.mark.timeout(120)
def test_a_checkpoint_folder_that_turns_read_only_mid_run_ends_the_run_in_one_line(
    tmp_path, capsys, read_only_ok
):
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    freeze = [
        "--trainer.callbacks+=tests.helpers.callbacks.FreezeFolderAt",
        f"--trainer.callbacks.folder={ckpts}",
        "--trainer.callbacks.step=1",
    ]
    try:
        line = _refused(
            [
                "fit",
                *DEBUG,
                f"--trainer.default_root_dir={run}",
                "--trainer.val_check_interval=2",
                *LAST,
                *freeze,
            ],
            capsys,
            code=1,
        )
    finally:
        set_read_only(ckpts, False)
    assert "could not write the checkpoint" in line and str(ckpts) in line, line
    assert not list(ckpts.iterdir()), "a partial file was left"


# ---- resumes that cannot continue ---------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_resume_at_max_steps_is_refused_and_the_run_untouched(fitted, capsys):
    before = _snapshot(fitted)
    line = _refused(
        ["fit", *DEBUG, f"--trainer.default_root_dir={fitted}", "--trainer.max_steps=2", *LAST,
         f"--ckpt_path={fitted / 'checkpoints' / 'last.ckpt'}"],
        capsys,
    )  # fmt: skip
    assert "is at step 2" in line and "nothing left to train" in line, line
    assert _snapshot(fitted) == before


@pytest.mark.timeout(120)
def test_ckpt_path_last_with_no_last_checkpoint_is_refused(tmp_path, capsys):
    line = _refused(
        ["fit", *DEBUG, f"--trainer.default_root_dir={tmp_path / 'run'}", *LAST, "--ckpt_path=last"], capsys
    )
    assert "--ckpt_path last: no last*.ckpt" in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("subcommand", ["fit", "validate"])
def test_an_exported_safetensors_is_no_checkpoint_to_resume(fitted, tmp_path, capsys, subcommand):
    out = tmp_path / "m.safetensors"
    main(["export", "--ckpt_path", str(fitted / "checkpoints" / "last.ckpt"), "--out", str(out)])
    line = _refused(
        [subcommand, *DEBUG, f"--trainer.default_root_dir={tmp_path / 'run'}", f"--ckpt_path={out}"], capsys
    )
    assert "is an exported .safetensors file" in line, line


# ---- export writes whole files or nothing ----------------------------------------------------------------
@pytest.mark.timeout(120)
def test_export_never_leaves_a_partial_file(fitted, tmp_path, capsys, monkeypatch):
    ckpt = str(fitted / "checkpoints" / "last.ckpt")
    folder = tmp_path / "a_folder.safetensors"
    folder.mkdir()
    line = _refused(["export", "--ckpt_path", ckpt, "--out", str(folder), "--overwrite", "true"], capsys)
    assert "is a folder" in line, line
    assert list(folder.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == [
        "a_folder.safetensors"
    ]
    # A write that fails half-way (a full disk): the earlier file stays, no temporary file is left.
    out = tmp_path / "m.safetensors"
    out.write_bytes(b"the earlier export")
    import safetensors.torch

    def fail_half_way(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", fail_half_way)
    line = _refused(["export", "--ckpt_path", ckpt, "--out", str(out), "--overwrite", "true"], capsys, code=1)
    assert "No space left on device" in line, line
    assert out.read_bytes() == b"the earlier export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_folder.safetensors", "m.safetensors"]


# ---- files and arguments that are not what they claim ------------------------------------------------------


# ---- the last line of defence --------------------------------------------------------------------------------
def _crash(*args, **kwargs):
    raise ZeroDivisionError("a bug nobody foresaw")


@pytest.mark.timeout(120)
def test_an_internal_error_in_a_run_is_one_line_with_its_traceback_in_error_log(
    tmp_path, capsys, monkeypatch
):
    from distlab.modules import GPTLightningModule

    monkeypatch.setattr(GPTLightningModule, "training_step", _crash)
    run = tmp_path / "run"
    line = _refused(["fit", *DEBUG, f"--trainer.default_root_dir={run}"], capsys, code=1)
    assert "ZeroDivisionError: a bug nobody foresaw" in line and f"{run / 'error.log'}" in line, line
    log = (run / "error.log").read_text()
    assert "Traceback" in log and "_crash" in log and "a bug nobody foresaw" in log


def test_an_internal_error_before_a_run_folder_exists_goes_to_a_temporary_file(capsys, monkeypatch):
    import distlab.cli

    monkeypatch.setattr(distlab.cli, "run_cli", _crash)
    line = _refused(["fit", *DEBUG], capsys, code=1)
    saved = Path(line.split("full traceback: ")[1].rstrip(")"))
    try:
        assert (
            saved.is_file() and "a bug nobody foresaw" in saved.read_text() and "_crash" in saved.read_text()
        )
    finally:
        saved.unlink()


def test_distlab_debug_shows_the_traceback_instead(monkeypatch):
    import distlab.cli

    monkeypatch.setattr(distlab.cli, "run_cli", _crash)
    monkeypatch.setenv("DISTLAB_DEBUG", "1")
    with pytest.raises(ZeroDivisionError, match="a bug nobody foresaw"):
        main(["fit", *DEBUG])


def test_distlab_debug_keeps_a_refused_inputs_line_and_exit_status(monkeypatch, capsys):
    """The traceback is shown, and the refusal still ends in its one line and exit 2 (not a wall and exit 1)."""
    monkeypatch.setenv("DISTLAB_DEBUG", "1")
    with pytest.raises(SystemExit) as info:
        main(["fit", *DEBUG, "--model.depth=-1"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" in err
    assert err.strip().splitlines()[-1].startswith("distlab: error: model.depth=-1 is not accepted"), err[
        -600:
    ]


def test_a_rank_that_lightnings_launcher_started_does_not_probe_the_port():
    """Lightning's subprocess launcher gives rank 1 the MASTER_PORT rank 0 already holds: no "in use" refusal."""
    import socket
    from types import SimpleNamespace

    from distlab.launch import check_process_group_plan

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        trainer = SimpleNamespace(strategy=SimpleNamespace(), world_size=2, node_rank=0)
        check_process_group_plan(trainer, {"MASTER_PORT": port, "LOCAL_RANK": "1"})  # no refusal
        with pytest.raises(ConfigError, match="is already in use"):
            check_process_group_plan(trainer, {"MASTER_PORT": port})


# ---- runs that would overwrite or mix with another run ------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_fresh_fit_into_a_folder_with_an_earlier_runs_files_is_refused(fitted, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("an earlier run's config (it saved no checkpoint)")
    before = _snapshot(run)
    line = _refused(["fit", *DEBUG, f"--trainer.default_root_dir={run}"], capsys)
    assert "already holds an earlier run (config.yaml)" in line, line
    assert _snapshot(run) == before
    # resuming there from another run's checkpoint would overwrite and mix it too
    ckpt = fitted / "checkpoints" / "last.ckpt"
    line = _refused(
        ["fit", *DEBUG, f"--trainer.default_root_dir={run}", "--trainer.max_steps=4", f"--ckpt_path={ckpt}"],
        capsys,
    )
    assert "holds another run (config.yaml), and the checkpoint" in line, line
    assert _snapshot(run) == before


# ---- no finished step is lost, no bad weights written over good ones -------------------------------------------
@pytest.mark.timeout(120)
def test_a_fit_that_ends_between_checkpoints_saves_its_last_steps(tmp_path):
    """debug.yaml validates every 4 steps (the ModelCheckpoint saves then); a fit of 6 steps ends between two."""
    import torch

    run = tmp_path / "run"
    recipe_last = [  # as the recipes write last.ckpt: replaced at every validation (no save_last)
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.filename=last",
        "--trainer.callbacks.enable_version_counter=false",
    ]
    main(["fit", *DEBUG, f"--trainer.default_root_dir={run}", *recipe_last, "--trainer.max_steps=6"])
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6


NON_FINITE = [float("nan"), float("inf"), float("-inf")]
FLOAT_DTYPES = ["float32", "bfloat16", "float16", "float64"]


@pytest.mark.parametrize("bad", NON_FINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_non_finite_weights_are_never_written_over_a_checkpoint(tmp_path, bad, dtype):
    """Every non-finite value (NaN, +Inf, -Inf) in every floating dtype, on the way out and on the way in."""
    import torch

    from distlab.checkpoint import VerifiedCheckpointIO, refuse_non_finite_checkpoint
    from distlab.errors import DistlabError

    io = VerifiedCheckpointIO()
    good = tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 4}, good)
    weights = {
        "ok": torch.ones(2, dtype=getattr(torch, dtype)),
        "w": torch.tensor([1.0, bad, 0.0]).to(getattr(torch, dtype)),
    }
    with pytest.raises(DistlabError, match=r"the weights hold NaN/Inf \(w\) at step 5"):
        io.save_checkpoint({"state_dict": weights, "global_step": 5}, good)
    with pytest.raises(ConfigError, match=r"holds NaN/Inf weights \(w\)"):
        refuse_non_finite_checkpoint(weights, "x.ckpt")
    assert torch.load(good, weights_only=True)["global_step"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


@pytest.mark.timeout(120)
def test_a_resume_from_an_older_checkpoint_never_replaces_a_newer_last(fitted, tmp_path, capsys):
    """A best-step file resumed into its own folder would overwrite the folder's newer last.ckpt at the first
    save: refused in one line, the run untouched."""
    import shutil

    import torch

    run = tmp_path / "run"
    shutil.copytree(fitted, run)
    older = run / "checkpoints" / "best-step=1.ckpt"
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    state["global_step"] = 1
    torch.save(state, older)
    before = _snapshot(run)
    line = _refused(
        ["fit", *DEBUG, f"--trainer.default_root_dir={run}", "--trainer.max_steps=4", f"--ckpt_path={older}"],
        capsys,
    )
    assert "would replace" in line and "(step 2)" in line, line
    assert _snapshot(run) == before


@pytest.mark.timeout(120)
def test_fast_dev_run_writes_no_checkpoint(tmp_path):
    """fast_dev_run checks that everything runs; a checkpoint it left would block the real fit into the folder."""
    run = tmp_path / "run"
    main(["fit", *DEBUG, f"--trainer.default_root_dir={run}", "--trainer.fast_dev_run=true"])
    assert not list(run.rglob("*.ckpt")), list(run.rglob("*.ckpt"))


@pytest.mark.timeout(120)
def test_an_evaluations_log_folder_that_is_a_file_is_one_line(fitted, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(fitted, run)
    (run / "validate").write_text("not a folder")
    line = _refused(
        ["validate", *DEBUG, f"--trainer.default_root_dir={run}", f"--ckpt_path={run}/checkpoints/last.ckpt"],
        capsys,
    )
    assert "validate's log folder" in line and "is a file" in line, line


@pytest.mark.timeout(120)
def test_a_tilde_in_a_path_is_the_home_folder(fitted, tmp_path, capsys, monkeypatch):
    """No shell expands ``--x=~/y`` (or a config file's ~): distlab does, for paths of its own and --ckpt_path."""
    import shutil

    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(fitted / "checkpoints" / "last.ckpt", home / "model.ckpt")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    main(["export", "--ckpt_path=~/model.ckpt", "--out=~/exports/m.safetensors"])
    assert (home / "exports" / "m.safetensors").is_file() and not (tmp_path / "~").exists()
    main(["generate", "--ckpt_path=~/exports/m.safetensors", "--max_new_tokens=3"])
    run = tmp_path / "run"
    main(["validate", *DEBUG, f"--trainer.default_root_dir={run}", "--ckpt_path=~/model.ckpt"])
    shown = capsys.readouterr()
    assert "val_loss" in shown.out + shown.err


def test_a_stop_file_setting_that_names_a_folder_is_refused(tmp_path):
    from distlab.callbacks.preemption import CheckpointOnStopRequest

    with pytest.raises(ConfigError, match="is a folder; it names the file"):
        CheckpointOnStopRequest.from_env({"DISTLAB_STOP_FILE": str(tmp_path)})


@pytest.mark.parametrize("newest", ["last.ckpt", "last-v1.ckpt", "last-v2.ckpt"])
def test_ckpt_path_last_resolves_to_the_newest_last_checkpoint(tmp_path, newest):
    """Lightning writes last-v1.ckpt, last-v2.ckpt ... beside an existing last.ckpt: `last` means the newest one."""
    import os

    import torch

    from distlab.cli.checkpoint import newest_last

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    names = ["last.ckpt", "last-v1.ckpt", "last-v2.ckpt"]
    for age, name in enumerate(sorted(names, key=lambda n: n == newest)):
        torch.save({"global_step": age}, folder / name)  # whole files (a damaged one would be passed over)
        os.utime(folder / name, (1_000_000 + age * 100, 1_000_000 + age * 100))
    assert newest_last([folder]) == folder / newest


@pytest.mark.timeout(120)
def test_generate_into_a_pipe_that_closes_stops_quietly(fitted):
    """`distlab generate ... | head` (the reader leaves early): exit 0, no error line; the sample streams out."""
    import shlex
    import subprocess
    import sys

    ckpt = fitted / "checkpoints" / "last.ckpt"
    command = f"{shlex.quote(sys.executable)} -m distlab generate --ckpt_path {ckpt} --max_new_tokens 100000 | head -c 20"
    out = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=100
    )
    assert out.returncode == 0 and "error" not in out.stderr, out.stderr[-2000:]
    assert out.stdout.startswith("def ")  # the prompt, then the sample (head -c counts bytes)


@pytest.mark.timeout(120)
def test_a_run_folder_through_dot_dot_leaves_no_stray_folder(tmp_path, capsys):
    """`typo/../run` is the folder `run`: the fit writes there, and creates no empty `typo` on the way."""
    main(["fit", "--config", str(CONFIGS / "debug.yaml"), "--trainer.max_steps=1",
          f"--trainer.default_root_dir={tmp_path / 'typo' / '..' / 'run'}"])  # fmt: skip
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    assert not (tmp_path / "typo").exists()


def test_a_run_folder_refusal_names_the_setting_that_chose_the_folder(tmp_path, capsys, monkeypatch):
    """A recipe saved as config.yaml in the folder the run would write its own config.yaml to: the line says that
    (not "an earlier run ... delete the folder"). A logger's save_dir/version chose a folder that holds a run: the
    line names the logger, not --trainer.default_root_dir (which the user already changed)."""
    import shutil

    here = tmp_path / "project"
    here.mkdir()
    shutil.copy(CONFIGS / "debug.yaml", here / "config.yaml")
    monkeypatch.chdir(here)
    line = _refused(
        ["fit", "--config", "config.yaml", "--trainer.default_root_dir=.", "--trainer.max_steps=1"], capsys
    )
    assert "--config config.yaml is the config.yaml a fit writes into its run folder" in line, line
    logger = [
        "--trainer.logger=CSVLogger",
        f"--trainer.logger.save_dir={tmp_path / 'logs'}",
        "--trainer.logger.version=exp1",
    ]
    main(["fit", *DEBUG, f"--trainer.default_root_dir={tmp_path / 'a'}", "--trainer.max_steps=1", *logger])
    line = _refused(
        ["fit", *DEBUG, f"--trainer.default_root_dir={tmp_path / 'b'}", "--trainer.max_steps=1", *logger],
        capsys,
    )
    assert "already holds an earlier run" in line and "set another trainer.logger (CSVLogger" in line, line


@pytest.mark.timeout(120)
def test_a_resume_with_another_architecture_names_the_settings_that_differ(fitted, tmp_path, capsys):
    """The architecture changed on the command line: the line names that setting and its trained value (the
    run's config.yaml would not help: the override is on the command line)."""
    ckpt = fitted / "checkpoints" / "last.ckpt"
    line = _refused(
        [
            "fit",
            *DEBUG,
            f"--trainer.default_root_dir={tmp_path / 'run'}",
            f"--ckpt_path={ckpt}",
            "--model.depth=2",
        ],
        capsys,
    )
    assert "trained with depth=1, and this run sets depth=2; set model.depth=1" in line, line
    assert len(line) < 400 and not (tmp_path / "run").exists()


@pytest.mark.timeout(180)
def test_a_resume_in_its_own_folder_may_read_that_runs_config_yaml(fitted, tmp_path):
    """`--config RUN/config.yaml --trainer.default_root_dir RUN --ckpt_path RUN/...` continues the run (its rewritten
    config.yaml holds the settings and the change); a fresh fit from that config into that folder stays refused."""
    import shutil

    import yaml

    run = tmp_path / "run"
    shutil.copytree(fitted, run)
    own = ["fit", "--config", str(run / "config.yaml"), f"--trainer.default_root_dir={run}"]
    main([*own, f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}", "--trainer.max_steps=3"])
    assert yaml.safe_load((run / "config.yaml").read_text())["trainer"]["max_steps"] == 3
    with pytest.raises(SystemExit) as info:
        main(own)
    assert info.value.code == 2


@pytest.mark.timeout(180)
def test_evaluating_a_checkpoint_twice_keeps_both_records(fitted, tmp_path):
    """A second validate of the same checkpoint (other settings) writes beside the first, never over its config.yaml
    and metrics; an evaluation's TensorBoard events stay in its own folder, out of the fit's tensorboard/."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(fitted, run)
    fit_board = (
        sorted(p.name for p in (run / "tensorboard").iterdir()) if (run / "tensorboard").is_dir() else []
    )
    ckpt = f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}"
    common = ["validate", *DEBUG, f"--trainer.default_root_dir={run}", ckpt]
    main([*common, "--data.max_val_windows=2"])
    first = _snapshot(run / "validate" / "last")
    assert (run / "validate" / "last" / "metrics.csv").is_file()
    main([*common, "--data.max_val_windows=3"])
    assert _snapshot(run / "validate" / "last") == first
    assert (run / "validate" / "last-2" / "metrics.csv").is_file()
    after = sorted(p.name for p in (run / "tensorboard").iterdir()) if (run / "tensorboard").is_dir() else []
    assert after == fit_board


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "assignment", ["RANK=abc", "MASTER_PORT=notaport", "WORLD_SIZE=0", "NODE_RANK=", "SLURM_NTASKS=abc"]
)
def test_a_launch_variable_that_is_no_number_is_one_line_before_lightning_reads_it(assignment, tmp_path):
    """Lightning reads LOCAL_RANK/RANK when it is imported: `RANK=abc distlab fit` was a 35-line traceback from the
    import, before distlab's CLI ran. Now the real console script says it in one line, exit 2, nothing written."""
    import subprocess
    import sys

    from tests.helpers.cli import subprocess_env

    key, value = assignment.split("=")
    env = {**subprocess_env(), key: value}
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "distlab", "fit", *DEBUG, f"--trainer.default_root_dir={run}"],
        env=env, capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("distlab: error:")]
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert key in lines[0] and not run.exists(), lines[0]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "assignment, command",
    [("TORCH_DISTRIBUTED_DEBUG=bogus", "fit"), ("MPLBACKEND=bogus", "generate"), ("TORCH_LOGS=bogus", "fit")],
)
def test_a_variable_a_dependency_refuses_at_import_is_named_in_one_line(assignment, command, tmp_path):
    """torch reads TORCH_DISTRIBUTED_DEBUG / TORCH_LOGS and matplotlib MPLBACKEND when imported, and raised a
    ValueError there (a 40-line traceback before distlab's CLI ran). Now: one line with the package's own words
    (which name the variable or its value), exit 1, nothing written."""
    import subprocess
    import sys

    from tests.helpers.cli import subprocess_env

    key, value = assignment.split("=")
    env = {**subprocess_env(), key: value}
    run = tmp_path / "run"
    args = (
        ["fit", *DEBUG, f"--trainer.default_root_dir={run}"]
        if command == "fit"
        else ["generate", "--ckpt_path", str(tmp_path / "none.ckpt")]
    )
    out = subprocess.run(
        [sys.executable, "-m", "distlab", *args], env=env, capture_output=True, text=True, timeout=170
    )
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("distlab: error:")]
    assert out.returncode == 1 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "importing" in lines[0] and (key in lines[0] or value in lines[0]), lines[
        0
    ]  # the dependency's words
    assert not run.exists()


def test_a_write_that_found_the_disk_full_says_so():
    """ENOSPC anywhere in the chain (or a library's vaguer words with the run folder's disk out of space) is said as
    a full disk, with where, not as an internal error."""
    import errno

    from distlab.cli.errors import report

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/data/run/checkpoints/last.ckpt")
        except OSError as inner:
            raise RuntimeError("basic_ios::clear: iostream error") from inner
    except RuntimeError as e:
        line, code = report(e, None)
    assert code == 1 and line.startswith(
        "writing /data/run/checkpoints/last.ckpt failed: No space left on device"
    ), line


def test_an_evaluation_refused_mid_start_leaves_no_folder(fitted, tmp_path, capsys):
    """validate with a limit Lightning refuses once the loop starts: one line, and the evaluation's folder it had
    begun (validate/<name>/ with config and events) is gone; the fit's run is untouched."""
    before = sorted(p.relative_to(fitted) for p in fitted.rglob("*"))
    for root in (tmp_path / "elsewhere", fitted):  # a new folder, and the fit's own run folder
        line = _refused(
            [
                "validate",
                *DEBUG,
                f"--trainer.default_root_dir={root}",
                f"--ckpt_path={fitted / 'checkpoints' / 'last.ckpt'}",
                "--trainer.limit_val_batches=0.001",
            ],
            capsys,
        )
        assert "limit_val_batches" in line, line
    assert not (tmp_path / "elsewhere").exists()
    assert sorted(p.relative_to(fitted) for p in fitted.rglob("*")) == before
