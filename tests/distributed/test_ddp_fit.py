"""2- and 3-process CPU (gloo) fits through the CLI: every rank ends with identical weights."""

from __future__ import annotations

import pytest
import torch

from distlab.cli import main
from tests.helpers.callbacks import load_rank_weights
from tests.helpers.cli import CONFIGS, rank_weights_config


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_spawn_fit_ranks_end_identical(tmp_path, world_size):
    weights = tmp_path / "weights"
    extra = rank_weights_config(tmp_path, weights, {"devices": world_size})
    main(
        [
            "fit",
            "--config",
            str(CONFIGS / "debug.yaml"),
            "--config",
            str(CONFIGS / "trainer" / "ddp_spawn_cpu.yaml"),
            "--config",
            extra,
            "--trainer.max_steps=6",
        ]
    )
    ranks = load_rank_weights(weights, world_size)
    assert [r["world_size"] for r in ranks] == [world_size] * world_size
    assert all(r["global_step"] == 6 for r in ranks)
    initial = torch.load(weights / "rank0.pt", weights_only=True)["state"]
    for r in ranks[1:]:
        assert r["state"].keys() == ranks[0]["state"].keys()
        for k, v in ranks[0]["state"].items():
            assert torch.equal(v, r["state"][k]), f"rank {r['rank']} differs from rank 0 at {k}"
    # Training actually moved the weights (zero-initialised projections became non-zero).
    assert any(torch.count_nonzero(v) > 0 for k, v in initial.items() if k.endswith("c_proj.weight"))
