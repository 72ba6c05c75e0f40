"""Tests use the package's multi-rank harness (also used by the benchmark scripts)."""

from distlab.launch import free_port
from distlab.testing import run_distributed

__all__ = ["free_port", "run_distributed"]
