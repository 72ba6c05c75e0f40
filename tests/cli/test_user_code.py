"""Errors in the user's own code are theirs to see: the line names their file and line (not "refused input"),
and the full traceback is saved; a script that would re-launch itself in every spawned rank is refused at once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.cli import run_subprocess


@pytest.mark.timeout(180)
def test_a_bug_in_the_users_module_points_at_their_line(tmp_path):
    out = run_subprocess(
        [sys.executable, "-m", "distlab", "fit", "--model", "tests.helpers.broken_module.Broken"]
        + ["--trainer.max_steps=1", f"--trainer.default_root_dir={tmp_path / 'run'}"],
        timeout=150,
    )
    line = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert line.startswith("distlab: error: KeyError: 'width' (raised in your code, "), line
    assert "tests/helpers/broken_module.py:13 in __init__" in line, line
    saved = Path(line.rsplit("full traceback: ", 1)[1].rstrip(")"))
    assert 'self.width = table["width"]' in saved.read_text()


UNGUARDED = """
import lightning as L
from lightning.pytorch.demos.boring_classes import BoringModel
import distlab
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_optimizer_sync_spawn", max_steps=1, logger=False)
trainer.fit(BoringModel())
"""


@pytest.mark.timeout(120)
def test_spawning_from_an_unguarded_script_is_refused_before_any_rank_starts(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED)
    out = run_subprocess([sys.executable, str(script)], timeout=90, cwd=tmp_path)
    assert out.returncode != 0
    assert (
        "line 6 of this script starts ranks (start_method='forkserver') outside an `if __name__ == \"__main__\":` block"
        in out.stderr
    )
    assert "MASTER_ADDR" not in out.stderr and out.stderr.count("Traceback") == 1  # no rank ever ran


USER_MODULES = """
import torch
import lightning as L
from torch.utils.data import DataLoader, TensorDataset


class _Base(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class CallsTorchWrongly(_Base):
    def training_step(self, batch, batch_idx):
        return self.layer("not a tensor").sum()  # line 21: torch raises, inside nn.Linear


class ReturnsNone(_Base):
    def training_step(self, batch, batch_idx):
        return None  # every step skipped: nothing trains


class LogsVector(_Base):
    def training_step(self, batch, batch_idx):
        per_sample = self.layer(torch.randn(16, 4)).squeeze(-1)
        self.log("per_sample", per_sample)  # line 32: not a scalar
        return per_sample.sum()


class DetachedLoss(_Base):
    def training_step(self, batch, batch_idx):
        return self.layer(torch.randn(2, 4)).sum().detach()


class ForgetsReturn(_Base):
    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        torch.optim.SGD(self.parameters(), lr=0.1)  # no return: Lightning trains with a stand-in and exits 0


class KeepsLambda(_Base):
    def __init__(self):
        super().__init__()
        self.scale = lambda x: 2 * x  # cannot be pickled: the spawn presets pickle the module

    def training_step(self, batch, batch_idx):
        return self.scale(self.layer(batch[0])).sum()


class AllFrozen(ForgetsReturn):
    def __init__(self):
        super().__init__()
        self.layer.requires_grad_(False)

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)
"""


def _fit_user_class(tmp_path, monkeypatch, capsys, class_path: str) -> tuple[int, str]:
    from distlab.cli import main

    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit) as info:
        main(["fit", "--model", class_path, "--trainer.max_steps=1", "--trainer.accelerator=cpu",
              "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path / 'run'}"])  # fmt: skip
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("distlab: error:")]
    assert len(lines) == 1, lines
    return info.value.code, lines[0]


@pytest.mark.timeout(120)
def test_a_library_error_the_users_code_caused_points_at_their_line(tmp_path, monkeypatch, capsys):
    """torch raises, but the first frame outside the libraries is the user's: theirs, not an internal error."""
    (tmp_path / "user_mods_a.py").write_text(USER_MODULES)
    code, line = _fit_user_class(tmp_path, monkeypatch, capsys, "user_mods_a.CallsTorchWrongly")
    assert code == 1 and "raised in your code" in line and "user_mods_a.py:21 in training_step" in line, line
    # The failed start left only its traceback: the retry (after the user's fix) is not "an earlier run"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["error.log"]
    code, again = _fit_user_class(tmp_path, monkeypatch, capsys, "user_mods_a.CallsTorchWrongly")
    assert "raised in your code" in again and "earlier run" not in again, again


@pytest.mark.timeout(120)
def test_a_detached_loss_is_said_to_be_the_users(tmp_path, monkeypatch, capsys):
    (tmp_path / "user_mods_b.py").write_text(USER_MODULES)
    code, line = _fit_user_class(tmp_path, monkeypatch, capsys, "user_mods_b.DetachedLoss")
    assert code == 1 and "most likely in your code" in line and "internal error" not in line, line


@pytest.mark.timeout(120)
def test_a_syntax_error_in_the_users_module_names_its_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "user_mods_c.py").write_text("import torch\nx = (1,\n")
    code, line = _fit_user_class(tmp_path, monkeypatch, capsys, "user_mods_c.Anything")
    assert code == 1 and "user_mods_c.py:2 (a syntax error)" in line, line


@pytest.mark.timeout(120)
def test_a_fit_that_takes_no_optimizer_step_is_not_a_success(tmp_path, monkeypatch, capsys):
    """training_step returning None skips every step (Lightning only warns): the fit trained nothing, exit 1."""
    from distlab.cli import main

    (tmp_path / "user_mods_d.py").write_text(USER_MODULES)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit) as info:
        main(["fit", "--model", "user_mods_d.ReturnsNone", "--trainer.max_epochs=1", "--trainer.max_steps=2", "--trainer.accelerator=cpu",
              "--trainer.logger=false", "--trainer.limit_train_batches=2", f"--trainer.default_root_dir={tmp_path / 'run'}"])  # fmt: skip
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("distlab: error:")]
    assert info.value.code == 1 and len(lines) == 1, (info.value.code, err[-3000:])
    assert "every training_step returned None" in lines[0], err[-3000:]


@pytest.mark.timeout(120)
def test_a_long_library_message_keeps_its_reason_and_points_at_the_users_line(tmp_path, monkeypatch, capsys):
    """Lightning's message starts with a tensor's printout and says why at its end: the line keeps the reason (the
    printout shortened), and points at the user's self.log call, not at Lightning's frame that raised."""
    (tmp_path / "user_mods_e.py").write_text(USER_MODULES)
    code, line = _fit_user_class(tmp_path, monkeypatch, capsys, "user_mods_e.LogsVector")
    assert code == 1 and "the tensor must have a single element" in line and "tensor([...])" in line, line
    assert "user_mods_e.py:32 in training_step" in line, line


@pytest.mark.timeout(120)
def test_a_fit_that_would_train_nothing_or_cannot_start_says_why_in_the_users_terms(
    tmp_path, monkeypatch, capsys
):
    """configure_optimizers without its return (Lightning only warns and exits 0 after training nothing); a torch
    optimizer given only frozen parameters (torch: "optimizer got an empty parameter list", not an internal error)."""
    (tmp_path / "user_mods_f.py").write_text(USER_MODULES)
    code, line = _fit_user_class(tmp_path, monkeypatch, capsys, "user_mods_f.ForgetsReturn")
    assert code == 1 and "ForgetsReturn.configure_optimizers returned no optimizer" in line, line
    code, line = _fit_user_class(tmp_path, monkeypatch, capsys, "user_mods_f.AllFrozen")
    assert code == 1 and "every parameter it was given is frozen" in line and "internal error" not in line, (
        line
    )
    assert "user_mods_f.py:" in line, line  # and where, in their code


def test_distlabs_own_builders_refuse_a_model_with_nothing_to_train():
    from distlab.errors import ConfigError
    from distlab.optim import DistMuonAdamW, muon_param_groups

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).requires_grad_(False)
    with pytest.raises(ConfigError, match="every parameter is frozen .4 tensors"):
        muon_param_groups(net)
    with pytest.raises(ConfigError, match="got no parameters to optimize"):
        DistMuonAdamW([{"params": [], "kind": "muon"}])


@pytest.mark.timeout(120)
def test_a_module_the_spawn_presets_cannot_pickle_says_what_to_do(tmp_path, monkeypatch, capsys):
    from distlab.cli import main
    from tests.helpers.cli import CONFIGS

    (tmp_path / "user_mods_g.py").write_text(USER_MODULES)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit) as info:
        main(["fit", "--model", "user_mods_g.KeepsLambda", "--config", str(CONFIGS / "trainer" / "ddp_optimizer_sync_spawn_cpu.yaml"),
              "--trainer.max_steps=1", "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path / 'run'}"])  # fmt: skip
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("distlab: error:")]
    assert info.value.code == 1 and len(lines) == 1, lines
    assert "Can't pickle local object 'KeepsLambda.__init__.<locals>.<lambda>'" in lines[0], lines[0]
    assert (
        "define it at module level, or launch with torchrun" in lines[0] and "internal error" not in lines[0]
    )
