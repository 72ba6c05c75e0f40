"""Errors the CLI turns into one-line messages and a non-zero exit."""


class ConfigError(ValueError):
    """A configuration value is invalid. The message says what, the value seen, and what to set."""


class DistlabError(RuntimeError):
    """A run-time failure whose message says it all (which rank, what, what to do): the CLI prints it as one line."""
