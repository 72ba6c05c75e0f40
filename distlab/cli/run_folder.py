"""Where a run writes (the *run folder*: the first logger's directory, with ``metrics.csv``, ``tensorboard/``,
``checkpoints/``, ``config.yaml``), what a start that failed leaves behind, and that a fresh fit never mixes with an
earlier run.

Example::

    loggers = default_loggers("runs/demo", "fit")     # CSV (+ TensorBoard when installed)
    run_folder(trainer), checkpoint_folder(trainer)   # Path("runs/demo"), Path("runs/demo/checkpoints")
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import yaml
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from distlab.compat import AppendingCSVLogger
from distlab.domains import CKPT_ALIASES, unwritable_reason
from distlab.errors import ConfigError

# What the command running in this process knows of its run folder (reset by distlab.cli.main): ``folder``, once
# parsed, where an internal error's traceback is saved; ``created``, the run folder this fit creates (new), removed
# if it fails.
this_run = SimpleNamespace(folder=None, created=None)


def default_loggers(
    save_dir: str, subcommand: str = "fit", resume: bool = False, evaluated: str | None = None
) -> list:
    """CSV always (the loss-curve plot reads it) + TensorBoard when it is installed. ``fit`` writes
    ``save_dir/metrics.csv`` (a ``resume`` appends to it); an evaluation of a checkpoint writes
    ``save_dir/<subcommand>/<checkpoint name>/`` (a new folder each time: Lightning's CSVLogger deletes a metrics.csv)."""
    version = "" if subcommand == "fit" else subcommand
    if subcommand != "fit" and evaluated:
        # the checkpoint's file (or DCP folder) name without .ckpt (epoch=0-step=8.ckpt -> epoch=0-step=8), or
        # -2, -3, ... after it when an earlier evaluation already wrote there (kept as it is)
        name = Path(str(evaluated).rstrip("/")).name.removesuffix(".ckpt") or "checkpoint"
        version, n = f"{subcommand}/{name}", 1
        while any(
            Path(save_dir, version, f).exists() for f in ("metrics.csv", "config.yaml", "hparams.yaml")
        ):
            n += 1
            version = f"{subcommand}/{name}-{n}"
    loggers = [(AppendingCSVLogger if resume else CSVLogger)(save_dir=save_dir, name="", version=version)]
    if importlib.util.find_spec("tensorboard") is not None:
        # an evaluation's events beside its metrics.csv, never in the fit's tensorboard/
        board = "tensorboard" if subcommand == "fit" else f"{version}/tensorboard"
        loggers.append(TensorBoardLogger(save_dir=save_dir, name="", version=board, default_hp_metric=False))
    return loggers


def run_folder(trainer) -> Path:
    """Where a fit writes its config, metrics and (by default) checkpoints: the first logger's directory."""
    return checkpoint_folder(trainer).parent


def checkpoint_folder(trainer) -> Path:
    """Where ModelCheckpoint writes when it has no dirpath (the first logger's directory, as Lightning does)."""
    if trainer.loggers:
        logger = trainer.loggers[0]
        parts = [logger.save_dir or trainer.default_root_dir, logger.name or "", str(logger.version or "")]
        return Path(*[p for p in parts if p]) / "checkpoints"
    return Path(trainer.default_root_dir) / "checkpoints"


def remove_failed_start(folder: Path | None, refused: bool = False) -> None:
    """Empty the run folder a fit created (its error.log aside) if it failed before it saved a checkpoint or logged a
    step, or (``refused``: its input refused mid-run) saved no checkpoint: the retry must not meet "an earlier run"."""
    if folder is None or not folder.is_dir() or any(folder.rglob("*.ckpt")):
        return
    metrics = folder / "metrics.csv"
    logged = metrics.is_file() and len(metrics.read_text(errors="replace").strip().splitlines()) > 1
    if logged and not refused:
        return
    for entry in folder.iterdir():
        if entry.name.startswith("error"):  # error.log, error-rank1.log: named by the one line printed
            continue
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    if not any(folder.iterdir()):
        folder.rmdir()


def keep_earlier_config(folder: Path, name: str, new_text: str) -> Path | None:
    """Before a run writes ``folder/name``: an earlier config there that says something else is kept as
    ``config.1.yaml`` (``.2``, ...). Returns where it went, or None (nothing there, or the same settings)."""
    path = folder / name
    if not path.is_file():
        return None
    try:  # compared as what they say, not byte for byte
        if yaml.safe_load(path.read_text(encoding="utf-8")) == yaml.safe_load(new_text):
            return None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        pass  # unreadable: kept aside all the same
    k = 1
    while (kept := folder / f"{path.stem}.{k}{path.suffix}").exists():
        k += 1
    path.rename(kept)
    return kept


def check_writable(path: str | os.PathLike, what: str, fix: str) -> None:
    """A folder (or a file to be created) this process must be able to write (one-line ConfigError)."""
    problem = unwritable_reason(path, folder=True)
    if problem:
        raise ConfigError(f"{what} {str(path)!r} cannot be written ({problem}); {fix}")


def is_launching_process() -> bool:
    """Whether this process starts the job (not a rank a launcher started): it alone checks the run folder."""
    return all(os.environ.get(k, "0") in ("", "0") for k in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "RANK"))


# What a fit writes in its run folder: a folder holding any of them belongs to a run.
RUN_FILES = ("config.yaml", "metrics.csv", "hparams.yaml", "checkpoints/*.ckpt", "*.ckpt")


def check_run_folder_is_free(
    run_folder: Path,
    ckpt_path: str | None,
    checkpoint_folders: list[Path],
    set_by: str,
    config_files: list[str],
) -> None:
    """A fresh fit must not write into an earlier run's folder, nor over a ``--config`` file it reads; a resume may
    continue in the folder its checkpoint came from. ``set_by``: the setting that chose the folder."""
    resumed_here = ckpt_path is not None and (
        ckpt_path in CKPT_ALIASES or run_folder.resolve() in Path(ckpt_path).expanduser().resolve().parents
    )
    recipe = next((c for c in config_files if Path(c).expanduser().resolve() == (run_folder / "config.yaml").resolve()),
                  None)  # fmt: skip
    if recipe is not None and not resumed_here:
        raise ConfigError(
            f"--config {recipe} is the config.yaml a fit writes into its run folder {run_folder}: it would be "
            f"overwritten; set {set_by} to another folder, e.g. {run_folder / 'run'}"
        )
    found = sorted(
        {p for pattern in RUN_FILES for p in run_folder.glob(pattern)} if run_folder.is_dir() else set()
    )
    found += sorted(p for folder in checkpoint_folders if folder.is_dir() for p in folder.glob("*.ckpt"))
    if not found:
        return
    if ckpt_path is None:
        newest = next((p for p in reversed(found) if p.suffix == ".ckpt"), found[-1])
        hint = f"resume with --ckpt_path {newest}, or " if newest.suffix == ".ckpt" else ""
        raise ConfigError(f"{newest.parent} already holds an earlier run ({newest.name}); {hint}set another {set_by}, "
                          "or delete the folder")  # fmt: skip
    if not resumed_here:
        raise ConfigError(
            f"{run_folder} holds another run ({found[0].name}), and the checkpoint {ckpt_path!r} comes from elsewhere: "
            "resuming there would overwrite that run's config and mix the checkpoints; resume in the checkpoint's own "
            "run folder or in a new --trainer.default_root_dir"
        )
