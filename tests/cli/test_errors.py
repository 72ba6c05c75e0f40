"""Bad input gets one clear line on stderr and exit status 2 — never a traceback or a silent fallback.

The short list of guaranteed refusals is tests/cli/test_refusals.py; here, the cases that need more than a row."""

from __future__ import annotations

import re

import pytest

from distlab.cli import main
from distlab.data.datamodule import TextDataModule
from tests.helpers.cli import CONFIGS, distlab_exe, run_subprocess

DEBUG = ["fit", "--config", str(CONFIGS / "debug.yaml")]


def one_line_error(capsys, args: list[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("distlab: error:")]
    assert len(err) == 1, f"expected one error line, got {err}"
    return err[0]


def test_validation_split_with_no_data(capsys, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a.py", "b.py"):  # whole files go to one split; at val_fraction 0.01 both train
        (corpus / name).write_text("x = 1\n" * 200)
    run = [
        f"--data.paths=[{corpus}]",
        "--data.val_fraction=0.01",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
    ]
    line = one_line_error(capsys, [*DEBUG, *run])
    assert "validation split has 0 tokens" in line and "data.val_fraction" in line
    # one file: its last val_fraction is held out, here 24 tokens, short of a window of 33
    one = corpus / "a.py"
    line = one_line_error(
        capsys, [*DEBUG, f"--data.paths=[{one}]", f"--trainer.default_root_dir={tmp_path / 'r1'}"]
    )
    assert "validation split has 24 tokens, fewer than one window of seq_len+1=33" in line, line
    least = float(re.search(r"raise data.val_fraction \(to at least ([\d.]+)\)", line).group(1))
    # the advice, taken
    taken = TextDataModule(paths=[str(one)], seq_len=32, val_fraction=least).prepare_splits()
    assert len(taken.val[0]) >= 33


def test_real_process_exit_code_and_stderr(tmp_path):
    out = run_subprocess(
        [*distlab_exe(), *DEBUG, "--data.seq_len=64", f"--trainer.default_root_dir={tmp_path}"], timeout=120
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("distlab: error: data.seq_len=64 exceeds")
    assert "Traceback" not in out.stderr


# A callback monitoring a metric nobody logs -> what its one-line error says.
MISSING_MONITOR = {
    "distlab.callbacks.SyncEarlyStopping": "SyncEarlyStopping(monitor='val_bp'): no metric of that name",
    "lightning.pytorch.callbacks.EarlyStopping": "Early stopping conditioned on metric `val_bp`",
    "lightning.pytorch.callbacks.ModelCheckpoint": "`ModelCheckpoint(monitor='val_bp')` could not find",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("callback", MISSING_MONITOR)
def test_a_monitored_metric_nobody_logs(capsys, tmp_path, callback):
    """Lightning finds out at the first validation, mid-fit: still one line and exit 2, not a traceback."""
    args = [*DEBUG, f"--trainer.default_root_dir={tmp_path}", f"--trainer.callbacks+={callback}"]
    line = one_line_error(capsys, [*args, "--trainer.callbacks.monitor=val_bp"])
    assert MISSING_MONITOR[callback] in line and "val_bpb" in line, line  # names what is logged


@pytest.mark.timeout(120)
def test_a_checkpoint_named_after_a_metric_nobody_logs(capsys, tmp_path):
    """Lightning writes a file-name field nothing logged as 0 (``val_acc=0.000``, a number no run measured): one line,
    exit 2, naming the field and what is logged, and no file of that name."""
    args = [*DEBUG, f"--trainer.default_root_dir={tmp_path}", "--trainer.callbacks+=ModelCheckpoint"]
    line = one_line_error(capsys, [*args, "--trainer.callbacks.filename={step}-{val_acc:.3f}"])
    assert "names val_acc, which nothing has logged" in line and "val_loss" in line, line
    assert not list(tmp_path.rglob("*val_acc*")), list(tmp_path.rglob("*.ckpt"))


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "callback",
    ["distlab.callbacks.SyncEarlyStopping", "lightning.pytorch.callbacks.ModelCheckpoint"],
    ids=["SyncEarlyStopping", "ModelCheckpoint"],
)
def test_a_monitored_metric_nobody_logs_on_two_spawned_ranks(capsys, tmp_path, callback):
    """Every rank raises the same error (none waits for a decision); it comes back from the children as one
    line (the children's error reaches the parent as traceback text)."""
    args = [*DEBUG, "--config", str(CONFIGS / "trainer" / "ddp_optimizer_sync_spawn_cpu.yaml")]
    args += [f"--trainer.default_root_dir={tmp_path}", f"--trainer.callbacks+={callback}"]
    line = one_line_error(capsys, [*args, "--trainer.callbacks.monitor=val_bp"])
    assert MISSING_MONITOR[callback] in line, line


def test_under_torchrun_the_line_is_torchruns_root_cause(capsys, tmp_path, monkeypatch):
    """torchrun sets TORCHELASTIC_ERROR_FILE for each rank; the failure summary it prints reads that file
    (torch's own reader below), so its "Root Cause" shows distlab's line instead of a link to its docs."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    line = one_line_error(capsys, [*DEBUG, "--model.lr=-1", f"--trainer.default_root_dir={tmp_path / 'run'}"])
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=2, error_file=str(error_file))
    assert failure.message == line and "model.lr" in line
