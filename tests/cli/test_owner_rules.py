"""Each rule across fields lives on the class that owns them, so a Python script and the CLI get the same one line,
before the first step. Every rule is a row of :data:`RULES`: how to break it from Python (a Trainer built in a
script), how from the command line, and the words both must say; each is also checked to let the corrected settings
through (the rule is not simply always on).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from distlab.cli import main
from distlab.errors import ConfigError
from tests.helpers.cli import CONFIGS

TINY_GPT = dict(depth=1, aspect_ratio=32, head_dim=16, sequence_len=32)


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        from distlab.optim import DistAdamW

        return DistAdamW(self.parameters(), lr=0.01)


def _loaders():
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    return DataLoader(data, batch_size=4), DataLoader(data, batch_size=4)


def _fit(tmp_path, module=None, data=None, **trainer) -> int:
    """A Python script's fit; returns the number of training batches it ran (0: refused before the first)."""
    seen = []

    class Count(L.Callback):
        def on_train_batch_start(self, *args) -> None:
            seen.append(1)

    callbacks = [*trainer.pop("callbacks", []), Count()]
    trainer = {"max_steps": 4, "enable_checkpointing": False, **trainer}
    t = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                  default_root_dir=tmp_path, callbacks=callbacks, **trainer)  # fmt: skip
    if data is None:
        t.fit(module or Regressor(), *_loaders())
    else:
        t.fit(module, datamodule=data)
    return len(seen)


def _python_limit_zero(tmp_path, fixed: bool):
    from distlab.callbacks import RankZeroValidation, SyncEarlyStopping

    return _fit(tmp_path, limit_val_batches=None if fixed else 0,
                callbacks=[RankZeroValidation(every_n_steps=2), SyncEarlyStopping(monitor="val_loss")])  # fmt: skip


def _python_interval(tmp_path, fixed: bool):
    from distlab.callbacks import SyncEarlyStopping

    return _fit(tmp_path, val_check_interval=2 if fixed else 10, check_val_every_n_epoch=None,
                callbacks=[SyncEarlyStopping(monitor="val_loss")])  # fmt: skip


def _gpt_and_text(seq_len: int, vocab: int = 257):
    from distlab.data import TextDataModule
    from distlab.modules import GPTLightningModule

    return GPTLightningModule(**{**TINY_GPT, "vocab_size": vocab}), TextDataModule(
        seq_len=seq_len, batch_size=2
    )


def _python_window(tmp_path, fixed: bool):
    module, data = _gpt_and_text(32 if fixed else 64)
    return _fit(
        tmp_path, module, data, val_check_interval=2, check_val_every_n_epoch=None, limit_val_batches=1
    )


def _python_vocabulary(tmp_path, fixed: bool):
    module, data = _gpt_and_text(32, vocab=257 if fixed else 100)
    return _fit(
        tmp_path, module, data, val_check_interval=2, check_val_every_n_epoch=None, limit_val_batches=1
    )


def _python_endless(tmp_path, fixed: bool):
    module, data = _gpt_and_text(32)
    return _fit(tmp_path, module, data, max_steps=2 if fixed else -1, max_epochs=1, val_check_interval=2,
                check_val_every_n_epoch=None, limit_val_batches=1)  # fmt: skip


# (id, Python: fit(tmp_path, fixed) -> batches run, CLI arguments breaking it, CLI arguments fixing it, the words)
RULES = [
    ("validation off while a callback watches its metric", _python_limit_zero,
     ["--trainer.callbacks+=distlab.callbacks.SyncEarlyStopping", "--trainer.callbacks.monitor=val_bpb",
      "--trainer.limit_val_batches=0"], ["--trainer.callbacks+=distlab.callbacks.SyncEarlyStopping",
      "--trainer.callbacks.monitor=val_bpb"], "trainer.limit_val_batches=0 turns validation off, but SyncEarlyStopping"),
    ("validation beyond max_steps while a callback watches its metric", _python_interval,
     ["--trainer.callbacks=[]", "--trainer.callbacks+=distlab.callbacks.SyncEarlyStopping",
      "--trainer.callbacks.monitor=val_bpb", "--trainer.val_check_interval=10"], ["--trainer.callbacks=[]",
      "--trainer.callbacks+=distlab.callbacks.SyncEarlyStopping", "--trainer.callbacks.monitor=val_bpb"],
     "so validation never runs, but SyncEarlyStopping"),
    ("a data window beyond the model's context", _python_window, ["--data.seq_len=64"], [],
     "data.seq_len=64 exceeds the model context model.sequence_len=32"),
    ("token ids beyond the model's vocabulary", _python_vocabulary, ["--model.vocab_size=100"], [],
     "but model.vocab_size=100"),
    ("an endless stream with no step count", _python_endless, ["--trainer.max_steps=-1"], [],
     "the text data is an endless stream, so the fit would never end"),
]  # fmt: skip


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rule", RULES, ids=[r[0] for r in RULES])
def test_a_rule_refuses_the_same_line_from_python_and_the_cli(rule, tmp_path, capsys):
    _, python, broken, fixed, words = rule
    with pytest.raises(ConfigError) as info:
        python(tmp_path / "py", fixed=False)
    from_python = str(info.value)
    assert words in from_python and "\n" not in from_python, from_python
    assert python(tmp_path / "py_fixed", fixed=True) > 0  # the corrected settings train

    base = [
        "fit",
        "--config",
        str(CONFIGS / "debug.yaml"),
        "--trainer.max_steps=2",
        "--trainer.val_check_interval=2",
    ]
    with pytest.raises(SystemExit) as exit_info:
        main([*base, f"--trainer.default_root_dir={tmp_path / 'cli'}", *broken])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("distlab: error:")]
    assert exit_info.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err[-1500:]
    assert words in lines[0], (lines[0], from_python)  # the same rule's words, about the CLI's own values
    assert not (tmp_path / "cli").exists(), "the CLI wrote a run folder before refusing"
    main([*base, f"--trainer.default_root_dir={tmp_path / 'cli_fixed'}", *fixed])


@pytest.mark.timeout(120)
def test_a_checkpoint_monitor_that_validation_never_logs_is_refused_like_lightnings_own_loop_does(tmp_path):
    """Lightning's validation loop refuses ModelCheckpoint(monitor=<never logged>); after RankZeroValidation's
    validation Lightning only warned and no checkpoint was ever written (P23 of the guard list)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from distlab.callbacks import RankZeroValidation

    def fit(monitor: str, folder: str) -> int:
        return _fit(tmp_path / folder, enable_checkpointing=True,
                    callbacks=[RankZeroValidation(every_n_steps=2), ModelCheckpoint(tmp_path / folder, monitor=monitor)])  # fmt: skip

    with pytest.raises(
        ConfigError, match=r"ModelCheckpoint\(monitor='val_acc'\): validation logged no 'val_acc'"
    ):
        fit("val_acc", "broken")
    assert not list((tmp_path / "broken").glob("*.ckpt"))
    assert fit("val_loss", "fixed") == 4 and list((tmp_path / "fixed").glob("*.ckpt"))
