"""A collective that cannot complete is one line naming the rank and the collective, not a bare backend
error (gloo says only "Timed out waiting 2000ms for recv operation to complete")."""

from __future__ import annotations

import pytest

from tests.distributed._jobs_collective_failures import job_one_rank_never_comes
from tests.helpers.dist import run_distributed


@pytest.mark.timeout(120)
def test_a_timed_out_collective_names_the_rank_and_the_collective():
    message = run_distributed(job_one_rank_never_comes, 2, timeout=90)[0]
    assert message.startswith("rank 0: all_reduce over 2 ranks timed out waiting for the others"), message
    assert "trainer.strategy.init_args.timeout" in message
