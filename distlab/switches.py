"""distlab's environment switches (``DISTLAB_DEBUG``, ``DISTLAB_VERBOSE``): on or off, read one way everywhere.

Nothing here imports torch or Lightning: the checks that run before those imports read the switches too.
"""

from __future__ import annotations

import os

DEBUG_ENV = "DISTLAB_DEBUG"  # 1: show the full traceback instead of one line

ON_WORDS, OFF_WORDS = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def switch_on(name: str) -> bool:
    """Whether the environment switch ``name`` (DISTLAB_DEBUG, DISTLAB_VERBOSE) is on: 1/true/yes/on, or off:
    unset, empty, 0/false/no/off. Any other value counts as off here (so its refusal is one line, not a traceback);
    the CLI refuses it up front (:func:`check_switches`)."""
    return os.environ.get(name, "").strip().lower() in ON_WORDS


def check_switches(names: tuple[str, ...]) -> str | None:
    """The one-line refusal for a switch set to a word that is neither on nor off, or None."""
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip().lower() not in ON_WORDS + OFF_WORDS:
            return f"{name}={value!r} is neither on nor off; set {name}=1 (or true, yes, on) or 0 (false, no, off), or unset it"
    return None
