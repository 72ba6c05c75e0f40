"""What ``--ckpt_path`` names, checked for :class:`~distlab.cli.app.DistlabCLI` when the config is parsed (the file,
its class and hyperparameters, loaded without running code) and when the Trainer exists (the strategy it continues
under, the weights it must fit, ``last`` resolved).
"""

from __future__ import annotations

import atexit
import os
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from distlab.checkpoint import (
    check_lightning_checkpoint,
    check_weights_fit,
    checkpoint_hparams,
    checkpoint_step,
    consolidate_training_checkpoint,
    is_safetensors,
    newest_checkpoint,
    plain_value,
)
from distlab.checkpoint.integrity import check_intact, damage
from distlab.cli.run_folder import check_writable, checkpoint_folder, this_run
from distlab.domains import CKPT_ALIASES
from distlab.errors import ConfigError
from distlab.launch import restart_count


def apply_checkpoint_settings(config: Any, parser: Any, typed: set[str] | dict) -> Any:
    """The parsed ``config`` with the model hyperparameters a ``--ckpt_path`` checkpoint holds, loaded without running
    code: the class must be the config's, a setting typed on the command line (``typed``) beats the checkpoint's, and
    every value that differs from the config is said in one line."""
    subcommand = config.get("subcommand")
    cfg = config.get(subcommand) if subcommand else None
    ckpt = cfg.get("ckpt_path") if cfg is not None else None
    if isinstance(ckpt, str) and not ckpt.strip():
        raise ConfigError(
            "--ckpt_path is empty (an unset variable?); give a checkpoint's path, or drop --ckpt_path to start "
            "from scratch"
        )
    if ckpt == "last":  # the file it names, found now: it gets every check an explicit path gets
        found = _last_in_configured_folders(cfg)
        if found is None:
            return config  # none there: refused with where it looked once the Trainer exists
        cfg["ckpt_path"] = ckpt = str(found)
    if not ckpt or ckpt in CKPT_ALIASES:
        return config
    if str(ckpt).startswith("~"):  # no shell expanded it (--ckpt_path=~/x, or a config file)
        cfg["ckpt_path"] = ckpt = os.path.expanduser(ckpt)
    if is_safetensors(ckpt):
        raise ConfigError(
            f"{ckpt!r} is an exported .safetensors file (weights only: no optimizer state, no step); {subcommand} "
            "needs a .ckpt that distlab fit wrote (distlab generate reads the .safetensors)"
        )
    check_lightning_checkpoint(ckpt)  # exists; weights_only; a DCP folder's metadata vetted first
    note_other_data_settings(cfg, ckpt, subcommand)
    hparams = checkpoint_hparams(ckpt)
    hparams.pop("_instantiator", None)
    model = cfg.get("model")
    named = hparams.pop("_class_path", None)
    if named and model is not None and named != model.get("class_path"):
        # the config.yaml of the run that wrote it: <run>/checkpoints/x.ckpt, or a file beside it
        here = Path(ckpt).resolve().parent
        saved = next((f / "config.yaml" for f in (here, here.parent) if (f / "config.yaml").is_file()), None)
        fix = (
            f": --config {saved}"
            if saved
            else f", or --model {named} with its data module (distlab never imports a class a checkpoint names on its "
            "own)"
        )
        raise ConfigError(
            f"{ckpt!r} was written by {named}, but the config builds {model.get('class_path')}; give the config of "
            f"the run that wrote it{fix}"
        )
    init = model.get("init_args") if model is not None else None
    if not hparams or init is None:
        return config
    known = {k: v for k, v in hparams.items() if k in init and k not in typed}
    differ = [
        f"model.{k}={v!r} (config: {init.get(k)!r})"
        for k, v in known.items()
        if plain_value(init.get(k)) != plain_value(v)
    ]
    kept = [
        f"model.{k}={init.get(k)!r} (checkpoint: {hparams[k]!r})"
        for k in sorted(typed)
        if k in hparams and plain_value(init.get(k)) != plain_value(hparams[k])
    ]
    unknown = sorted(k for k in hparams if k not in init and not k.startswith("_"))
    if differ:
        rank_zero_info(f"distlab: from the checkpoint, differing from the config: {', '.join(differ)}")
    if kept:
        rank_zero_info(f"distlab: kept from the command line over the checkpoint: {', '.join(kept)}")
    if unknown:
        rank_zero_info(
            f"distlab: the checkpoint has settings {model.get('class_path')} does not take (ignored): {', '.join(unknown)}"
        )
    return parser.parse_object(
        {subcommand: {"model": {"class_path": model.get("class_path"), "init_args": known}}}, config
    )


def note_other_data_settings(cfg: Any, ckpt: str, subcommand: str) -> None:
    """Data settings other than those of the checkpoint's run are allowed, and said in one line (a resume then does
    not continue the data exactly; an evaluation may run on another set)."""
    saved = checkpoint_hparams(ckpt, "datamodule_hyper_parameters")
    data = cfg.get("data")
    init = data.get("init_args") if data is not None and hasattr(data, "get") else None
    if not saved or init is None:
        return
    differ = [
        f"data.{k}={init.get(k)!r} (checkpoint: {v!r})"
        for k, v in saved.items()
        if k in init and plain_value(init.get(k)) != plain_value(v)
    ]
    if differ and subcommand == "fit":
        rank_zero_info(
            f"distlab: note: resuming with other data settings than the checkpoint's run: {', '.join(differ)}; the "
            "data does not continue exactly where that run was"
        )
    elif differ:
        rank_zero_info(
            f"distlab: note: {subcommand} runs with other data settings than the checkpoint's run: {', '.join(differ)}; "
            "its data may differ from what that run evaluated on (a split drawn another way can hold samples the "
            "run trained on)"
        )


def _last_in_configured_folders(cfg: Any) -> Path | None:
    """:func:`newest_last` where the parsed config's checkpoints go (the run folder's checkpoints/, each
    ModelCheckpoint's dirpath)."""
    trainer = cfg.get("trainer") or {}
    root = Path(os.path.expanduser(str(trainer.get("default_root_dir") or ".")))
    folders = [root / "checkpoints"]
    callbacks = trainer.get("callbacks") or []
    for spec in callbacks if isinstance(callbacks, list) else [callbacks]:
        init = spec.get("init_args") if hasattr(spec, "get") else None
        dirpath = init.get("dirpath") if hasattr(init, "get") else None
        if dirpath:
            folders.append(Path(os.path.expanduser(str(dirpath))))
    return newest_last(folders)


def checkpoint_folders(trainer: L.Trainer) -> list[Path]:
    """Where the run's ModelCheckpoints write."""
    return [
        Path(cb.dirpath) if getattr(cb, "dirpath", None) else checkpoint_folder(trainer)
        for cb in trainer.checkpoint_callbacks
    ]


def resolve_for_run(trainer: L.Trainer, model: L.LightningModule, cfg: Any, subcommand: str) -> str | None:
    """``--ckpt_path`` once the Trainer exists: ``cfg["ckpt_path"]`` set to what Lightning loads, and the checkpoint
    it stands for returned. A sharded folder under another strategy is gathered into one file; the weights must fit
    the model; ``last`` is resolved; a resume must have steps left to train."""
    ckpt, gathered_from = cfg.get("ckpt_path"), None
    strategy = type(trainer.strategy).__name__
    folders = checkpoint_folders(trainer)
    if subcommand == "fit":
        for folder in folders:
            check_writable(folder, "the checkpoint folder", "make it writable, or set trainer.default_root_dir (or the "
                           "ModelCheckpoint's dirpath) to a folder you can write")  # fmt: skip
    # `last` of validate/test/predict: the fit's checkpoints in the same run folder
    elif (fit_folder := Path(str(trainer.default_root_dir)) / "checkpoints") not in folders:
        folders.append(fit_folder)
    if ckpt == "last" and not (subcommand == "fit" and restart_count() > 0):
        found = newest_last(folders)
        if found is None:
            shown = ", ".join(dict.fromkeys(str(f) for f in folders)) or "(no ModelCheckpoint)"
            raise ConfigError(f"--ckpt_path last: no last*.ckpt in {shown}; give the checkpoint's path")
        cfg["ckpt_path"] = ckpt = str(found)
    if ckpt and ckpt not in CKPT_ALIASES:
        check_intact(ckpt)
        if Path(ckpt).is_dir() and strategy != "FSDP2Strategy":
            # the sharded (FSDP2 / HSDP) folder's whole training state as one temporary Lightning checkpoint file,
            # removed at exit (the folder stays the user's checkpoint)
            fd, tmp = tempfile.mkstemp(prefix=f"{Path(ckpt).name}-", suffix=".consolidated.ckpt")
            os.close(fd)
            atexit.register(Path(tmp).unlink, missing_ok=True)
            gathered_from, ckpt = ckpt, str(consolidate_training_checkpoint(ckpt, tmp))
            cfg["ckpt_path"] = ckpt
            rank_zero_info(
                f"distlab: {Path(gathered_from)} is a sharded (FSDP2) checkpoint and the strategy is {strategy}: its weights "
                f"and optimizer state, gathered into {ckpt}"
            )
        check_weights_fit(model, ckpt)
        if subcommand == "fit":
            _steps_left(trainer, ckpt, folders)
    elif not ckpt and subcommand != "fit" and type(model).__module__.startswith("distlab."):
        raise ConfigError(
            f"distlab {subcommand} without --ckpt_path would run {type(model).__name__}'s freshly initialised weights; "
            "pass --ckpt_path to a checkpoint distlab fit wrote (e.g. runs/x/checkpoints/last.ckpt)"
        )
    return gathered_from or ckpt


def newest_last(folders: list[Path]) -> Path | None:
    """What ``--ckpt_path last`` means: the newest intact ``last*.ckpt`` in ``folders`` (Lightning writes
    last-v1.ckpt, ... beside an existing last.ckpt), else the newest intact checkpoint there (said), or None."""
    found = sorted(
        (p for f in folders if f.is_dir() for p in f.glob("last*.ckpt")), key=lambda p: p.stat().st_mtime
    )
    if not found:
        return None
    why = damage(found[-1])
    if why is None:
        return found[-1]
    intact = newest_checkpoint(folders)
    if intact is None:
        check_intact(found[-1])  # nothing intact to fall back on: refused, naming the damaged file
    rank_zero_info(
        f"distlab: {found[-1]} is damaged ({why}); resuming from {intact}, the newest intact checkpoint"
    )
    return intact


def _steps_left(trainer: L.Trainer, ckpt: str, folders: list[Path]) -> None:
    """A resume has steps left to train, and does not replace a newer ``last.ckpt`` of its own folder."""
    step = checkpoint_step(ckpt)
    if step is not None and trainer.max_steps > 0 and step >= trainer.max_steps:
        raise ConfigError(
            f"{ckpt!r} is at step {step}, and trainer.max_steps={trainer.max_steps}: nothing left to train; set "
            f"trainer.max_steps above {step} to continue it"
        )
    here = Path(ckpt).expanduser().resolve()
    for folder in folders:
        last = folder / "last.ckpt"
        if step is None or not last.is_file() or here.parent != folder.resolve() or here == last.resolve():
            continue
        newer = checkpoint_step(str(last))
        if newer is not None and newer > step:
            raise ConfigError(
                f"resuming from {here.name} (step {step}) in its own folder would replace {last} (step {newer}) at the "
                f"first save; resume from last.ckpt, or set trainer.default_root_dir to a new folder to branch off"
            )


def prepare_evaluation(trainer: L.Trainer, model: L.LightningModule, cfg: Any, subcommand: str) -> None:
    """validate/test/predict: each logger's folder writable before anything is written, and the checkpoint resolved
    (``last``: the fit's, where Lightning would look in the evaluation's own folder and find nothing)."""
    for logger in trainer.loggers:  # the evaluation's own log folder (<root>/validate ...), before a write
        try:
            folder = logger.log_dir
        except (OSError, AttributeError, NotImplementedError):  # it lists its root to pick a version
            folder = getattr(logger, "root_dir", None) or getattr(logger, "save_dir", None)
        if folder:
            check_writable(
                folder,
                f"{subcommand}'s log folder",
                "move what is there away, or set trainer.default_root_dir to another folder",
            )
            missing = [
                p for p in (Path(folder).absolute(), *Path(folder).absolute().parents) if not p.exists()
            ]
            if missing and this_run.created is None:  # what a refusal from here on removes (nothing else)
                this_run.created = missing[-1]
    resolve_for_run(trainer, model, cfg, subcommand)
