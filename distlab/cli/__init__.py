"""The ``distlab`` command: LightningCLI for fit/validate/test/predict, plus ``generate``, ``export`` and ``prepare``.

    distlab fit --config configs/demo_cpu.yaml --config configs/trainer/ddp_spawn_cpu.yaml
    distlab validate --config configs/demo_cpu.yaml --ckpt_path runs/demo/checkpoints/last.ckpt
    torchrun --standalone --nproc_per_node=2 -m distlab fit --config configs/demo_cpu.yaml
    distlab generate --ckpt_path runs/demo/checkpoints/last.ckpt --prompt "def " --max_new_tokens 200

Any LightningModule / LightningDataModule (``model: {class_path: my_pkg.MyModule, init_args: {...}}``); the GPT and
its text data are the defaults. What each submodule does: docs/architecture.md, "Where each file lives".
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import jsonargparse
import lightning
import torch
import torchmetrics
from lightning.pytorch.utilities.exceptions import SIGTERMException

import distlab
from distlab.callbacks import preemption
from distlab.cli import parser_types  # noqa: F401  (registers distlab's domains with jsonargparse)
from distlab.cli.errors import is_stop_signal, report, report_stop
from distlab.cli.run_folder import remove_failed_start, this_run
from distlab.errors import ConfigError
from distlab.log import VERBOSE_ENV, silence_moot_messages
from distlab.switches import DEBUG_ENV, check_switches, switch_on

__all__ = ["LAUNCH_ENV", "launch_env_restored", "main", "run_cli", "say_error"]


def run_cli(args: list[str] | None = None) -> Any:
    """Run ``distlab fit|validate|test|predict`` in this process and return the CLI (``.trainer``, ``.model``); the
    launch environment a run writes is undone afterwards, so a notebook can call it again."""
    from distlab.cli.app import make_cli

    torch.set_float32_matmul_precision("high")
    with launch_env_restored():
        return make_cli(args)


def say_error(line: str) -> None:
    """Print the one line; under torchrun also write it as this rank's error (torchrun's root cause)."""
    print(f"distlab: error: {line}", file=sys.stderr)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        message = json.dumps({"message": f"distlab: error: {line}", "timestamp": int(time.time())})
        with suppress(OSError):
            Path(error_file).write_text(message)


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``distlab`` console script (``args``: for tests and notebooks). Whatever fails ends in one
    line on stderr and a non-zero exit status (:mod:`distlab.cli.errors`)."""
    from distlab.cli.commands import FUNCTION_COMMANDS, run_function_command

    argv = sys.argv[1:] if args is None else [os.fspath(a) for a in args]
    if argv in (["--version"], ["-V"]):  # what a bug report asks for first
        print(version_line())
        return
    stops = {"SIGTERMException": SIGTERMException, "KeyboardInterrupt": KeyboardInterrupt}
    this_run.folder, this_run.created, preemption.stopped_by, preemption.stop_note = None, None, None, ""
    silence_moot_messages()
    try:
        switch = check_switches((DEBUG_ENV, VERBOSE_ENV))
        if switch is not None:
            raise ConfigError(switch)
        if argv and argv[0] in FUNCTION_COMMANDS:
            run_function_command(argv[0], argv[1:])
        else:
            run_cli(args)  # None: LightningCLI reads sys.argv itself; the launch environment is restored
        if preemption.stopped_by is not None:  # the ranks agreed on a stop signal, saved, and ended
            raise stops[preemption.stopped_by]()
    except SystemExit as e:
        stop: BaseException = e
        if preemption.stopped_by == "KeyboardInterrupt":  # Lightning's own exit(1) after Ctrl-C
            stop = KeyboardInterrupt()
        elif preemption.stopped_by == "SIGTERMException" and e.code not in (0, None):
            stop = SIGTERMException()
        elif not is_stop_signal(e):
            raise  # --help, and the exits asked for
        _exit(*report_stop(stop, this_run.folder))
    except KeyboardInterrupt as e:
        _exit(*report_stop(e, this_run.folder))
    except BaseException as e:  # Exception, and the BaseExceptions torch raises (DCP's CheckpointException)
        if preemption.stopped_by is not None and type(e).__name__.startswith("Process"):
            # a rank ended by the stop this process passed on before it could catch it (it was starting)
            _exit(*report_stop(stops[preemption.stopped_by](), this_run.folder))
        line, code = report(e, this_run.folder)
        if switch_on(DEBUG_ENV):  # the traceback; a refused input still ends in its one line and exit 2
            if code != 2:
                raise
            traceback.print_exception(e)
        remove_failed_start(this_run.created, refused=code == 2)
        _exit(line, code)


def _exit(line: str, code: int) -> None:
    say_error(line)
    sys.exit(code)


def version_line() -> str:
    """``distlab --version``: distlab's version and those of what it runs on."""
    cuda = f", CUDA {torch.version.cuda}" if torch.version.cuda else ", CPU build"
    return (
        f"distlab {distlab.__version__} (torch {torch.__version__}{cuda}, lightning {lightning.__version__}, "
        f"torchmetrics {torchmetrics.__version__}, jsonargparse {jsonargparse.__version__}, python "
        f"{sys.version.split()[0]})"
    )


# Set in os.environ by a Lightning run in this process (its subprocess launcher and DDP set-up write them).
LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "RANK")


@contextmanager
def launch_env_restored():
    """Undo what a run wrote of the launch environment, so a second ``main()`` in the same process starts its own
    job (a leftover LOCAL_RANK makes Lightning believe an external launcher started it)."""
    saved = {k: os.environ.get(k) for k in LAUNCH_ENV}
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


if __name__ == "__main__":
    main()
