"""What a callback counts during a run survives a checkpoint: every number a distlab callback holds as run state
(an int or float attribute that is not one of its constructor's settings) comes back from ``state_dict()`` into a
fresh instance's ``load_state_dict()``.

Over every callback ``distlab.callbacks`` exports that keeps state (overrides ``state_dict``), discovered, not
listed; a new callback or a new counter joins by itself."""

from __future__ import annotations

import inspect

import lightning as L
import pytest
import torch

import distlab.callbacks

ARGS = {
    "SyncEarlyStopping": {"monitor": "val_loss", "patience": 1},
    "RankZeroValidation": {"every_n_steps": 2},
    "FaultInjection": {"kind": "crash", "rank": 1, "step": 1},
    "CheckpointOnStopRequest": {"stop_file": "/nonexistent/STOP"},
}
STATEFUL = sorted(
    name
    for name in distlab.callbacks.__all__
    if inspect.isclass(cls := getattr(distlab.callbacks, name))
    and issubclass(cls, L.Callback)
    and cls.state_dict is not L.Callback.state_dict
)


def test_the_stateful_callbacks_are_found():
    assert "SyncEarlyStopping" in STATEFUL


@pytest.mark.parametrize("name", STATEFUL)
def test_run_state_round_trips_through_a_checkpoint(name):
    cls = getattr(distlab.callbacks, name)
    settings = set(inspect.signature(cls.__init__).parameters)
    cb = cls(**ARGS.get(name, {}))
    changed = {}
    for i, (attr, value) in enumerate(sorted(vars(cb).items())):
        if attr in settings or attr.lstrip("_") in settings or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            changed[attr] = type(value)(value + 7 + i)  # a value no fresh instance holds
            setattr(cb, attr, changed[attr])
    assert changed, f"{name} keeps no numeric run state?"
    fresh = cls(**ARGS.get(name, {}))
    fresh.load_state_dict(cb.state_dict())
    lost = {a: (v, getattr(fresh, a)) for a, v in changed.items() if getattr(fresh, a) != v}
    assert not lost, f"{name}: run state not carried by state_dict (saved, restored): {lost}"


@pytest.mark.parametrize("name", STATEFUL)
def test_a_restore_keeps_the_settings_configured_now(name):
    """A resumed run's settings are the ones it was given now (a patience changed for the resume, say); only run
    state comes from the checkpoint. Every numeric constructor setting is moved off the saved run's value."""
    cls = getattr(distlab.callbacks, name)
    args = dict(ARGS.get(name, {}))
    saved = cls(**args).state_dict()
    now = {}
    for pname, param in inspect.signature(cls.__init__).parameters.items():
        value = args.get(pname, param.default)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            now[pname] = type(value)(value + 1)
    fresh, configured = cls(**{**args, **now}), cls(**{**args, **now})
    fresh.load_state_dict(saved)
    replaced = {
        k: (getattr(configured, k), getattr(fresh, k))
        for k in now
        if hasattr(fresh, k) and getattr(fresh, k) != getattr(configured, k)
    }
    assert not replaced, f"{name}: settings replaced by the checkpoint's (configured, restored): {replaced}"


class _Probe(L.Callback):
    """Records a callback's state_dict() as the training starts."""

    def __init__(self, watched: L.Callback) -> None:
        self.watched, self.seen = watched, None

    def on_train_start(self, trainer, pl_module):
        self.seen = self.watched.state_dict()


class _Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self.layer(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.cross_entropy(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _started_state(cb: L.Callback) -> dict:
    from torch.utils.data import DataLoader, TensorDataset

    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=4)
    probe = _Probe(cb)
    L.Trainer(
        accelerator="cpu", devices=1, max_steps=2, val_check_interval=1, logger=False, enable_progress_bar=False,
        enable_checkpointing=False, callbacks=[cb, probe],
    ).fit(_Tiny(), data, data)  # fmt: skip
    return probe.seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", STATEFUL)
def test_a_new_fit_starts_from_fresh_run_state(name):
    """One callback object used for two fits in a row (a notebook, a sweep): the second starts as a fresh object
    would (an early stop's count of bad checks carried over would stop it at its first validation)."""
    cls = getattr(distlab.callbacks, name)
    reused = cls(**ARGS.get(name, {}))
    for attr, value in sorted(vars(reused).items()):  # as a finished run leaves them
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and attr.lstrip("_") not in ARGS.get(name, {})
        ):
            setattr(reused, attr, type(value)(value + 5))
    fresh = _started_state(cls(**ARGS.get(name, {})))
    again = _started_state(reused)
    assert str(again) == str(fresh), f"{name}: a second fit starts from {again}, a fresh one from {fresh}"


class _RaisesAtStepTwo(_Tiny):
    def training_step(self, batch, batch_idx):
        if self.raises and self.global_step == 2:
            raise RuntimeError("a bug at step 2")
        return super().training_step(batch, batch_idx)


@pytest.mark.timeout(120)
def test_a_trainer_whose_fit_raised_validates_in_its_next_fit():
    """RankZeroValidation turns Lightning's own validation off for a fit (limit_val_batches=0) and validates itself;
    Lightning calls no teardown hook after a fit that raised. The same Trainer's next fit (a notebook after fixing
    the bug) ran to the end with no validation at all, and said nothing."""
    from torch.utils.data import DataLoader, TensorDataset

    from distlab.callbacks import RankZeroValidation

    data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,))), batch_size=4)
    rzv, module = RankZeroValidation(every_n_steps=1), _RaisesAtStepTwo()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=4, logger=False, enable_progress_bar=False,
        enable_checkpointing=False, enable_model_summary=False, callbacks=[rzv],
    )  # fmt: skip
    module.raises = True
    with pytest.raises(RuntimeError, match="a bug at step 2"):
        trainer.fit(module, data, data)
    assert trainer.limit_val_batches == 1.0
    module.raises = False
    rzv.history.clear()
    trainer.fit(module, data, data)
    assert len(rzv.history) >= 2, rzv.history
