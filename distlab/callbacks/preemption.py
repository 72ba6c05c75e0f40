"""Save and stop when the scheduler asks (a SLURM job near its time limit, a preemption), so that the
requeued job resumes where this one stopped.

The batch script turns the scheduler's signal into a file (``scripts/slurm.sbatch``: SIGUSR1 ->
``touch $DISTLAB_STOP_FILE``). Every ``every_n_steps`` steps the ranks agree whether any sees the file (one
tiny all_reduce); then every rank saves ``last.ckpt`` and training stops. The CLI adds this callback when
``DISTLAB_STOP_FILE`` is set; in a config::

    trainer:
      callbacks:
        - class_path: distlab.callbacks.CheckpointOnStopRequest
          init_args: {stop_file: runs/x/STOP}
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DistributedSampler

from distlab.checkpoint import checkpoint_step
from distlab.compat import MockOptimizer, skip_lightning_signal_handlers
from distlab.distributed import all_reduce
from distlab.domains import NonEmptyText, PositiveInt, check_domains, unwritable_reason
from distlab.errors import ConfigError, DistlabError

ENV_VAR = "DISTLAB_STOP_FILE"


def check_stop_file(path: str, named_by: str) -> None:
    """A stop file that exists already, is a folder, or can never be created is a one-line ConfigError."""
    if os.path.isdir(path):
        raise ConfigError(
            f"{named_by}={path!r} is a folder; it names the file whose creation asks the run to stop: set it to a file "
            f"path that does not exist yet, e.g. {path.rstrip('/')}/stop"
        )
    if os.path.exists(path):
        raise ConfigError(
            f"{named_by}={path!r} exists before the run started (left over from an earlier stop?): every rank would "
            "stop at the first step; delete it (scripts/slurm.sbatch does so at the start of each job)"
        )
    problem = unwritable_reason(path, folder=False)
    if problem:
        raise ConfigError(
            f"{named_by}={path!r} could never be created ({problem}): no stop could ever be requested; name a file in "
            "a folder where files can be created"
        )
    if not Path(path).expanduser().absolute().parent.is_dir():
        raise ConfigError(
            f"{named_by}={path!r}: its folder does not exist, so no stop could ever be requested; create the folder "
            "or name a file in an existing one"
        )


def _checkpoint_folder(trainer: L.Trainer) -> Path:
    """The first ModelCheckpoint's folder (a bare Checkpoint has none), else ``default_root_dir/checkpoints``."""
    folder = getattr(trainer.checkpoint_callback, "dirpath", None)
    return Path(folder) if folder else Path(trainer.default_root_dir) / "checkpoints"


class CheckpointOnStopRequest(L.Callback):
    """When ``stop_file`` exists on any rank: all ranks save ``last.ckpt`` and stop (see the module docstring)."""

    def __init__(self, stop_file: NonEmptyText, every_n_steps: PositiveInt = 1) -> None:
        check_domains(CheckpointOnStopRequest.__init__, locals())
        check_stop_file(str(stop_file), "stop_file")
        self.stop_file, self.every_n_steps = str(stop_file), every_n_steps
        self.saved_path: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> CheckpointOnStopRequest | None:
        """The callback ``DISTLAB_STOP_FILE`` asks for, or None."""
        path = (os.environ if env is None else env).get(ENV_VAR, "").strip()
        if not path:
            return None
        check_stop_file(path, ENV_VAR)
        return cls(path)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx
    ) -> None:
        if trainer.global_step % self.every_n_steps or self.saved_path is not None:
            return
        asked = torch.tensor([float(os.path.exists(self.stop_file))], device=pl_module.device)
        if all_reduce(asked, "max").item() == 0:  # every rank takes part: one decision for all
            return
        self.saved_path = str(_checkpoint_folder(trainer) / "last.ckpt")
        trainer.save_checkpoint(self.saved_path, weights_only=False)  # collective: optimizer shards gathered
        trainer.should_stop = True
        rank_zero_info(
            f"distlab: stop requested ({self.stop_file}): saved {self.saved_path} at step {trainer.global_step}; "
            "a requeued job resumes from it"
        )


# The stop a fit last received from outside ("SIGTERMException", "KeyboardInterrupt") and what was saved (the CLI's line)
stopped_by: str | None = None
stop_note: str = ""

_STOP_NAMES = {signal.SIGTERM: "SIGTERMException", signal.SIGINT: "KeyboardInterrupt"}
# A second Ctrl-C this long after the first stops at once (the first waits for the ranks to agree and save);
# closer ones are the same press reaching a rank twice (from the terminal and from its launcher).
FORCE_AFTER_S = 2.0


def _catch_stop_signals(handler: Callable[[int, Any], None]) -> dict[int, Any]:
    """Install ``handler`` for the stop signals this process did not inherit ignored (``nohup``); the handlers it
    replaced."""
    return {s: signal.signal(s, handler) for s in _STOP_NAMES if signal.getsignal(s) is not signal.SIG_IGN}


def _restore_signals(previous: dict[int, Any]) -> None:
    for s, handler in previous.items():
        signal.signal(s, handler)


@contextmanager
def stop_signals_forwarded(ranks: Callable[[], list]) -> Iterator[None]:
    """In the process that launched the ranks (spawn): SIGTERM or Ctrl-C is passed on to every rank as SIGTERM,
    and this process waits for them (else the ranks die with it, saving nothing). ``ranks()``: those started so far."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: Any) -> None:
        global stopped_by
        import multiprocessing

        stopped_by = stopped_by or _STOP_NAMES[signal.Signals(signum)]
        started = ranks()  # empty until every rank has started
        for proc in started or multiprocessing.active_children():
            if proc.is_alive() and proc.pid is not None:
                try:
                    os.kill(proc.pid, signal.SIGTERM if started else signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if not started:
            # still starting (this process may block on a pipe to a rank that died): nothing was trained, stop here
            raise KeyboardInterrupt

    previous = _catch_stop_signals(forward)
    try:
        yield
    finally:
        _restore_signals(previous)


class SaveUnsavedSteps(L.Callback):
    """When a fit ends with optimizer steps that no checkpoint holds (``max_time``, SIGTERM, Ctrl-C, a stop between
    checkpoints), save ``last.ckpt`` in the first ModelCheckpoint's folder. Nothing without a ModelCheckpoint or
    after an error. A fit that trains nothing (no optimizer, every training_step returned None, no training batch)
    is an error, not a success. The ``distlab`` command adds it to every fit."""

    def __init__(self) -> None:
        self.saved_step = -1
        self.batches = 0  # training batches seen
        self.losses = 0  # those whose training_step returned a loss
        self.received = 0  # the stop signal this rank received (0: none)
        self.received_at = 0.0
        self._previous: dict[int, Any] = {}

    # A stop signal reaches the ranks at different points of a step, or only some of them; Lightning's handler
    # broadcasts inside the signal handler (pairing with whatever collective the others are in). Here the handler
    # only takes note, and at the end of each step the ranks agree (one all_reduce) and all save and stop together.
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if pl_module.automatic_optimization and all(isinstance(o, MockOptimizer) for o in trainer.optimizers):
            raise DistlabError(  # Lightning only warns, trains with a stand-in that changes nothing, and exits 0
                f"{type(pl_module).__name__}.configure_optimizers returned no optimizer (None: a missing return?), so "
                "the fit would train nothing; return the optimizer (and its LR scheduler, if any)"
            )
        if threading.current_thread() is threading.main_thread():
            skip_lightning_signal_handlers(trainer)
            self._previous = _catch_stop_signals(self._on_stop_signal)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._give_back_signals()

    def _on_stop_signal(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.received == signal.SIGINT == signum and now - self.received_at > FORCE_AFTER_S:
            raise KeyboardInterrupt  # Ctrl-C again: stop now
        if not self.received:
            self.received, self.received_at = int(signum), now

    def _give_back_signals(self) -> None:
        _restore_signals(self._previous)
        self._previous = {}

    def _stop_agreed(self, trainer: L.Trainer, pl_module: L.LightningModule) -> int:
        """The stop signal any rank received (SIGTERM over SIGINT), the same on every rank; 0 for none."""
        if trainer.world_size == 1:
            return self.received
        received = torch.tensor([float(self.received)], device=pl_module.device)
        return int(all_reduce(received, "max").item())

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx
    ) -> None:
        global stopped_by, stop_note
        self.batches += 1
        # (Lightning hands a step that training_step skipped by returning None as an empty dict)
        self.losses += (outputs.get("loss") is not None) if isinstance(outputs, dict) else outputs is not None
        received = self._stop_agreed(trainer, pl_module)  # every rank, every step, whatever else happened
        if not received:
            return
        stopped_by = _STOP_NAMES[signal.Signals(received)]
        stop_note = self._save_unsaved(trainer)  # every rank, at this step
        # end the fit now: no validation first (a scheduler's grace period is short), no min_steps / min_epochs
        trainer.should_stop = True
        trainer.limit_val_batches = 0
        trainer.fit_loop.min_epochs = None
        trainer.fit_loop.epoch_loop.min_steps = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._give_back_signals()
        untrained = pl_module.automatic_optimization and self.batches > 0 and self.losses == 0
        if untrained:  # the fit ended on its own, and every update was skipped
            raise DistlabError(
                f"the fit ran {self.batches} training batch(es) and every training_step returned None, so Lightning "
                "skipped every update: nothing was trained; return the loss from training_step"
            )
        self._save_unsaved(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        global stopped_by, stop_note
        self._give_back_signals()
        name = type(exception).__name__
        if name not in ("SIGTERMException", "KeyboardInterrupt"):
            return  # an error: the weights may be what caused it
        stopped_by = name
        # SIGTERMException comes on every rank at the same step; Ctrl-C does not: a collective save only on one rank
        if name == "SIGTERMException" or trainer.world_size == 1:
            stop_note = self._save_unsaved(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self.saved_step = max(self.saved_step, int(checkpoint.get("global_step", -1)))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning skips a fit with no training batch (exit 0, one info line): nothing was trained
        if self.batches or trainer.global_step or trainer.interrupted:
            return
        if trainer.limit_train_batches == 0:
            raise ConfigError(
                "trainer.limit_train_batches=0 turns training off, so the fit trained nothing; remove it (distlab "
                "validate evaluates a checkpoint without training)"
            )
        if trainer.num_training_batches == 0:
            raise ConfigError(
                "the training loader gave no batch (an empty dataset, or drop_last with fewer samples than one batch "
                f"on each of the {trainer.world_size} rank(s)), so the fit trained nothing; give train_dataloader "
                "data, or lower the batch size"
            )

    @staticmethod
    def _older_than(last: Path, step: int) -> bool:
        """Whether ``last`` exists and holds an earlier step than ``step`` (or none that can be read)."""
        if not last.exists():
            return False
        try:
            held = checkpoint_step(last)
        except Exception:  # noqa: BLE001 - unreadable: replaced by a good one
            return True
        return held is None or held < step

    def _save_unsaved(self, trainer: L.Trainer) -> str:
        """Save the steps no checkpoint holds yet; what was done, in words."""
        if trainer.fast_dev_run:  # Lightning saves nothing then, neither does this
            return "fast_dev_run: nothing was saved"
        if not trainer.checkpoint_callbacks:
            return "no ModelCheckpoint: nothing was saved"
        folder = _checkpoint_folder(trainer)
        # a save in the background: complete it
        getattr(trainer.strategy, "finish_checkpoints", lambda: None)()
        # a last.ckpt older than the final step would make --ckpt_path last train those steps again (rank 0 reads it)
        stale_last = trainer.strategy.broadcast(
            self._older_than(folder / "last.ckpt", trainer.global_step), src=0
        )
        if (trainer.global_step <= self.saved_step and not stale_last) or trainer.global_step == 0:
            return f"the last checkpoint holds step {trainer.global_step}"
        path, before = str(folder / "last.ckpt"), self.saved_step
        trainer.save_checkpoint(path, weights_only=False)  # every rank: the optimizer's shards are gathered
        if before >= trainer.global_step:  # another checkpoint holds the step; last.ckpt did not
            rank_zero_info(
                f"distlab: the fit ended at step {trainer.global_step} and last.ckpt held an earlier step; saved {path} "
                "so that --ckpt_path last continues from here"
            )
        else:
            rank_zero_info(
                f"distlab: the fit ended at step {trainer.global_step}, after the last checkpoint"
                f"{f' (step {before})' if before >= 0 else ''}; saved {path} so that no step is lost"
            )
        return f"saved {path} at step {trainer.global_step}"


def resume_gap(loader: Any) -> str | None:
    """Why ``loader`` cannot continue mid-epoch exactly after a resume, or None when it can."""
    dataset = getattr(loader, "dataset", None)
    if getattr(dataset, "resumes_from_step", False):
        return None  # its position is a function of the step (distlab's text stream)
    if not (
        callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))
    ):
        return f"the training {type(loader).__name__} cannot resume mid-epoch (torchdata's StatefulDataLoader can)"
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, DistributedSampler) and not callable(getattr(sampler, "state_dict", None)):
        return (
            f"the training {type(loader).__name__} resumes, but its {type(sampler).__name__} (Lightning's, on several "
            "ranks) does not; give it torchdata's StatefulDistributedSampler"
        )
    return None


_PLAN_COUNT = re.compile(r"^(.*) from ([\d,]+ (?:windows|samples))$")


def _plan_parts(plan: str) -> tuple[str, str | None]:
    """A draw plan as (how it draws, what from: "1,234 windows"); an older checkpoint's plan has no count (None)."""
    m = _PLAN_COUNT.match(plan)
    return (m[1], m[2]) if m else (plan, None)


class DataResumeCheck(L.Callback):
    """Says in one line when a resumed fit's data does not continue exactly: a mid-epoch resume whose loader cannot
    resume (see :func:`resume_gap`; it restarts its epoch), or a stream whose ``draw_plan()`` (saved in each
    checkpoint) differs from the checkpoint's: another plan (world size, reproducible mode) or another number of
    windows (the data changed). The ``distlab`` command adds it to every fit."""

    CHECKPOINT_KEY = "distlab_draw_plan"

    def __init__(self) -> None:
        self._saved_plan: str | None = None

    @staticmethod
    def _plan(trainer: L.Trainer) -> str | None:
        plan = getattr(getattr(trainer.train_dataloader, "dataset", None), "draw_plan", None)
        return plan() if callable(plan) else None

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        plan = self._plan(trainer) if trainer.state.fn == "fit" else None
        if plan is not None:
            checkpoint[self.CHECKPOINT_KEY] = plan

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._saved_plan = checkpoint.get(self.CHECKPOINT_KEY)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        plan, saved = self._plan(trainer), self._saved_plan
        if trainer.ckpt_path and saved and plan:
            how, count = _plan_parts(plan)
            saved_how, saved_count = _plan_parts(saved)
            if how != saved_how:
                rank_zero_info(
                    f"distlab: note: the data is drawn as {plan}, and the checkpoint's run drew {saved}: the data does "
                    "not continue exactly where that run was"
                )
            elif saved_count is not None and count != saved_count:  # (None: a plan from before the counts)
                rank_zero_info(
                    f"distlab: note: the training data holds {count}, and the checkpoint's run drew from {saved_count} "
                    "(the dataset changed): the data does not continue exactly where that run was"
                )
        mid_epoch = trainer.fit_loop.epoch_loop.batch_progress.current.completed > 0  # the restored position
        if not trainer.ckpt_path or not mid_epoch:
            return
        gap = resume_gap(trainer.train_dataloader)
        if gap:
            rank_zero_info(
                f"distlab: note: resuming mid-epoch at step {trainer.global_step} (epoch {trainer.current_epoch}), "
                f"but {gap}: this epoch's data starts again from its first batch"
            )
