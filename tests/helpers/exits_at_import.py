"""A user's script given as a model module: its unguarded top-level code calls sys.exit when it is imported
(tests/cli/test_bad_inputs.py checks that distlab says so)."""

import sys

sys.exit(3)
