"""distlab's environment switches (``DISTLAB_DEBUG``, ``DISTLAB_VERBOSE``): on or off, read one way everywhere.

Nothing here imports torch or Lightning: the checks that run before those imports read the switches too.
"""

from __future__ import annotations

import os

DEBUG_ENV = "DISTLAB_DEBUG"  # 1: show the full traceback instead of one line

SWITCH_WORDS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "": False,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def switch_on(name: str, env: dict[str, str] | None = None) -> bool:
    """Whether the environment switch ``name`` (DISTLAB_DEBUG, DISTLAB_VERBOSE) is on: 1/true/yes/on, or off:
    unset, empty, 0/false/no/off. Any other value counts as off here (so its refusal is one line, not a traceback);
    the CLI refuses it up front (:func:`check_switches`)."""
    return SWITCH_WORDS.get((os.environ if env is None else env).get(name, "").strip().lower(), False)


def check_switches(names: tuple[str, ...], env: dict[str, str] | None = None) -> str | None:
    """The one-line refusal for a switch set to a word that is neither on nor off, or None."""
    for name in names:
        value = (os.environ if env is None else env).get(name)
        if value is not None and value.strip().lower() not in SWITCH_WORDS:
            return f"{name}={value!r} is neither on nor off; set {name}=1 (or true, yes, on) or 0 (false, no, off), or unset it"
    return None
