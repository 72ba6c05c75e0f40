"""Errors the CLI turns into one-line messages and a non-zero exit."""

import re

# torch's DataLoader re-raises a worker's exception as the same class with this text and the worker's traceback
_FROM_A_LOADER_WORKER = re.compile(r"Caught \w+ in DataLoader worker process \d+\.\nOriginal Traceback")


class ConfigError(ValueError):
    """A configuration value is invalid. The message says what, the value seen, and what to set.

    Raised in a DataLoader worker process, it reaches the main process (torch re-raises it there as a new
    ConfigError of "Caught ConfigError in DataLoader worker process 0." and the worker's traceback) with its own
    one line again: the line is the message, the traceback is the worker's plumbing."""

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str) and _FROM_A_LOADER_WORKER.match(args[0]):
            last = args[0].rstrip().splitlines()[-1]  # "distlab.errors.ConfigError: <the worker's message>"
            args = (last.split(": ", 1)[1] if ": " in last else last,)
        super().__init__(*args)


class DistlabError(RuntimeError):
    """A run-time failure whose message says it all (which rank, what, what to do): the CLI prints it as one line."""


def abbreviated(text: str, limit: int = 100) -> str:
    """``text``, or past ``limit`` characters its start and end with its length: a line, not a page."""
    return text if len(text) <= limit else f"{text[:60]}...{text[-25:]} ({len(text)} characters)"
