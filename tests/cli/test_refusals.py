"""Refused input, by behaviour: exit status 2, exactly one ``distlab: error:`` line naming the key or file, no
traceback, nothing written, no code from a file run. The wording is pinned only in :data:`GOLDEN` (a short list: the
lines users meet most, and those that keep a stranger's checkpoint from running code); every other refusal is held to
its behaviour here and in tests/cli/test_domains.py (every declared domain) and tests/cli/test_owner_rules.py (the
rules across fields, from Python and the CLI alike).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from distlab.cli import main
from tests.helpers.cli import CONFIGS

DEBUG = ["--config", str(CONFIGS / "debug.yaml"), "--trainer.max_steps=2", "--trainer.val_check_interval=2"]


def refused(args: list[str], capsys) -> str:
    """Run ``args``: exit 2, one ``distlab: error:`` line, no traceback; returns the line."""
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("distlab: error:")]
    assert info.value.code == 2, err[-2000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0].removeprefix("distlab: error: ")


class Payload:
    """A pickled object whose unpickling would run code (writes a file)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "ran"))


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> Path:
    """One fit's last checkpoint (2 steps of the debug recipe)."""
    run = tmp_path_factory.mktemp("fitted") / "run"
    main(["fit", *DEBUG, f"--trainer.default_root_dir={run}"])
    return next((run / "checkpoints").glob("*.ckpt"))


def _marker(tmp_path: Path) -> Path:
    return tmp_path / "payload-ran"


# (id, how to build the command line under tmp_path and the fitted checkpoint, the wording pinned)
GOLDEN = [
    ("a value outside its domain", lambda t, f: ["fit", *DEBUG, f"--trainer.default_root_dir={t / 'r'}",
     "--model.weight_decay=-1"], "model.weight_decay=-1 is not accepted; set model.weight_decay to a finite number >= 0"),
    ("a path that does not exist", lambda t, f: ["fit", *DEBUG, f"--trainer.default_root_dir={t / 'r'}",
     f"--data.paths=[{t / 'nope'}]"], "does not exist); set data.paths to a file or folder that exists"),
    ("an option a class does not take", lambda t, f: ["fit", *DEBUG, f"--trainer.default_root_dir={t / 'r'}",
     "--model.lr=0.1"], "model.lr=0.1: Option 'lr' is not accepted"),
    ("a choice outside its list", lambda t, f: ["fit", *DEBUG, f"--trainer.default_root_dir={t / 'r'}",
     "--model.optimizer=sgd"], "model.optimizer=sgd: expected one of 'muon', 'adamw'"),
    ("a misspelt option", lambda t, f: ["fit", *DEBUG, f"--trainer.default_root_dir={t / 'r'}",
     "--trainer.max_step=3"], "unrecognized arguments: --trainer.max_step=3"),
    ("Lightning's own refusal, in its words", lambda t, f: ["fit", *DEBUG, f"--trainer.default_root_dir={t / 'r'}",
     "--trainer.strategy=nope"], "You selected an invalid strategy name"),
    ("a checkpoint that does not exist", lambda t, f: ["fit", *DEBUG, f"--trainer.default_root_dir={t / 'r'}",
     f"--ckpt_path={t / 'nope.ckpt'}"], "checkpoint not found"),
    ("a checkpoint whose pickle would run code", lambda t, f: ["validate", *DEBUG, f"--trainer.default_root_dir={t / 'r'}",
     f"--ckpt_path={_pickled(t)}"], "torch.load(weights_only=True) cannot read it"),
    ("a truncated checkpoint", lambda t, f: ["validate", *DEBUG, f"--trainer.default_root_dir={t / 'r'}",
     f"--ckpt_path={_truncated(t, f)}"], "is damaged or not a torch checkpoint (a truncated copy"),
    ("a flag before the config that sets it", lambda t, f: ["fit", "--trainer.max_steps=3", "--config",
     str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={t / 'r'}"], "comes before --config"),
    ("a config file that is not YAML", lambda t, f: ["fit", *DEBUG, "--config", str(_tabbed(t)),
     f"--trainer.default_root_dir={t / 'r'}"], "tabbed.yaml is not valid YAML (line 2, column 1: found character"),
    ("a checkpoint given as text data", lambda t, f: ["fit", *DEBUG, f"--trainer.default_root_dir={t / 'r'}",
     f"--data.paths=[{f}]"], "is not text (a NUL byte at offset"),
    ("a sharded folder whose metadata would run code", lambda t, f: ["validate", *DEBUG,
     f"--trainer.default_root_dir={t / 'r'}", f"--ckpt_path={_dcp_folder(t)}"], "nothing in it was run"),
    ("a checkpoint another module class wrote", lambda t, f: ["validate", "--config", str(CONFIGS / "digits_cpu.yaml"),
     f"--trainer.default_root_dir={t / 'r'}", f"--ckpt_path={f}"], "but the config builds"),
    ("an earlier run's folder", lambda t, f: ["fit", *DEBUG, f"--trainer.default_root_dir={f.parent.parent}"],
     "already holds an earlier run"),
    ("a resume with nothing left to train", lambda t, f: ["fit", *DEBUG, f"--trainer.default_root_dir={f.parent.parent}",
     f"--ckpt_path={f}"], "nothing left to train; set trainer.max_steps above 2"),
    ("last, when there is none", lambda t, f: ["fit", *DEBUG, f"--trainer.default_root_dir={t / 'r'}",
     "--ckpt_path=last"], "--ckpt_path last: no last*.ckpt in"),
    ("an evaluation of untrained weights", lambda t, f: ["validate", *DEBUG, f"--trainer.default_root_dir={t / 'r'}"],
     "without --ckpt_path would run GPTLightningModule's freshly initialised weights"),
    ("an endless stream with no step count", lambda t, f: ["fit", "--config", str(CONFIGS / "debug.yaml"),
     f"--trainer.default_root_dir={t / 'r'}", "--trainer.max_steps=-1"], "the text data is an endless stream"),
    ("a window beyond the model's context", lambda t, f: ["fit", *DEBUG, f"--trainer.default_root_dir={t / 'r'}",
     "--data.seq_len=64"], "data.seq_len=64 exceeds the model context model.sequence_len=32"),
]  # fmt: skip


def _pickled(tmp_path: Path) -> Path:
    path = tmp_path / "payload.ckpt"
    torch.save({"state_dict": {}, "trap": Payload(str(_marker(tmp_path)))}, path)
    return path


def _tabbed(tmp_path: Path) -> Path:
    path = tmp_path / "tabbed.yaml"
    path.write_text("trainer:\n\tmax_steps: 3\n")
    return path


def _truncated(tmp_path: Path, fitted: Path) -> Path:
    path = tmp_path / "truncated.ckpt"
    path.write_bytes(fitted.read_bytes()[: fitted.stat().st_size // 2])
    return path


def _dcp_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "sharded.ckpt"
    folder.mkdir()
    (folder / ".metadata").write_bytes(pickle.dumps(Payload(str(_marker(tmp_path)))))
    (folder / "__0_0.distcp").write_bytes(b"")
    return folder


def test_the_golden_list_is_short():
    assert len(GOLDEN) <= 30


@pytest.mark.timeout(300)
@pytest.mark.parametrize("row", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_a_refusal_is_one_line_with_its_words_and_nothing_written_or_run(row, fitted, tmp_path, capsys):
    _, build, words = row
    before = sorted(p.relative_to(fitted.parent.parent) for p in fitted.parent.parent.rglob("*"))
    line = refused(build(tmp_path, fitted), capsys)
    assert words in line, line
    assert not (tmp_path / "r").exists(), f"{line}: a run folder was written"
    assert not _marker(tmp_path).exists(), f"{line}: code from a file was run"
    assert sorted(p.relative_to(fitted.parent.parent) for p in fitted.parent.parent.rglob("*")) == before
