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


def shown_briefly(value: object, limit: int = 100) -> str:
    """A value as a one-line message shows it: a tensor or array by its kind and shape, a long text by its start
    and end (a line, not a page)."""
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, (str, bytes)):
        return f"a {type(value).__name__} of shape {tuple(shape)}"
    return abbreviated(" ".join(repr(value).split()), limit)


def abbreviated(text: str, limit: int = 100) -> str:
    """``text``, or past ``limit`` characters its start and end with its length: a line, not a page."""
    return text if len(text) <= limit else f"{text[:60]}...{text[-25:]} ({len(text)} characters)"
