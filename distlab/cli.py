"""The ``distlab`` command: LightningCLI for fit/validate/test, plus ``generate`` and ``export``.

    distlab fit --config configs/demo_cpu.yaml
    distlab fit --config configs/debug.yaml --config configs/trainer/ddp_spawn_cpu.yaml
    distlab fit --config configs/demo_cpu.yaml --print_config
    distlab validate --config configs/demo_cpu.yaml --ckpt_path runs/demo/checkpoints/last.ckpt
    torchrun --standalone --nproc_per_node=2 -m distlab fit --config configs/demo_cpu.yaml
    distlab generate --ckpt_path runs/demo/checkpoints/last.ckpt --prompt "def " --max_new_tokens 200
    distlab export --ckpt_path runs/demo/checkpoints/last.ckpt --out demo.safetensors
    distlab generate --ckpt_path demo.safetensors --prompt "def "

Any LightningModule / LightningDataModule (LightningCLI subclass mode): the GPT and its text data are
the defaults, so a recipe may give only their arguments (``model: {depth: 4}``); another model is
``model: {class_path: my_pkg.MyModule, init_args: {...}}`` or ``--model my_pkg.MyModule``.
``distlab fit --model.help distlab.modules.GPTLightningModule`` lists a module's arguments.

Configuration errors print one line (``distlab: error: ...``) and exit with status 2.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from distlab.cli_errors import debug_requested, is_stop_signal, one_line_error, report, report_stop
from distlab.command_line import check_subcommand, check_text_arguments
from distlab.commands import FUNCTION_COMMANDS, run_function_command
from distlab.errors import ConfigError, abbreviated
from distlab.lightning_cli import DistlabCLI, SaveConfigKeepingEarlier, random_seed
from distlab.log import VERBOSE_ENV, silence_moot_messages
from distlab.preflight import check_seed_env
from distlab.run_files import remove_failed_start, this_run
from distlab.switches import DEBUG_ENV, check_switches

__all__ = ["DistlabCLI", "LAUNCH_ENV", "launch_env_restored", "main", "random_seed", "run_cli", "say_error"]


def _parser_kwargs() -> dict[str, Any]:
    """Every parser raises on bad input (we print one line) instead of printing a usage wall."""
    kwargs: dict[str, Any] = {"exit_on_error": False}
    if importlib.util.find_spec("omegaconf"):
        kwargs["parser_mode"] = "omegaconf"
    top = {
        **kwargs,
        "description": "distlab: train and evaluate a LightningModule on any number of ranks; sample from or "
        "export a checkpoint; prepare token shards. Each subcommand lists its options: distlab SUBCOMMAND --help.",
    }
    return {**top, **{sub: dict(kwargs) for sub in ("fit", "validate", "test", "predict")}}


def run_cli(args: list[str] | None = None) -> DistlabCLI:
    """Run ``distlab fit|validate|test|predict`` in this process and return the CLI (``.trainer``, ``.model``).

    The launch environment a run writes (MASTER_PORT, LOCAL_RANK, ...) is undone afterwards, so a notebook
    can call it again."""
    torch.set_float32_matmul_precision("high")
    with launch_env_restored():
        return _make_cli(args)


def _make_cli(args: list[str] | None) -> DistlabCLI:
    from distlab import compat

    compat.int_before_float(compat.lightning_init_functions())  # --trainer.limit_train_batches=2 stays an int
    return DistlabCLI(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_callback=SaveConfigKeepingEarlier,
        save_config_kwargs={"overwrite": True},
        parser_kwargs=_parser_kwargs(),
        args=args,
        auto_configure_optimizers=False,
    )


def say_error(line: str) -> None:
    """Print the one line; under torchrun also hand it to torchrun as this rank's error, so the failure summary
    torchrun prints names it as the root cause (instead of "To enable traceback see: ...")."""
    print(f"distlab: error: {line}", file=sys.stderr)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        import json
        import time

        try:
            Path(error_file).write_text(
                json.dumps({"message": f"distlab: error: {line}", "timestamp": int(time.time())})
            )
        except OSError:
            pass  # torchrun then says what it says without it; the line above is printed either way


def argument_list(args: Any, caller: str) -> list[str] | None:
    """``args`` as given to a ``main(args)`` from Python: a list of strings (paths taken as their text); one string
    (which would be read a character at a time) or another item is a TypeError that shows the call to write."""
    if args is None:
        return None
    if isinstance(args, (str, bytes)):
        text = args.decode(errors="replace") if isinstance(args, bytes) else args
        raise TypeError(
            f"{caller} takes the arguments as a list, not one string: {caller}(shlex.split({abbreviated(text, 60)!r}))"
        )
    out = []
    for item in args:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(
                f"{caller} takes a list of strings, and {item!r} is not one ({type(item).__name__}): write it as "
                f"text ({str(item)!r})"
            )
        out.append(os.fspath(item))
    return out


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``distlab`` console script; ``args`` lets tests and notebooks call it.

    Whatever fails ends in one line on stderr and a non-zero exit (:mod:`distlab.cli_errors`): 2 for refused
    input, 1 for a stop the ranks agreed on or an internal error (its traceback saved to the run folder's
    ``error.log`` or a temporary file), 143 / 130 for a run stopped by SIGTERM / Ctrl-C (its finished steps
    saved first); ``DISTLAB_DEBUG=1`` shows the traceback instead."""
    from distlab.callbacks import preemption

    args = argument_list(args, "distlab.cli.main")
    argv = sys.argv[1:] if args is None else args
    if argv in (["--version"], ["-V"]):  # what a bug report asks for first
        print(version_line())
        return
    this_run.folder, this_run.created, preemption.stopped_by, preemption.stop_note = None, None, None, ""
    silence_moot_messages()
    try:
        check_text_arguments(argv)
        switch = check_switches((DEBUG_ENV, VERBOSE_ENV))
        if switch is not None:
            raise ConfigError(switch)
        check_subcommand(argv)
        check_seed_env()
        with launch_env_restored():
            if argv and argv[0] in FUNCTION_COMMANDS:
                run_function_command(argv[0], argv[1:])
            else:
                run_cli(args)  # None: LightningCLI reads sys.argv itself
        if preemption.stopped_by == "SIGTERMException":  # the ranks agreed on a stop signal, saved, and ended
            raise SIGTERMException()
        if preemption.stopped_by == "KeyboardInterrupt":
            raise KeyboardInterrupt()
    except SystemExit as e:
        stop: BaseException = e
        if preemption.stopped_by == "KeyboardInterrupt":  # Lightning's own exit(1) after Ctrl-C
            stop = KeyboardInterrupt()
        elif preemption.stopped_by == "SIGTERMException" and e.code not in (
            0,
            None,
        ):  # (a stop while ranks start)
            stop = SIGTERMException()
        elif not is_stop_signal(e):
            raise  # --help, and the exits this function itself asks for
        line, code = report_stop(stop, this_run.folder)
        say_error(line)
        sys.exit(code)
    except KeyboardInterrupt as e:
        line, code = report_stop(e, this_run.folder)
        say_error(line)
        sys.exit(code)
    except BaseException as e:  # Exception, and the BaseExceptions torch raises (DCP's CheckpointException)
        if debug_requested():  # the traceback; a refused input still ends in its one line and exit 2
            refused = one_line_error(e, argv, FUNCTION_COMMANDS.get(argv[0]) if argv else None)
            if refused is None or refused[1] != 2:
                raise
            traceback.print_exception(e)
            remove_failed_start(this_run.created, refused=True)
            say_error(refused[0])
            sys.exit(2)
        if preemption.stopped_by is not None and type(e).__name__.startswith("Process"):
            # a rank ended by the stop this process passed on before it could catch it (it was starting)
            stop = SIGTERMException() if preemption.stopped_by == "SIGTERMException" else KeyboardInterrupt()
            line, code = report_stop(stop, this_run.folder)
            say_error(line)
            sys.exit(code)
        line, code = report(e, argv, this_run.folder, FUNCTION_COMMANDS.get(argv[0]) if argv else None)
        remove_failed_start(this_run.created, refused=code == 2)
        say_error(line)
        sys.exit(code)


def version_line() -> str:
    """``distlab --version``: distlab's version and those of what it runs on."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    cuda = f", CUDA {torch.version.cuda}" if torch.version.cuda else ", CPU build"
    return (
        f"distlab {version('distlab')} (torch {torch.__version__}{cuda}, lightning {L.__version__}, torchmetrics "
        f"{version('torchmetrics')}, jsonargparse {version('jsonargparse')}, python {sys.version.split()[0]})"
    )


# Set in os.environ by a Lightning run in this process (its subprocess launcher and DDP set-up write them).
LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "RANK")


@contextmanager
def launch_env_restored():
    """Undo what a run wrote of the launch environment, so a second ``main()`` in the same process (a
    notebook, the tests) starts its own job: a leftover LOCAL_RANK makes Lightning believe an external
    launcher started the processes, and a 2-device run then waits forever for a rank nobody launches."""
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
