"""Errors the CLI turns into one-line messages and a non-zero exit."""

import difflib


class ConfigError(ValueError):
    """A configuration value is invalid. The message says what, the value seen, and what to set."""


class DistlabError(RuntimeError):
    """A run-time failure whose message says it all (which rank, what, what to do): the CLI prints it as one line."""


def closest(value: str, names: list[str]) -> str:
    """' (did you mean X?)' for the nearest of ``names``, or ''."""
    found = difflib.get_close_matches(value, names, n=1)
    return f" (did you mean {found[0]!r}?)" if found else ""
