"""How every failure of a ``distlab`` command reaches the user: one line, an exit status, the full story in a file
(the exit statuses and lines: TROUBLESHOOTING.md, "Reading a distlab error"). Refused input (exit 2) is a
ConfigError, the parser's errors and Lightning's own errors about what it was given, in Lightning's words. A
``*_spawn`` rank's error comes back as the text of torch's ``ProcessRaisedException``, read the same way.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import sys
import sysconfig
import tempfile
import traceback
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentError

from distlab.callbacks import preemption
from distlab.checkpoint import checkpoint_step, newest_checkpoint
from distlab.domains import DOMAINS, refusal
from distlab.errors import ConfigError, DistlabError


def first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def find_in_chain(e: BaseException | None, match: Any) -> BaseException | None:
    """The first exception in ``e``'s cause/context chain that is one of the types ``match`` (or satisfies it)."""
    test = match if callable(match) else lambda x: isinstance(x, match)  # (a tuple of types is not callable)
    seen = set()
    while e is not None and id(e) not in seen:
        if test(e):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


# ---- the parser's errors: one translation ----------------------------------------------------------------------
_KEY = re.compile(r'Parser key "([^"]+)"')
_GIVEN = re.compile(r"Given value: (.*)$", re.M)
_DOMAIN = re.compile(r"Not of type (\w+): '(.*?)' ")


def parser_error_line(message: str) -> str:
    """jsonargparse's error as one line: ``key=value is not accepted; set key to <its declared domain>`` when the
    key's type is one of distlab's domains (the innermost refusal, the nested keys joined: ``model.weight_decay``);
    else the key and the parser's most specific line."""
    key = ".".join(_KEY.findall(message))
    refused = list(_DOMAIN.finditer(message))
    named = {d.__name__: d for d in DOMAINS}
    if key and refused and refused[-1].group(1) in named:
        return refusal(key, refused[-1].group(2), named[refused[-1].group(1)])
    lines = [ln.strip().removeprefix("- ") for ln in message.splitlines() if ln.strip()]
    noise = ("Does not validate against any", "Subtypes:", "Errors:", "Parser key", "Given value", "Problem with given",
             "Expected a <class 'NoneType'>")  # fmt: skip
    specific = [ln for ln in lines if not ln.startswith(noise)]
    given = [g.strip() for g in _GIVEN.findall(message)]
    nested = re.match(r"^NestedArg\(key='([^']*)', val='(.*)'\)$", given[-1]) if given else None
    if nested:  # --model.lr=-1: the option of the model's class, with its value
        inner = nested.group(1)
        key = key if key.endswith(f".{inner}") or key == inner else f"{key}.{inner}" if key else inner
        given[-1] = nested.group(2)
    said = (specific[-1] if specific else lines[0] if lines else message).rstrip(":")
    said = re.sub(r"\. Got value: .*$", "", re.sub(r"<class '([\w.]+)'>", r"\1", said))
    said = re.sub(r"Expected a typing\.Literal\[(.*)\]", r"expected one of \1", said).replace(
        "Expected a", "expected a"
    )
    value = f"={given[-1]}" if given else ""
    return f"{key}{value}: {said} (see --help)" if key else f"{said} (see --help)"


# ---- Lightning's errors about what it was given ------------------------------------------------------------------
def _raised_by_a_lightning_check(x: BaseException) -> bool:
    frames = list(traceback.walk_tb(x.__traceback__))
    code = frames[-1][0].f_code if frames else None  # where it was raised
    return (
        isinstance(x, Exception)
        and code is not None
        and "/lightning/" in code.co_filename.replace("\\", "/")
        and re.match(r"_+(validate|verify|check)_", code.co_name) is not None
    )


def refused_line(e: BaseException) -> tuple[str, int] | None:
    """(line, exit status) for refused input and agreed stops, directly or in a spawned rank's text; else None."""
    found = find_in_chain(e, (ConfigError, DistlabError))
    if found is not None:
        return first_line(found), 2 if isinstance(found, ConfigError) else 1
    if user_code_location(e) is not None:  # the user's own class failed (perhaps wrapped): a bug
        return None
    parser_error = find_in_chain(e, (ArgumentError,))
    if parser_error is not None:
        return parser_error_line(str(parser_error)), 2
    lightning = find_in_chain(e, lambda x: type(x).__name__ == "MisconfigurationException")
    lightning = lightning or find_in_chain(e, _raised_by_a_lightning_check)
    if lightning is not None:
        return f"{type(lightning).__name__}: {first_line(lightning)}", 2
    # a Lightning callback's setup / on_fit_start that asks the module for what it lacks (BackboneFinetuning's
    # backbone): refused input, said before the first step
    for frame, _ in traceback.walk_tb(e.__traceback__):
        path = frame.f_code.co_filename.replace("\\", "/")
        if "/lightning/pytorch/callbacks/" in path and frame.f_code.co_name in ("setup", "on_fit_start"):
            owner = frame.f_locals.get("self")
            callback = type(owner).__name__ if owner is not None else Path(path).stem
            return f"{callback} cannot work with this module: {type(e).__name__}: {first_line(e)}", 2
    for line in reversed(str(e).splitlines()):  # a spawned rank's traceback text
        m = _RAISED.match(line.strip())
        code = _refused_by_name().get(m.group(1).rsplit(".", 1)[-1]) if m else None
        if code is not None:
            return m.group(2), code
    return None


@functools.cache
def _refused_by_name() -> dict[str, int]:
    """{class name: exit status} of the errors that mean refused input (2) or an agreed stop (1), among them the
    DistlabError subclasses distlab.callbacks (imported above) defines."""

    def below(cls: type) -> list[type]:
        return [cls, *(c for sub in cls.__subclasses__() for c in below(sub))]

    return {**{c.__name__: 1 for c in below(DistlabError)}, **{c.__name__: 2 for c in below(ConfigError)},
            "MisconfigurationException": 2}  # fmt: skip


_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): (.+)$")


# ---- the last line of defence ------------------------------------------------------------------------------------
def save_traceback(e: BaseException, run_folder: str | os.PathLike | None) -> Path:
    """Write ``e``'s full traceback (a spawned rank's is in its text) where the user will find it."""
    text = "".join(traceback.format_exception(e))
    rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"
    name = "error.log" if rank == "0" else f"error-rank{rank}.log"
    if run_folder is not None and Path(run_folder).is_dir():
        with contextlib.suppress(OSError):
            (Path(run_folder) / name).write_text(text)
            return Path(run_folder) / name
    fd, tmp = tempfile.mkstemp(prefix="distlab-error-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return Path(tmp)


def report(e: BaseException, run_folder: str | os.PathLike | None) -> tuple[str, int]:
    """The one line (without ``distlab: error:``) and the exit status for any exception a command raised."""
    refused = refused_line(e)
    if refused is not None:
        return refused
    saved = save_traceback(e, run_folder)
    kind, what = _innermost(e)
    full = find_in_chain(e, lambda x: isinstance(x, OSError) and x.errno == errno.ENOSPC)
    if full is not None or "No space left on device" in what:
        where = getattr(full, "filename", None) or run_folder or "the output folder"
        said = "No space left on device; free space there, or write to another disk"
        return f"writing {where} failed: {said} (full traceback: {saved})", 1
    killed = re.search(r"process (\d+) terminated with signal (\w+)", what)
    if kind == "ProcessExitedException" and killed:  # a spawned rank ended by a signal, not by its code
        return (
            f"rank {killed.group(1)} was stopped by {killed.group(2)} (the out-of-memory killer, or kill) and the other "
            f"ranks were ended with it; resume from the last checkpoint with --ckpt_path (full traceback: {saved})"
        ), 1
    # torch's words for a mistake in the user's module (raised after it returned), and the user's line if their
    # own class failed (not distlab's); else an internal error
    where = user_code_location(e)
    said = [why for words, why in USER_CODE_CAUSES if words in what][:1]
    said += [f"raised in your code, {where}"] if where is not None else [] if said else ["an internal error"]
    return f"{kind}: {what} ({'; '.join(said)}; full traceback: {saved})", 1


# torch's words for a mistake in the user's module, often raised after their code returned (inside backward)
USER_CODE_CAUSES = (
    ("optimizer got an empty parameter list", "configure_optimizers gave an optimizer no parameters: every parameter "
     "it was given is frozen (requires_grad=False), or a filter kept none; unfreeze what should train"),
    ("pickle", "the spawn presets send the module and its data to each rank by pickling them, and this object cannot "
     "be pickled (a lambda, a nested function, an open file); define it at module level, or launch with torchrun"),
    ("does not require grad and does not have a grad_fn", "most likely in your code: the loss training_step returned "
     "is cut off from the parameters (.detach(), .item(), torch.no_grad(), or only frozen parameters)"),
)  # fmt: skip


def _innermost(e: BaseException) -> tuple[str, str]:
    """(type, message) of what really failed: a spawned rank's last exception line, or the chain's origin."""
    text = str(e)
    if "terminated with the following error" in text:
        for line in reversed(text.splitlines()):
            m = _RAISED.match(line.strip())
            if m:
                return f"{m.group(1).rsplit('.', 1)[-1]} on a rank", m.group(2)
    origin = find_in_chain(e, lambda x: (x.__cause__ or x.__context__) is None) or e  # (a cycle: e)
    message = re.sub(r"\[[^\[\]]{40,}\]", "[...]", " ".join(str(origin).split()) or type(origin).__name__)
    return type(origin).__name__, message if len(message) <= 360 else f"{message[:177]} ... {message[-178:]}"


def user_code_location(e: BaseException) -> str | None:
    """``file:line in function`` where ``e`` (or an exception in its chain) was raised, if by code outside distlab,
    its dependencies and Python's library (the user's class); None otherwise."""
    library = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "purelib", "platlib")}
    library |= {Path(m.__file__).resolve().parent for m in list(sys.modules.values())  # (torch.ops: a bare name)
                if m.__name__ in _DEPENDENCIES and os.path.isabs(getattr(m, "__file__", None) or "")}  # fmt: skip
    ours = Path(__file__).resolve().parents[1]
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, SyntaxError) and e.filename and Path(e.filename).suffix == ".py":
            path = Path(e.filename).resolve()
            if ours not in path.parents and not any(lib in path.parents for lib in library):
                return f"{path}:{e.lineno} (a syntax error)"
        # from where it was raised outwards: the first frame not a library's decides
        for frame, line in reversed(list(traceback.walk_tb(e.__traceback__))):
            path = Path(frame.f_code.co_filename).resolve()
            if path.suffix != ".py" or any(lib in path.parents for lib in library):
                continue
            if ours not in path.parents:
                return f"{path}:{line} in {frame.f_code.co_name}"
            break
        e = e.__cause__ or e.__context__
    return None


_DEPENDENCIES = ("torch", "lightning", "lightning_utilities", "torchmetrics", "jsonargparse", "numpy", "yaml",
                 "safetensors", "typing_extensions", "fsspec", "torchdata", "matplotlib")  # fmt: skip


def is_stop_signal(e: BaseException) -> bool:
    """Lightning ends a run that received SIGTERM with its SIGTERMException (a SystemExit)."""
    return type(e).__name__ == "SIGTERMException"


def report_stop(e: BaseException, run_folder: str | os.PathLike | None) -> tuple[str, int]:
    """A run stopped from outside (SIGTERM, Ctrl-C): what was saved, and the shell's status for it (143, 130)."""
    signal, code = ("SIGTERM", 143) if is_stop_signal(e) else ("Ctrl-C (SIGINT)", 130)
    saved = preemption.stop_note
    if not saved and run_folder is not None:  # the launching process of spawned ranks: they saved it
        newest = newest_checkpoint([Path(run_folder) / "checkpoints", Path(run_folder)])
        if newest is not None:
            saved = f"saved {newest} at step {checkpoint_step(newest)}"
    if not saved or saved.endswith("nothing was saved"):
        return f"stopped by {signal}: {saved or 'nothing was saved'} (no checkpoint to resume from)", code
    return f"stopped by {signal}: {saved}; resume with --ckpt_path to continue", code
