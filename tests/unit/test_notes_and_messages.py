"""Messages users meet: the way values are shown, notes a class says itself, import-time lines, version."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import lightning as L
import pytest
import torch

from distlab.errors import ConfigError


def test_early_stopping_on_a_loss_with_mode_max_is_noted(caplog):
    from distlab.callbacks import SyncEarlyStopping

    with caplog.at_level(logging.INFO):
        SyncEarlyStopping(monitor="val_loss", mode="max")
    assert "val_loss improves as it falls: set mode='min'" in caplog.text


def test_version_prints_what_a_bug_report_needs(capsys):
    from distlab.cli import main

    main(["--version"])
    out = capsys.readouterr().out
    assert out.startswith("distlab ") and "torch " in out and "lightning " in out, out


def test_a_deleted_working_folder_is_named_not_torch(tmp_path):
    import subprocess
    import sys

    from tests.helpers.cli import REPO

    gone = tmp_path / "gone"
    gone.mkdir()
    script = f"import os, runpy, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); sys.argv = ['distlab', '--version']; runpy.run_module('distlab', run_name='__main__')"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 2 and "the current folder no longer exists" in done.stderr, done.stderr[-1000:]


def _distlab_in(folder, *paths: str) -> subprocess.CompletedProcess:
    """``python -m distlab --version`` run in ``folder`` with ``paths`` ahead of the repository on PYTHONPATH."""
    from tests.helpers.cli import REPO

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(REPO)])}
    env.pop("DISTLAB_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "distlab", "--version"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_users_file_named_like_a_dependency_is_named_before_it_runs(tmp_path):
    """A lightning.py beside the command (python -m puts the folder first on the path) would be imported instead."""
    (tmp_path / "lightning.py").write_text("print('training my model...')\n")
    done = _distlab_in(tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-1000:]
    assert (
        f"'import lightning' would read {tmp_path / 'lightning.py'}, not the installed lightning"
        in done.stderr
    )
    assert "training my model" not in done.stdout  # nothing of it ran


def test_a_dependency_whose_install_is_broken_is_named_in_one_line(tmp_path):
    """A package a dependency imports fails to import (a shared library missing): one line naming it, exit 1."""
    broken = (
        tmp_path / "site" / "fsspec"
    )  # Lightning imports it (a dependency of a dependency: not checked above)
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(
        "raise ImportError('libstdc++.so.6: version GLIBCXX_3.4.99 not found')\n"
    )
    done = _distlab_in(tmp_path, str(tmp_path / "site"))
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-1000:]
    assert "importing fsspec failed (on the way: lightning -> " in done.stderr
    assert (
        "GLIBCXX_3.4.99 not found; its install is broken: reinstall it (pip install --force-reinstall fsspec)"
        in done.stderr
    )


def test_a_python_refusal_is_worded_for_python_and_its_advice_works():
    from distlab.callbacks import SpeedMonitor

    with pytest.raises(ConfigError) as info:
        SpeedMonitor(tokens_fn="len")
    assert "set tokens_fn to a function (any callable), or None" in str(info.value)
    assert "import path" not in str(info.value) and "null" not in str(info.value)
    SpeedMonitor(tokens_fn=len)  # what the line says to pass is taken


def _every_exported_callback_class():
    import lightning as L

    import distlab.callbacks as cbs

    return [
        getattr(cbs, n)
        for n in cbs.__all__
        if isinstance(getattr(cbs, n), type) and issubclass(getattr(cbs, n), L.Callback)
    ]


class _Tiny(L.LightningModule):
    """A two-class linear model that logs val_loss."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self.layer(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.cross_entropy(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data():
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=4)


def _trainer(**kwargs):
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        **kwargs,
    )


@pytest.mark.timeout(120)
def test_early_stopping_that_never_sees_its_metric_says_so_once(caplog):
    """strict=False skips while the metric is missing; a misspelt monitor would switch early stopping off unseen."""
    from distlab.callbacks import SyncEarlyStopping

    stopper = SyncEarlyStopping(monitor="val_los", strict=False)
    with caplog.at_level(logging.INFO):
        _trainer(max_steps=4, val_check_interval=2, callbacks=[stopper]).fit(_Tiny(), _data(), _data())
    said = [
        r.getMessage() for r in caplog.records if "strict=False): no metric of that name" in r.getMessage()
    ]
    assert len(said) == 1, said
    assert "(logged: val_loss); early stopping does nothing until it is" in said[0]


@pytest.mark.timeout(120)
def test_exact_validation_of_a_module_without_validation_step_is_refused():
    from distlab.callbacks import RankZeroValidation

    class NoValidationStep(_Tiny):
        validation_step = L.LightningModule.validation_step  # as a module that never defined it

    with pytest.raises(
        ConfigError, match="NoValidationStep has no validation_step, so there is nothing to evaluate"
    ):
        _trainer(max_steps=2, callbacks=[RankZeroValidation(every_n_steps=1)]).fit(
            NoValidationStep(), _data(), _data()
        )


@pytest.mark.timeout(120)
def test_exact_validation_of_a_validation_step_that_logs_nothing_says_so_once(caplog):
    from distlab.callbacks import RankZeroValidation

    class LogsNothing(_Tiny):
        def validation_step(self, batch, batch_idx):
            return None  # computes nothing, logs nothing

    with caplog.at_level(logging.INFO):
        _trainer(max_steps=4, callbacks=[RankZeroValidation(every_n_steps=2)]).fit(
            LogsNothing(), _data(), _data()
        )
    said = [r.getMessage() for r in caplog.records if "validation_step logged no metric" in r.getMessage()]
    assert len(said) == 1 and "LogsNothing.validation_step logged no metric (self.log)" in said[0], said


@pytest.mark.timeout(120)
def test_exact_validation_evaluates_the_samples_the_loaders_sampler_picks():
    """A SubsetRandomSampler over part of a dataset: the validation is over that part (each sample once), not the
    whole dataset the loader wraps; a sampler that draws with replacement cannot be exact and is refused."""
    from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset, WeightedRandomSampler

    from distlab.callbacks import RankZeroValidation

    torch.manual_seed(0)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    part = DataLoader(TensorDataset(x, y), batch_size=3, sampler=SubsetRandomSampler(range(10, 16)))
    rzv = RankZeroValidation(every_n_steps=1)
    model = _Tiny()
    _trainer(max_steps=1, callbacks=[rzv]).fit(model, _data(), part)
    by_hand = torch.nn.functional.cross_entropy(
        model.layer(x[10:]), y[10:]
    )  # the 6 picked samples, nothing else
    assert rzv.history[-1]["val_loss"] == pytest.approx(float(by_hand), rel=1e-5)
    drawn = DataLoader(TensorDataset(x, y), batch_size=3, sampler=WeightedRandomSampler([1.0] * 16, 16))
    with pytest.raises(ConfigError, match="draws some more than once"):
        _trainer(max_steps=1, callbacks=[RankZeroValidation(every_n_steps=1)]).fit(_Tiny(), _data(), drawn)
