"""Errors the CLI turns into one-line messages and a non-zero exit."""


class ConfigError(ValueError):
    """A configuration value is invalid. The message says what, the value seen, and what to set."""
