"""Tests use the package's multi-rank harness (also used by the benchmark scripts)."""

from distlab.testing import free_port, run_distributed

__all__ = ["free_port", "run_distributed"]
