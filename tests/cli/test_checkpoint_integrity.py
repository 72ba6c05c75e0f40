"""A checkpoint whose bytes changed after it was written (64 bytes flipped inside a tensor's data: the file keeps its
size, torch's reader would load it) is refused in one line naming it, and ``--ckpt_path last`` (like a restarted
job) resumes from the newest intact checkpoint instead and says so; the damaged ``last.ckpt`` is replaced."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from distlab.checkpoint import checkpoint_step, newest_checkpoint
from distlab.checkpoint.integrity import damage
from distlab.cli import main
from tests.helpers.cli import CONFIGS

EVERY_4 = [
    "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
    "--trainer.callbacks.save_last=true",
    "--trainer.callbacks.every_n_train_steps=4",
    "--trainer.callbacks.save_top_k=-1",
]


def _fit(root: Path, *extra: str) -> int:
    try:
        main(["fit", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={root}", *extra])
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def flip_tensor_bytes(path: Path, n: int = 64) -> str:
    """Flip ``n`` bytes inside the first tensor record's data; returns the record's name."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size >= n)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data = bytearray(path.read_bytes())
    data[start : start + n] = bytes(b ^ 0xFF for b in data[start : start + n])
    path.write_bytes(bytes(data))
    torch.load(path, weights_only=True)  # torch's reader takes it without a word: the damage is silent
    return info.filename


@pytest.fixture(scope="module")
def damaged_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("integrity") / "run"
    assert _fit(root, "--trainer.max_steps=8", *EVERY_4) == 0
    folder = root / "checkpoints"
    assert damage(folder / "last.ckpt") is None  # written intact
    flip_tensor_bytes(folder / "last.ckpt")
    return root


@pytest.mark.timeout(300)
def test_a_damaged_checkpoint_is_refused_in_one_line_naming_it(damaged_run, capsys):
    last = damaged_run / "checkpoints" / "last.ckpt"
    assert _fit(damaged_run, "--trainer.max_steps=12", f"--ckpt_path={last}") == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("distlab: error:")]
    assert (
        len(errors) == 1 and f"the checkpoint '{last}' is damaged" in errors[0] and "CRC-32" in errors[0]
    ), errors


@pytest.mark.timeout(300)
def test_resume_from_last_falls_back_to_the_newest_intact_checkpoint(damaged_run, caplog):
    folder = damaged_run / "checkpoints"
    assert newest_checkpoint([folder]) == folder / "epoch=0-step=8.ckpt"  # a restarted job's pick
    caplog.set_level("INFO")
    assert _fit(damaged_run, "--trainer.max_steps=12", "--ckpt_path=last", *EVERY_4) == 0
    assert f"{folder / 'last.ckpt'} is damaged" in caplog.text
    assert f"resuming from {folder / 'epoch=0-step=8.ckpt'}, the newest intact checkpoint" in caplog.text
    assert checkpoint_step(folder / "last.ckpt") == 12 and damage(folder / "last.ckpt") is None
