"""How every failure of a ``distlab`` command reaches the user: one line, an exit status, and the full story in a file.

- Refused input (:class:`~distlab.errors.ConfigError`, the parser's errors, Lightning's errors about the
  user's settings): ``distlab: error: <what>, <the value seen>; <what to set>`` and exit 2.
- A stop every rank agreed on (:class:`~distlab.errors.DistlabError`: a NaN loss, a failed evaluation): one
  line and exit 1.
- Anything else (a bug, or a failure nobody foresaw): ``distlab: error: <type>: <first line> (full traceback:
  <file>)`` and exit 1. The traceback is saved to the run folder's ``error.log`` when the run folder exists
  (``error-rank<N>.log`` on other ranks), else to a temporary file. ``DISTLAB_DEBUG=1`` re-raises instead,
  so the traceback prints as Python's.

Errors raised in ``ddp_spawn`` children come back as the text of a ``ProcessRaisedException``; the markers
below find distlab's and Lightning's errors in that text.
"""

from __future__ import annotations

import importlib
import os
import re
import tempfile
import traceback
import typing
from pathlib import Path
from typing import Any

from distlab.errors import ConfigError, DistlabError
from distlab.switches import DEBUG_ENV, switch_on

# Lightning's errors about the user's settings that surface only once training runs (a monitored metric that
# is never logged): (exception class name, text in its message).
LIGHTNING_SETTING_ERRORS = (
    # Lightning raises MisconfigurationException for settings that do not fit together (any of its messages)
    ("MisconfigurationException", ""),
    ("RuntimeError", "Early stopping conditioned on metric"),
    ("RuntimeError", "Found more than one stateful callback"),
)


def first_line(e: BaseException) -> str:
    """The line of ``e``'s message that says what went wrong: its first, or, for jsonargparse's "Does not validate
    against any of the Union subtypes", the one specific error among the alternatives it tried."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if lines and lines[0].startswith("Does not validate against any of the Union subtypes"):
        specific = [
            i
            for i, ln in enumerate(lines)
            if ln.startswith("- ")
            and not ln.startswith(
                ("- Expected a <class", "- Expected a typing", "- Does not validate against any of the Union")
            )
        ]
        if specific:
            i = specific[0]
            line = lines[i].removeprefix("- ")
            if line.endswith(":") and i + 1 < len(lines):  # "Problem with given class_path 'X':" + the reason
                line = f"{line} {lines[i + 1].removeprefix('- ')}"
            return line
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[1]}"
    return lines[0] if lines else type(e).__name__


def find_in_chain(e: BaseException | None, match: Any) -> BaseException | None:
    """The first exception in ``e``'s cause/context chain that is one of the types ``match`` (or satisfies it)."""
    test = match if callable(match) and not isinstance(match, tuple) else lambda x: isinstance(x, match)
    seen = set()
    while e is not None and id(e) not in seen:
        if test(e):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


# Lightning's messages about a setting that do not say what to set: the same fact, with the setting to change.
LIGHTNING_IN_OUR_WORDS = (
    (
        re.compile(r"Found more than one stateful callback of type `(\w+)`"),
        lambda m: (
            f"trainer.callbacks lists {m.group(1)} twice with the same settings, so their saved states would "
            "overwrite each other in a checkpoint; keep one (or give the two different settings)"
        ),
    ),
    (
        re.compile(r"`Trainer\(devices=(.+?)\)` value is not a valid input using (\w+) accelerator"),
        lambda m: (
            f"trainer.devices={m.group(1)} is not accepted on the {m.group(2)} accelerator; set trainer.devices "
            "to a number of processes >= 1, a list of device indices, or auto"
        ),
    ),
    (
        re.compile(r"`devices` selected with `(\w+?)(?:Accelerator)?` should be an int > 0"),
        lambda m: (
            f"trainer.devices is not accepted on the {m.group(1)} accelerator (-1, every device, is for GPUs); set "
            "trainer.devices to a number of processes >= 1, or auto"
        ),
    ),
    (
        re.compile(r"ModelCheckpoint\(save_top_k=(-?\d+), monitor=None\) is not a valid configuration"),
        lambda m: (
            f"ModelCheckpoint(save_top_k={m.group(1)}) keeps the best {m.group(1)} checkpoints by a metric, and it "
            "has no monitor; set trainer.callbacks.monitor to a logged metric (val_loss, with mode min), or "
            "save_top_k to 1 (the latest) or -1 (every one)"
        ),
    ),
    (
        re.compile(r"SWA with `swa_epoch_start` as a float is not supported when `max_epochs=-1`"),
        lambda m: (
            "StochasticWeightAveraging's swa_epoch_start is a share of max_epochs by default (0.8), and a fit bounded "
            "by max_steps has no max_epochs; set trainer.callbacks.swa_epoch_start to an epoch number (on distlab's "
            "endless text stream no epoch after the first ever starts: use EMAWeightAveraging, which averages by step)"
        ),
    ),
)


def in_our_words(line: str) -> str:
    """Lightning's message about a setting, said with the setting to change where it does not say it."""
    for pattern, words in LIGHTNING_IN_OUR_WORDS:
        m = pattern.search(line)
        if m:
            return words(m)
    return line


def _is_lightning_setting_error(e: BaseException) -> bool:
    return any(type(e).__name__ == name and text in str(e) for name, text in LIGHTNING_SETTING_ERRORS)


def subclasses(cls: type) -> list[type]:
    """``cls`` and every subclass imported so far (distlab's callbacks, which define error classes, included)."""
    import distlab.callbacks  # noqa: F401  (defines the DistlabError subclasses)

    out = [cls]
    for sub in cls.__subclasses__():
        out += subclasses(sub)
    return out


def _raising_code(e: BaseException) -> Any:
    """The code object of the frame that raised ``e`` (its traceback's innermost), or None."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code if tb is not None else None


def _lightning_callback_raising(e: BaseException, innermost: bool) -> str | None:
    """The Lightning callback (its class name) whose hook raised ``e``: the innermost frame of
    ``lightning/pytorch/callbacks/`` in the traceback, and (``innermost``) the frame that raised is Lightning's own
    code (the callback's, or the tuner or utility it called); else None."""
    tb, callback, last = e.__traceback__, None, ""
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        last = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if "/lightning/pytorch/callbacks/" in last and owner is not None:
            callback = type(owner).__name__
        tb = tb.tb_next
    if innermost and "/lightning/" not in last:
        return None
    return callback


def _a_callback_refuses_the_settings(e: BaseException) -> str | None:
    """A Lightning callback refusing what it was given, when the fit starts: its own settings against the Trainer's
    (GradientAccumulationScheduler with accumulate_grad_batches), or an attribute the user's module lacks
    (BackboneFinetuning's ``backbone``). Those checks run in the callback's hooks, after parsing; they are the user's
    input, not a bug (exit 2)."""
    found = find_in_chain(e, (AttributeError, ValueError, TypeError, NotImplementedError))
    m = re.match(r"'(\w+)' object has no attribute '(\w+)'", str(found))
    callback = _lightning_callback_raising(found, innermost=m is None) if found is not None else None
    if callback is None:
        return None
    if isinstance(found, NotImplementedError):  # a base class given as the callback
        code = _raising_code(found)
        hook = code.co_name if code is not None else "a method"
        return (
            f"the callback {callback} is a base class: its {hook} is left to a subclass to write; subclass it with "
            f"your own {hook}, or use a ready-made callback of its kind"
        )
    if m:
        return (
            f"the callback {callback} needs the module to have `{m.group(2)}`, and {m.group(1)} has none; remove "
            f"{callback} from trainer.callbacks, or give the module a `{m.group(2)}` attribute"
        )
    return (
        f"the callback {callback} refuses its settings: {first_line(found)} (change them, or remove {callback} "
        "from trainer.callbacks)"
    )


def _a_lightning_check_refuses(e: BaseException) -> str | None:
    """An error raised by one of Lightning's own checks of what it was given (a function named ``_validate_*``,
    ``_verify_*`` or ``_check_*`` in Lightning's code: ``training_step(..., optimizer_idx)`` under automatic
    optimization), whatever its class: the user's module or settings, not a bug."""

    def raised_by_a_check(x: BaseException) -> bool:
        code = _raising_code(x)
        return (
            isinstance(x, Exception)
            and code is not None
            and "/lightning/" in code.co_filename.replace("\\", "/")
            and re.match(r"_+(validate|verify|check)_", code.co_name) is not None
        )

    found = find_in_chain(e, raised_by_a_check)
    return f"{type(found).__name__}: {first_line(found)}" if found is not None else None


def one_line_error(
    e: BaseException, argv: list[str] | None = None, command: Any = None
) -> tuple[str, int] | None:
    """(message, exit code) for distlab's own errors, the parser's and Lightning's about the user's settings,
    directly or inside a spawn child's traceback text; None for anything else (an internal error)."""
    from jsonargparse import ArgumentError

    found = find_in_chain(e, (ConfigError, DistlabError))
    if isinstance(found, ConfigError):
        return first_line(found), 2
    if isinstance(found, DistlabError):
        return first_line(found), 1
    parser_error = find_in_chain(e, (ArgumentError,))
    if parser_error is not None:
        return explain_argument_error(str(parser_error), argv or [], command), 2
    needs = _a_callback_refuses_the_settings(e) or _a_lightning_check_refuses(e)
    if needs is not None:
        return needs, 2
    no_cuda = find_in_chain(
        e,
        lambda x: any(
            t in str(x) for t in ("Torch not compiled with CUDA enabled", "Found no NVIDIA driver")
        ),
    )
    if (
        no_cuda is not None
    ):  # a GPU-only setting (a profiler's emit_nvtx, a cuda device) on a machine without CUDA
        return (
            f"{type(no_cuda).__name__}: {first_line(no_cuda)}: a setting asks for CUDA (an NVIDIA GPU), and this "
            "machine's torch has none; turn the GPU-only setting off here (e.g. a profiler's emit_nvtx)"
        ), 2
    lightning = find_in_chain(e, _is_lightning_setting_error)
    if lightning is not None:
        return in_our_words(f"{type(lightning).__name__}: {first_line(lightning)}"), 2
    # A spawn child's error arrives as traceback text: its last line names the class (with its module)
    markers = [(f"{cls.__module__}.{cls.__name__}: ", 2) for cls in subclasses(ConfigError)]
    markers += [(f"{cls.__module__}.{cls.__name__}: ", 1) for cls in subclasses(DistlabError)]
    for line in reversed(str(e).splitlines()):
        for marker, code in markers:
            if line.startswith(marker):
                return line[len(marker) :], code
        for name, text in LIGHTNING_SETTING_ERRORS:
            m = re.match(rf"(?:[\w.]+\.)?{name}: (.*)", line)
            if m and text in m.group(1):
                return in_our_words(f"{name}: {m.group(1)}"), 2
    return None


# ---- the parser's errors -------------------------------------------------------------------------------------
_KEY = re.compile(r'Parser key "([^"]+)"')
_CLASS = re.compile(r"Problem with given class_path '([^']+)'")
_GIVEN = re.compile(r"^Given value: (.*)$")
_NOT_OF_TYPE = re.compile(r"^Not of type \w+: (.*?) ?(?:does not conform|does not match)")
_REASON = re.compile(r"^Not of type \w+: (.*)$")
_GOT = re.compile(r"Got value: (.*)$")
_EARLY_OPTION = re.compile(
    r'Parser key "(model|data)"(?s:.*)Problem with given class_path \'lightning(?:\.pytorch\.core\.\w+)?\.'
    r"Lightning(?:Data)?Module'(?s:.*?)Option '(\w+)' is not accepted"
)
_FOREIGN_OPTION = re.compile(
    r'Parser key "(model|data|trainer\.callbacks|trainer\.strategy)"(?s:.*?)Problem with given class_path '
    r"'([^']+)'(?s:.*?)Option '(\w+)' is not accepted"
)
_REQUIRED = re.compile(
    r'Parser key "([\w.]+)"(?s:.*?)Problem with given class_path \'([^\']+)\'(?s:.*?)'
    r"the following arguments are required: ([\w, .]+)"
)
_OPTION_BEFORE_CLASS = re.compile(
    r'Parser key "([\w.]+)"(?s:.*?)Expected an instantiatable class, but ([\w.]+) is abstract'
    r"(?s:.*?)Given value: NestedArg\(key='(\w+)'"
)
_ENTRY_KEY = re.compile(r'Parser key "([\w.]+)"(?s:.*?)Option \'(\w+)\.[\w.]+\' is not accepted')
_LEAF = ("Not of type", "Expected a", "Does not validate", "Option '")
_NOISE = ("Does not validate against any of the Union subtypes", "Subtypes:", "Errors:", "Given value")


def explain_argument_error(message: str, argv: list[str], command: Any = None) -> str:
    """jsonargparse's nested, multi-line error -> ``model.weight_decay=-1 is not a finite number >= 0; set ...``.

    The readers of :data:`PARSER_ERRORS` are tried in order, each for one shape of jsonargparse's message; the
    first that recognises it gives the line. The last, :func:`_outside_the_domain`, covers every value refused
    by its type: the key is rebuilt from the nesting (``Parser key "model"`` > ``"weight_decay"``), the domain
    is read from the declared type of that parameter (:func:`distlab.domains.describe`), and the value from the
    message or the command line. A message no reader knows is condensed.
    ``command``: the function whose signature declares the top-level options (``distlab generate``)."""
    for reader in PARSER_ERRORS:
        line = reader(message, argv, command)
        if line:
            return line
    return condense_argument_error(message)


def _option_before_its_class(message: str, argv: list[str], command: Any) -> str | None:
    """Options for model/data given before any config or flag named the class they belong to."""
    early = _EARLY_OPTION.search(message)
    if not early:
        return None
    key, option = early.group(1), early.group(2)
    return (
        f"{key}.{option} is set before any {key} class is chosen (an earlier --config gives {key} options, a later "
        f"one names the class); put the --config that names the class first, or choose it with --{key} CLASS"
    )


def _option_before_a_kind(message: str, argv: list[str], command: Any) -> str | None:
    """``--trainer.logger.save_dir=...`` with no logger class chosen (the annotation's base is abstract)."""
    abstract = _OPTION_BEFORE_CLASS.search(message)
    if not abstract:
        return None
    return _before_any_class(abstract.group(1), abstract.group(2), abstract.group(3))


def _before_any_class(key: str, base: str, option: str) -> str:
    """``--{key}.{option}`` given while ``key`` holds only its base class ``base`` (no class chosen yet)."""
    base_cls = _imported(base)
    kinds = sorted(
        c.__name__
        for c in (subclasses(base_cls)[1:] if isinstance(base_cls, type) else [])
        if c.__module__.startswith(("lightning.", "distlab."))
        and c.__module__ != "distlab.compat"  # (distlab's own plumbing, not a choice for users)
        and not c.__name__.startswith("_")
        and option in _options_of(f"{c.__module__}.{c.__name__}")
    )
    return (
        f"{key}.{option} is set before any {key} class is chosen ({base.rsplit('.', 1)[-1]} is only their base); "
        f"choose one first ({' or '.join(f'--{key}={k}' for k in kinds[:3]) or f'--{key}=CLASS'}), then its options"
    )


def _key_beside_class_path(message: str, argv: list[str], command: Any) -> str | None:
    """A class entry with a key other than class_path / init_args — or, when the config puts that key under
    init_args (``foo: {bar: 1}``), an option the class does not take."""
    from distlab.errors import closest

    entry, entry_class = _ENTRY_KEY.search(message), _CLASS.search(message)
    if entry and entry_class and _written_for(argv, entry_class.group(1), entry.group(2)) == "init_args":
        cls, option = entry_class.group(1), entry.group(2)
        moved = _section_taking(option, entry.group(1))
        if moved:
            return (
                f"{entry.group(1)}.{option} is not an option of {cls}: {option} is a {moved} setting; move it under "
                f"{moved} (--{moved}.{option}=... on the command line)"
            )
        return (
            f"{entry.group(1)}.{option} is not an option of {cls}{closest(option, _options_of(cls))}; "
            f"`distlab fit --{entry.group(1)}.help {cls}` lists its options"
        )
    if entry and entry.group(2) not in ("init_args", "dict_kwargs") and "class_path" in message:
        return (
            f"{entry.group(1)}: a class entry holds class_path and init_args (its settings), not "
            f"'{entry.group(2)}'{closest(entry.group(2), ['init_args', 'dict_kwargs'])}; write its settings under "
            "init_args"
        )
    return None


def _required_argument_unset(message: str, argv: list[str], command: Any) -> str | None:
    """A class whose __init__ has arguments without defaults, left unset (or set to null)."""
    required = _REQUIRED.search(message)
    if not required:
        return None
    key, cls, names = required.group(1), required.group(2), required.group(3).split(", ")
    listed = [a for a in argv if a.startswith(f"--{key}=[")]
    if (
        listed
    ):  # --trainer.logger=[CSVLogger,CSVLogger]: a later --trainer.logger.save_dir reaches none of them
        short = cls.rsplit(".", 1)[-1]
        return (
            f"{key}: {cls} needs {' and '.join(names)}, and {listed[-1].split('=', 1)[0]}=[...] names classes without "
            f"their settings; add them one at a time, each followed by its own: --{key}+={short} "
            f"--{key}.{names[0]}=VALUE (again for the next one), or write the list in a config file with init_args"
        )
    return (
        f"{key}: {cls} needs {' and '.join(names)} (its __init__ gives no default, and the command line and configs "
        f"leave {'them' if len(names) > 1 else 'it'} unset or null); set --{key}.{names[0]}=VALUE, or "
        f"{names[0]}: VALUE under {key}.init_args in the config"
    )


_INIT_NOT_A_MAPPING = re.compile(
    r'Parser key "([\w.]+)"(?s:.*?)Problem with given class_path \'([^\']+)\'(?s:.*?)'
    r"'(\w+)' object has no attribute '(?:keys|items)'"
)


def _init_args_not_a_mapping(message: str, argv: list[str], command: Any) -> str | None:
    """``init_args: 5`` (or a list) under a class: the parser's words are an AttributeError about ``keys``."""
    found = _INIT_NOT_A_MAPPING.search(message)
    if not found:
        return None
    key, cls, kind = found.group(1), found.group(2).rsplit(".", 1)[-1], found.group(3)
    if kind == "NoneType":  # `init_args:` with nothing under it
        return (
            f"{key}.init_args is empty (null): remove the init_args line to take {cls}'s defaults, or indent its "
            "options under it (init_args: then OPTION: VALUE on the lines below)"
        )
    kind = {"int": "a number", "float": "a number", "str": "a string", "bool": "true/false"}.get(
        kind, f"a {kind}"
    )
    return (
        f"{key}.init_args is {kind}: the init_args of {cls} must be a mapping of its options (option: value); "
        f"write init_args: {{OPTION: VALUE}} under {key}, or --{key}.OPTION=VALUE"
    )


_NO_VALUE = re.compile(r"argument (--[\w.]+): expected one argument")


def _option_without_value(message: str, argv: list[str], command: Any) -> str | None:
    """``--model.depth`` typed last (or before another option) with no value: the parser names only ``--model``."""
    found = _NO_VALUE.search(message)
    if not found:
        return None
    name = found.group(1)
    for typed, following in zip(argv, [*argv[1:], None], strict=True):
        if (typed == name or typed.startswith(name + ".")) and "=" not in typed:
            if following is None or following.startswith("--"):
                return f"{typed} is given without a value; write {typed}=VALUE (or {typed} VALUE)"
    return f"{name} is given without a value; write {name}=VALUE"


def _option_the_class_lacks(message: str, argv: list[str], command: Any) -> str | None:
    """An option the chosen class does not take (misspelt, or written for another class)."""
    from distlab.errors import closest

    foreign = _FOREIGN_OPTION.search(message)
    if not foreign or _takes_option(foreign.group(2), foreign.group(3)):
        return None
    key, cls, option = foreign.group(1), foreign.group(2), foreign.group(3)
    if cls.rsplit(".", 1)[-1] in (
        "Callback",
        "Logger",
        "Profiler",
        "Strategy",
    ):  # only the base: no class chosen
        line = _before_any_class(key, cls, option)
        if key == "trainer.callbacks":
            line = line.replace(f"--{key}=", f"--{key}+=")  # a callback is added to the list
        return line
    typed = any(a.startswith((f"--{key}.{option}", f"--{key}.init_args.{option}")) for a in argv)
    typed = typed or _written_for(argv, cls, option) is not None  # in a config naming this very class
    source = "" if typed else f" (an earlier --config written for another {key} class sets it?)"
    moved = _section_taking(option, key)
    if moved:
        return (
            f"{key}.{option} is not an option of {cls}: {option} is a {moved} setting; move it under {moved} "
            f"(--{moved}.{option}=... on the command line)"
        )
    hint = closest(option, _options_of(cls))
    return f"{key}.{option} is not an option of {cls}{hint}{source}; `distlab fit --{key}.help {cls}` lists its options"


def _section_taking(option: str, key: str) -> str | None:
    """Which other section of the config takes ``option`` ("data", "trainer"): distlab's
    modules and data modules and Lightning's Trainer are asked, so a setting put under the wrong key is moved, not
    misspelt."""
    import inspect

    import lightning as L

    import distlab.data
    import distlab.modules

    sections = {"model": (distlab.modules, L.LightningModule), "data": (distlab.data, L.LightningDataModule)}
    for other, (pkg, base) in sections.items():
        if other == key or key not in ("model", "data", "trainer"):
            continue
        for name in pkg.__all__:
            obj = getattr(pkg, name)
            if (
                isinstance(obj, type)
                and issubclass(obj, base)
                and option in _options_of(f"{obj.__module__}.{name}")
            ):
                return other
    if key != "trainer" and key in ("model", "data") and option in inspect.signature(L.Trainer).parameters:
        return "trainer"
    return None


def _outside_the_domain(message: str, argv: list[str], command: Any) -> str | None:
    """A value its declared type refuses: the key, the value seen, and the domain in words."""
    leaf = _deepest_leaf(message)
    if leaf is None:
        return None
    keys, owner, value, reason = leaf
    dotted = ".".join(keys)
    domain = _declared_domain(keys, owner, command)
    if domain is None:
        return None
    from distlab.domains import refusal

    shown = value if value is not None else _value_on_command_line(dotted, argv)
    if shown is not None:
        shown = _inner_value(str(shown), keys[-1])
    return refusal(dotted, shown if shown is not None else "(as given)", domain, reason)


def _written_for(argv: list[str], class_path: str, option: str) -> str | None:
    from distlab.config_scan import written_for

    return written_for(argv, class_path, option)


_CLASS_VALUE = re.compile(
    r"Expected a path but (\S+) either not accessible"  # typed on the command line
    r"|Expected a dot import path string: (\S+)\n(?s:.*)Given value: \{'class_path': '\2'"  # a config's class_path
)


def _class_value_error(message: str, argv: list[str]) -> str | None:
    """A class-valued Trainer argument (logger, callbacks, plugins ...) given a name that is no class of its kind:
    ``trainer.plugins=foo is not accepted (...); set trainer.plugins to a class path of a Precision, ...``."""
    import typing

    import lightning as L

    key, value = _KEY.search(message), _CLASS_VALUE.search(message)
    sections = {"model": L.LightningModule, "data": L.LightningDataModule}
    if not key or not value or not (key.group(1).startswith("trainer.") or key.group(1) in sections):
        return None
    name, given = key.group(1), value.group(1) or value.group(2)
    typed = [a.split("=", 1)[1] for a in argv if a.startswith((f"--{name}=", f"--{name}+="))]
    if value.group(1) and given not in typed and "class_path" in message:  # an option's value, not the class
        return None
    try:
        hint = sections.get(name) or typing.get_type_hints(L.Trainer.__init__).get(
            name.removeprefix("trainer.")
        )
    except Exception:  # noqa: BLE001 - no annotation to read: the condensed message is used
        return None
    bases = sorted({c for c in _classes_in(hint)}, key=lambda c: c.__name__)
    if not bases:
        return None
    known = {c.__name__: c for base in bases for c in subclasses(base) if not c.__name__.startswith("_")}
    found = known.get(given.rsplit(".", 1)[-1]) or _lightning_class(given)
    obj = _imported(given) if found is None else None
    if obj is not None and callable(obj) and not isinstance(obj, type):
        return (
            f"{name}={given} is not accepted: it is a function, not a class; give the {' or '.join(b.__name__ for b in bases)} "
            "class itself (the CLI builds it from its __init__ arguments)"
        )
    other = next(
        (k for k, base in sections.items() if k != name and found is not None and issubclass(found, base)),
        None,
    )
    if name in sections and other:  # the model and data classes swapped
        return (
            f"--{name}={given} is not accepted: it is a {sections[other].__name__}, not a {sections[name].__name__}; "
            f"give it as --{other}, and a {sections[name].__name__} as --{name}"
        )
    if found is None:
        from distlab.errors import closest

        reason = f"no {' or '.join(b.__name__ for b in bases)} class named {given!r} can be imported{closest(given.rsplit('.', 1)[-1], list(known))}"
    else:
        reason = f"{found.__module__}.{found.__name__} is not a {' or '.join(f'{b.__module__}.{b.__name__}' for b in bases)}"
    return f"{name}={given} is not accepted ({reason}); set {name} to a class name or path of that kind, or see `distlab fit --{name}.help CLASS`"


_NAMED_COMPONENT = re.compile(
    r'Parser key "trainer\.(strategy|profiler)"(?s:.*)Expected a dot import path string: (\S+)'
)


def _options_of_a_named_component(message: str, argv: list[str]) -> str | None:
    """``--trainer.strategy.timeout=...`` / ``--trainer.profiler.dirpath=...`` when the strategy or profiler is a
    name (``simple``, a preset's ``strategy: ddp_optimizer_sync_spawn``): a name takes no options; the line gives the
    class form that does."""
    from distlab.lightning_domains import component_class

    m = _NAMED_COMPONENT.search(message)
    key = m.group(1) if m else ""
    option = next((a for a in argv if a.startswith(f"--trainer.{key}.") and "help" not in a), None)
    if not m or option is None:
        return None
    name = m.group(2)
    cls, preset = component_class(key, name)
    if cls is None or "." in name:
        return None
    given = " ".join(f"--trainer.{key}.{k}={v}" for k, v in preset.items())
    return (
        f"{option.split('=')[0].removeprefix('--')} cannot be set: trainer.{key} is the name {name!r}"
        f"{' (a preset' + chr(39) + 's)' if preset else ''}, which takes no options; name its class instead: "
        f"--trainer.{key}={cls.__module__}.{cls.__name__}{' ' + given if given else ''} {option}"
    )


def _imported(given: str) -> Any:
    """What the dotted path ``given`` names, or None."""
    module, _, name = given.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError, ValueError):
        return None


def _lightning_class(given: str) -> type | None:
    """The class ``given`` names (a dotted path, or a name Lightning's callbacks/loggers/profilers/plugins
    export), of whatever kind; None if it names none."""
    paths = (
        [given]
        if "." in given
        else [f"lightning.pytorch.{p}.{given}" for p in ("callbacks", "loggers", "profilers", "plugins")]
    )
    for path in paths:
        module, _, name = path.rpartition(".")
        try:
            found = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            continue
        if isinstance(found, type):
            return found
    return None


def _classes_in(hint: Any) -> list[type]:
    """The classes a Trainer annotation accepts (``Union[Logger, Iterable[Logger], bool]`` -> [Logger])."""
    if isinstance(hint, type):
        return [] if hint in (bool, str, int, float, type(None)) else [hint]
    return [c for arg in typing.get_args(hint) for c in _classes_in(arg)]


def _options_of(class_path: str) -> list[str]:
    """The parameters of the class ``class_path`` names ([] when it cannot be imported or inspected)."""
    import importlib
    import inspect

    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        return [
            n
            for n, p in inspect.signature(cls).parameters.items()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
    except (ImportError, AttributeError, ValueError, TypeError):
        return []


def _takes_option(class_path: str, option: str) -> bool:
    """Whether the class ``class_path`` names has a parameter ``option`` (False when it cannot be imported)."""
    return option in _options_of(class_path)


def _inner_value(shown: str, option: str) -> str:
    """A class entry's own value: jsonargparse shows the whole ``trainer.callbacks`` list as "the value"."""
    import ast

    if "class_path" not in shown:
        return shown
    try:
        tree = ast.literal_eval(shown)
    except (ValueError, SyntaxError):
        return shown
    found: list[Any] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if option in x:
                found.append(x[option])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(tree)
    return str(found[-1]) if found else shown


def _deepest_leaf(message: str) -> tuple[list[str], str | None, str | None, str | None] | None:
    """(the key path, the class whose parameter it is, the value seen, a reason in the check's own words) of
    the most deeply nested problem."""
    stack: list[tuple[int, str, str | None]] = []  # (indent, key, class path below it)
    best: tuple[list[str], str | None, str | None, str | None] | None = None
    best_rank: tuple[int, bool, int] = (0, False, 0)
    lines = message.splitlines()
    for i, raw in enumerate(lines):
        indent = len(raw) - len(raw.lstrip(" -"))
        text = raw.strip().removeprefix("- ").strip()
        if m := _KEY.search(text):
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, m.group(1), None))
        elif m := _CLASS.search(text):
            while stack and stack[-1][0] >= indent:
                stack.pop()
            if stack:
                stack[-1] = (stack[-1][0], stack[-1][1], m.group(1))
        elif text.startswith(_LEAF) and stack:
            while stack and stack[-1][0] >= indent:
                stack.pop()
            if not stack or text.startswith("Option '"):
                continue
            keys = [key for _, key, _ in stack]
            owner = stack[-2][2] if len(stack) > 1 else None
            value = _value_in(text, lines[i + 1 :], indent)
            why = _REASON.match(text)
            reason = why.group(1) if why and not _NOT_OF_TYPE.match(text) else None
            if reason and reason.startswith(("invalid literal", "could not convert")):
                reason = None  # a value of the wrong kind: the domain says it better
            rank = (
                len(keys),
                not text.startswith("Does not validate"),
                indent,
            )  # the innermost, specific one
            if best is None or rank > best_rank:
                best, best_rank = (keys, owner, value, reason), rank
    return best


def _value_in(leaf: str, after: list[str], indent: int) -> str | None:
    if m := _NOT_OF_TYPE.match(leaf):
        return m.group(1) or None
    if m := _GOT.search(leaf):
        return m.group(1)
    for raw in after:  # a Union's "Given value: x" follows its list of errors, one level up
        if m := _GIVEN.match(raw.strip()):
            return None if m.group(1).startswith("NestedArg(") else m.group(1)
    return None


def _declared_domain(keys: list[str], owner: str | None, command: Any = None) -> Any:
    """The declared type of the parameter ``keys[-1]``: of class ``owner``, of the Trainer, or of ``command``."""
    from distlab.lightning_domains import TRAINER_DOMAINS, domains_of

    if owner:
        try:
            module, _, name = owner.rpartition(".")
            cls = getattr(importlib.import_module(module), name)
            declared = domains_of(cls).get(keys[-1])  # a Lightning class's argument: distlab declares it
            if declared is not None and not isinstance(declared, str):
                return declared
            return typing.get_type_hints(cls.__init__).get(keys[-1])
        except Exception:  # noqa: BLE001 - no declared domain to show: the condensed message is used
            return None
    if len(keys) == 1 and command is not None:
        return typing.get_type_hints(command).get(keys[0])
    if len(keys) == 1 and keys[0].startswith("trainer."):
        name = keys[0].removeprefix("trainer.")
        domain = TRAINER_DOMAINS.get(name)
        if isinstance(
            domain, str
        ):  # a name Lightning checks: the values its own annotation lists, if it does
            import lightning as L

            return typing.get_type_hints(L.Trainer.__init__).get(name)
        return domain
    if keys == ["seed_everything"]:  # LightningCLI's own option: a seed, or true (pick one) / false (none)
        from distlab.domains import Seed

        return bool | Seed
    return None


def _value_on_command_line(dotted: str, argv: list[str]) -> str | None:
    flag = f"--{dotted}"
    for i, tok in enumerate(argv):
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
        if tok == flag and i + 1 < len(argv):
            return argv[i + 1]
    return None


# Trainer arguments Lightning 2.0 removed or renamed, as tutorials and older configs still write them: what to
# write instead (https://lightning.ai/docs/pytorch/stable/upgrade/migration_guide.html).
LIGHTNING_1_TRAINER_OPTIONS = {
    "gpus": "trainer.accelerator=gpu and trainer.devices=N",
    "tpu_cores": "trainer.accelerator=tpu and trainer.devices=N",
    "num_processes": "trainer.accelerator=cpu and trainer.devices=N",
    "auto_select_gpus": "trainer.devices=N (Lightning picks free GPUs itself)",
    "distributed_backend": "trainer.strategy",
    "resume_from_checkpoint": "--ckpt_path (after the subcommand: distlab fit --ckpt_path PATH)",
    "replace_sampler_ddp": "trainer.use_distributed_sampler",
    "checkpoint_callback": "trainer.enable_checkpointing",
    "weights_summary": "trainer.enable_model_summary (or a ModelSummary callback)",
    "progress_bar_refresh_rate": "a TQDMProgressBar callback's refresh_rate (trainer.enable_progress_bar=false hides it)",
    "process_position": "a TQDMProgressBar callback's process_position",
    "reload_dataloaders_every_epoch": "trainer.reload_dataloaders_every_n_epochs=1",
    "stochastic_weight_avg": "a StochasticWeightAveraging callback",
    "log_gpu_memory": "a DeviceStatsMonitor callback",
    "auto_lr_find": "lightning.pytorch.tuner.Tuner(trainer).lr_find(model) in Python",
    "auto_scale_batch_size": "lightning.pytorch.tuner.Tuner(trainer).scale_batch_size(model) in Python",
    "amp_backend": "trainer.precision (16-mixed or bf16-mixed)",
    "amp_level": "trainer.precision (16-mixed or bf16-mixed)",
    "track_grad_norm": "logging lightning.pytorch.utilities.grad_norm(...) in the module's on_before_optimizer_step",
    "terminate_on_nan": "trainer.detect_anomaly=true (distlab's fit stops on a non-finite loss by itself)",
    "flush_logs_every_n_steps": "the logger's flush_logs_every_n_steps (CSVLogger)",
    "multiple_trainloader_mode": "a CombinedLoader(..., mode=...) returned by train_dataloader",
    "move_metrics_to_cpu": "nothing (Lightning 2 removed it)",
    "truncated_bptt_steps": "manual optimization in the module (Lightning 2 removed it)",
}
_UNRECOGNIZED = re.compile(
    r"(?:unrecognized arguments: --trainer\.(\w+)(?:[=\s](\S*))?|does not accept option 'trainer\.(\w+)')"
)
_UNRECOGNIZED_TOP = re.compile(r"unrecognized arguments: --(\w+)\b")
# What LightningCLI's fit/validate/test/predict take besides the sections (--trainer.*, --model.*, ...).
SUBCOMMAND_OPTIONS = ("config", "print_config", "seed_everything", "ckpt_path", "trainer", "model", "data")


def _unknown_option(message: str, command: Any = None) -> str | None:
    """``--trainer.gpus=2`` -> what Lightning 2 calls it; ``--trainer.max_stepz`` -> the nearest Trainer argument;
    ``--ckpt_pth`` -> the nearest option of the subcommand (``command``'s parameters for generate/export)."""
    found = _UNRECOGNIZED.search(message)
    top = _UNRECOGNIZED_TOP.search(message)
    section = re.search(
        r"(?:unrecognized arguments: --|does not accept option ')(trainer|model|data)\.", message
    )
    if (
        command is not None and section
    ):  # generate / export / prepare read the run's settings from the checkpoint
        import inspect

        options = ", ".join(f"--{n}" for n in inspect.signature(command).parameters)
        return (
            f"--{section.group(1)}.* options belong to distlab fit / validate / test, not to distlab "
            f"{command.__name__}{' (the checkpoint carries its model' + chr(39) + 's settings)' if '--ckpt_path' in options else ''}; "
            f"its options are {options}"
        )
    chosen = re.search(
        r"(?:unrecognized arguments: --|does not accept option ')(optimizer|lr_scheduler)\b", message
    )
    if (
        command is None and chosen
    ):  # LightningCLI's --optimizer / --lr_scheduler, which distlab's CLI leaves out
        return (
            f"distlab fit has no --{chosen.group(1)}: the module builds its optimizer and schedule (configure_optimizers); "
            "for distlab's GPT set model.optimizer (muon or adamw), model.matrix_lr / embedding_lr / head_lr, "
            "model.schedule"
        )
    if not found and top:  # --ckpt_pth, --seed: an option of the subcommand itself
        import inspect

        from distlab.errors import closest

        names = (
            list(inspect.signature(command).parameters) if command is not None else list(SUBCOMMAND_OPTIONS)
        )
        hint = closest(top.group(1), names)
        return f"--{top.group(1)} is not an option{hint}; --help lists them" if hint else None
    misplaced = re.search(
        r"(?:unrecognized arguments: --|does not accept option ')(trainer|model|data)\.(\w+)['=\s]|$", message
    )
    if command is None and misplaced and misplaced.group(2) in ("ckpt_path", "seed_everything"):
        key = misplaced.group(2)
        return (
            f"{misplaced.group(1)}.{key}: {key} is not a {misplaced.group(1)} setting but the subcommand's own: in a "
            f"config file write '{key}:' at the top level (not indented under {misplaced.group(1)}:), or pass --{key}"
        )
    if not found:
        return None
    import inspect

    import lightning as L

    from distlab.errors import closest

    option, value = found.group(1) or found.group(3), found.group(2)
    shown = f"trainer.{option}" + (f"={value}" if value else "")
    if option in LIGHTNING_1_TRAINER_OPTIONS:
        return (
            f"{shown} is a Lightning 1.x Trainer argument that Lightning {L.__version__} no longer has; use "
            f"{LIGHTNING_1_TRAINER_OPTIONS[option]}"
        )
    names = [n for n in inspect.signature(L.Trainer.__init__).parameters if n != "self"]
    hint = closest(option, names)
    moved = _section_taking(option, "trainer") if not hint else None
    if moved is not None:  # a data / model setting written under trainer
        return (
            f"{shown}: {option} is not a Trainer argument but a {moved} setting; move it under {moved}: (indented), "
            f"or pass --{moved}.{option}"
        )
    if not hint:
        return None
    return f"{shown} is not a Trainer argument{hint}; `distlab fit --help` lists them under trainer"


# The shapes of jsonargparse's errors distlab words itself, tried in this order (the first that recognises the
# message gives the line; a more specific shape comes before a general one).
PARSER_ERRORS: tuple[typing.Callable[[str, list[str], Any], str | None], ...] = (
    lambda message, argv, command: _unknown_option(message, command),
    _option_before_its_class,
    _option_before_a_kind,
    _key_beside_class_path,
    lambda message, argv, command: _options_of_a_named_component(message, argv),
    _required_argument_unset,
    _init_args_not_a_mapping,
    _option_without_value,
    lambda message, argv, command: _class_value_error(message, argv),
    _option_the_class_lacks,
    _outside_the_domain,
)


def condense_argument_error(message: str) -> str:
    """jsonargparse's multi-line error -> one line: the key and the specific problem(s)."""
    lines = [line.strip().removeprefix("- ").strip() for line in message.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(_NOISE) and ln != "Expected a <class 'NoneType'>"]
    return " ".join(lines) + " (see --help)"


# ---- the last line of defence ------------------------------------------------------------------------------
def save_traceback(e: BaseException, run_folder: str | os.PathLike | None) -> Path:
    """Write ``e``'s full traceback (and a spawn child's, which is in its text) where a user will find it."""
    text = "".join(traceback.format_exception(e))
    rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"
    name = "error.log" if rank == "0" else f"error-rank{rank}.log"
    if run_folder is not None and Path(run_folder).is_dir():
        path = Path(run_folder) / name
        try:
            path.write_text(text)
            return path
        except OSError:
            pass  # an unwritable run folder: the temporary file below
    fd, tmp = tempfile.mkstemp(prefix="distlab-error-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return Path(tmp)


def report(
    e: BaseException, argv: list[str], run_folder: str | os.PathLike | None, command: Any = None
) -> tuple[str, int]:
    """The one line (without ``distlab: error:``) and the exit status for any exception a command raised."""
    try:
        found = one_line_error(e, argv, command)
    except Exception:  # noqa: BLE001 - a translator's own slip must not put a traceback wall before the user's error
        found = None
    if found is not None:
        return found
    warning = find_in_chain(e, (Warning,))
    if (
        warning is not None
    ):  # PYTHONWARNINGS=error (or -W error) turned a dependency's warning into an exception
        return (
            f"a warning became an error ({type(warning).__name__}: {first_line(warning)[:120]}): warnings are set to "
            f"raise (PYTHONWARNINGS=error or python -W error); unset that, or add ignore::{type(warning).__name__}"
        ), 2
    saved = save_traceback(e, run_folder)
    kind, what = _innermost(e)
    limited = _file_size_limited(e, run_folder, what)
    if limited is not None:  # ulimit -f: the disk may have room; each file is capped
        return f"{limited} (full traceback: {saved})", 1
    full = _disk_full(e, run_folder, what)
    if full is not None:  # the cause is the disk, whatever the library's words for it ("iostream error")
        return f"{full} (full traceback: {saved})", 1
    killed = _KILLED.search(what)
    if (
        kind == "ProcessExitedException" and killed
    ):  # a spawned rank ended by a signal: none of its code failed
        rank, name = killed.group(1), killed.group(2)
        why = " (the system's out-of-memory killer, or kill -9)" if name == "SIGKILL" else ""
        return (
            f"rank {rank} was stopped by {name}{why} and the other ranks were ended with it; resume from the last "
            f"checkpoint with --ckpt_path (full traceback: {saved})"
        ), 1
    where = user_code_location(e)
    cause = next((why for text, why in USER_CODE_CAUSES if text in what.lower() or text in what), None)
    if cause is not None:  # torch's words for a mistake in the user's module: what they mean, and where
        at = f"; raised in your code, {where}" if where is not None else ""
        return f"{kind}: {what} ({cause}{at}; full traceback: {saved})", 1
    if where is not None:  # the user's own class failed: point at their line, not at distlab
        return f"{kind}: {what} (raised in your code, {where}; full traceback: {saved})", 1
    return f"{kind}: {what} (an internal error; full traceback: {saved})", 1


# A write torch's C++ writer (torch.save) or another native writer cut short, in their words.
_WRITE_CUT_SHORT = ("iostream error", "unexpected pos", "failed writing", "File too large")


def _file_size_limited(e: BaseException, run_folder: str | os.PathLike | None, what: str) -> str | None:
    """A write that stopped at the process's file-size limit (ulimit -f) or the file system's largest file: EFBIG in
    the chain, or a native writer's words for a write cut short while a file-size limit is set."""
    import errno

    from distlab.errors import file_size_limit, file_size_limit_line

    too_large = find_in_chain(e, lambda x: isinstance(x, OSError) and x.errno == errno.EFBIG)
    cut_short = any(words in what or words in str(e) for words in _WRITE_CUT_SHORT)
    if too_large is None and not (cut_short and file_size_limit() is not None):
        return None
    where = getattr(too_large, "filename", None) or run_folder or "a file"
    return file_size_limit_line(where, too_large=True)


def _disk_full(e: BaseException, run_folder: str | os.PathLike | None, what: str) -> str | None:
    """A write that failed because its disk is full: ENOSPC in the chain or the words, or (torch's C++ writer says
    only "iostream error") the run folder's disk with less than 1 MB left."""
    import errno
    import shutil

    no_space = find_in_chain(e, lambda x: isinstance(x, OSError) and x.errno == errno.ENOSPC)
    if no_space is None and "No space left on device" not in what and "No space left on device" not in str(e):
        folder = Path(run_folder) if run_folder else None
        while folder is not None and not folder.exists() and folder != folder.parent:
            folder = folder.parent
        try:
            if folder is None or shutil.disk_usage(folder).free >= 1 << 20:
                return None
        except OSError:
            return None
    where = getattr(no_space, "filename", None) or run_folder or "the output folder"
    return (
        f"the disk is full (No space left on device) while writing {where}: nothing more could be saved; free space "
        "there, or write to a folder on another disk (trainer.default_root_dir, --out)"
    )


_KILLED = re.compile(r"process (\d+) terminated with signal (\w+)")

# torch errors that a user's module causes but that are raised after its code returned (inside backward), so no
# frame of theirs is left to point at: what they mean.
USER_CODE_CAUSES = (
    (
        "optimizer got an empty parameter list",
        "configure_optimizers gave an optimizer no parameters: every parameter it was given is frozen "
        "(requires_grad=False), or a filter kept none; unfreeze what should train",
    ),
    (
        "pickle",  # "Can't pickle local object ...", "cannot pickle '_thread.lock' object", PicklingError
        "the spawn presets send the module and its data to each rank by pickling them, and this object cannot be "
        "pickled (a lambda, a nested function, an open file or lock); define it at module level, or launch with "
        "torchrun and strategy: ddp_optimizer_sync, which pickles nothing",
    ),
    (
        "does not require grad and does not have a grad_fn",
        "most likely in your code: the loss training_step returned is cut off from the parameters (.detach(), "
        ".item() turned back into a tensor, torch.no_grad(), or only frozen parameters)",
    ),
)


_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): (.+)$")


def _innermost(e: BaseException) -> tuple[str, str]:
    """(type, first line) of what really failed: for a spawned rank's error (torch's ProcessRaisedException, whose
    first line is "-- Process 0 terminated with the following error:") the child's own last exception line."""
    text = str(e)
    if "terminated with the following error" in text:
        for line in reversed(text.splitlines()):
            m = _RAISED.match(line.strip())
            if m:
                return f"{m.group(1).rsplit('.', 1)[-1]} on a rank", m.group(2)
    origin, seen = e, set()  # the exception that started it (a wrapper's first line says less)
    while (origin.__cause__ or origin.__context__) is not None and id(origin) not in seen:
        seen.add(id(origin))
        origin = origin.__cause__ or origin.__context__
    return type(origin).__name__, _whole_message(origin)


def _whole_message(e: BaseException, limit: int = 360) -> str:
    """``e``'s message on one line: all of it (a message whose first line is a tensor's printout says why at its
    end), its middle cut when longer than ``limit`` characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    text = re.sub(r"\[[^\[\]]{40,}\]", "[...]", text)  # a tensor's or list's printout: its values say nothing
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2 - 3]} ... {text[-(limit // 2 - 2) :]}"


def _dependency_dirs() -> list[str]:
    """The folders of the imported top-level packages of distlab's dependencies, and theirs (from the installed
    metadata: torch, lightning, jsonargparse, numpy, ...)."""
    import re
    import sys
    from importlib import metadata

    def key(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    closure, todo = set(), ["distlab"]
    while todo:
        name = todo.pop()
        if key(name) in closure:
            continue
        closure.add(key(name))
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r]
    closure.discard("distlab")
    dirs = []
    for top, dists in metadata.packages_distributions().items():
        module = sys.modules.get(top)
        if module is not None and getattr(module, "__file__", None) and any(key(d) in closure for d in dists):
            dirs.append(str(Path(module.__file__).parent))
    return dirs


def user_code_location(e: BaseException) -> str | None:
    """Where ``e`` (or an exception in its chain) was raised, if by code outside distlab, the packages it builds on
    and Python's own library - the user's class, whose bug deserves its traceback rather than a refused-input line:
    ``file:line in function``; None otherwise."""
    import sysconfig

    paths = sysconfig.get_paths()
    library = [Path(p).resolve() for p in {paths["stdlib"], paths["purelib"], paths["platlib"]}]
    # wherever they are installed (a user site, PYTHONPATH, a .pth file): the packages distlab builds on
    library += [Path(p).resolve() for p in _dependency_dirs()]
    distlab_dir = Path(__file__).resolve().parent

    def is_user(path: Path) -> bool:
        return path.suffix == ".py" and not any(lib in path.parents for lib in [*library, distlab_dir])

    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, SyntaxError) and e.filename and is_user(Path(e.filename).resolve()):
            return f"{Path(e.filename).resolve()}:{e.lineno} (a syntax error)"
        frames = []
        tb = e.__traceback__
        while tb is not None:
            frames.append(tb)
            tb = tb.tb_next
        # From where it was raised outwards: the first frame that is not a library's (torch, Lightning, Python's)
        # decides: the user's code (it called the library wrongly, or raised itself), or distlab's (ours).
        for frame in reversed(frames):
            path = Path(frame.tb_frame.f_code.co_filename).resolve()
            if path.suffix != ".py" or any(lib in path.parents for lib in library):
                continue
            if is_user(path):
                return f"{path}:{frame.tb_lineno} in {frame.tb_frame.f_code.co_name}"
            break
        e = e.__cause__ or e.__context__
    return None


def raised_in_user_code(e: BaseException) -> bool:
    return user_code_location(e) is not None


def is_stop_signal(e: BaseException) -> bool:
    """Lightning ends a run that received SIGTERM with its SIGTERMException (a SystemExit): a stop, not a plain exit."""
    return type(e).__name__ == "SIGTERMException"


def report_stop(e: BaseException, run_folder: str | os.PathLike | None) -> tuple[str, int]:
    """A run stopped from outside (SIGTERM from a scheduler or ``kill``; Ctrl-C): one line, and the shell's exit
    status for the signal (143, 130), never 0 - a job that was stopped did not finish."""
    from distlab.callbacks import preemption

    signal, code = ("SIGTERM", 143) if is_stop_signal(e) else ("Ctrl-C (SIGINT)", 130)
    saved = preemption.stop_note
    if not saved and run_folder is not None:  # the launching process of spawned ranks: they saved it
        from distlab.checkpoint import checkpoint_step
        from distlab.preflight import newest_checkpoint

        newest = newest_checkpoint([Path(run_folder) / "checkpoints", Path(run_folder)])
        if newest is not None:
            saved = f"saved {newest} at step {checkpoint_step(newest)}"
    if not saved or saved.endswith("nothing was saved"):
        return f"stopped by {signal}: {saved or 'nothing was saved'} (no checkpoint to resume from)", code
    return f"stopped by {signal}: {saved}; resume with --ckpt_path to continue", code


def debug_requested() -> bool:
    return switch_on(DEBUG_ENV)
