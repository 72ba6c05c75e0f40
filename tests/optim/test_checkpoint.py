"""consolidate_state_dict / state_dict / load_state_dict across world sizes 2 -> 3 and 2 -> 1."""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers.dist import run_distributed
from tests.helpers.optim_cases import ADAMW_LR, MUON_LR, MUON_SHAPES, Oracle, run_dist_case
from tests.optim._jobs_dist_optim import RESUME_STEPS, SAVE_SPEC, SAVE_STEPS, job_resume, job_save
from tests.optim.test_dist_optim import assert_snaps_equal

N_MUON = len(MUON_SHAPES)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[str, list[dict], Oracle]:
    """Two ranks run SAVE_STEPS, consolidate, rank 0 writes opt.pt; plus the torch oracle after the same steps."""
    path = str(tmp_path_factory.mktemp("ckpt"))
    by_rank = run_distributed(job_save, 2, path, timeout=120)
    return path, by_rank, Oracle(SAVE_SPEC).run(SAVE_STEPS, 2)


@pytest.mark.timeout(150)
def test_consolidated_state_equals_torch_state(saved):
    path, by_rank, oracle = saved
    # ZeRO-1: momentum only for owned matrices. Full chunks: slot i is rank i's; a bucket's partial last
    # chunk continues the round-robin, so owners balance: 5 tall -> 3+2, 2 wide -> 1+1, 1 square -> 0+1.
    assert [r["n_muon_state"] for r in by_rank] == [4, 4]
    sd = torch.load(os.path.join(path, "opt.pt"), weights_only=True)  # survives weights_only round trip
    muon_sd, adamw_sd = (o.state_dict() for o in oracle.opts)
    assert sorted(sd["state"]) == list(range(N_MUON + 4))
    for i in range(N_MUON):
        assert sd["state"][i].keys() == muon_sd["state"][i].keys()
        assert torch.equal(sd["state"][i]["momentum_buffer"], muon_sd["state"][i]["momentum_buffer"])
    for i in range(4):
        ours, theirs = sd["state"][N_MUON + i], adamw_sd["state"][i]
        assert ours.keys() == theirs.keys()
        for key in theirs:
            assert torch.equal(ours[key], theirs[key]), key
    assert [g["kind"] for g in sd["param_groups"]] == ["muon", "adamw"]
    assert sd["param_groups"][0]["lr"] == MUON_LR and sd["param_groups"][1]["lr"] == ADAMW_LR


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [1, 3])
def test_resume_on_other_world_size(saved, world):
    path, _, _ = saved
    oracle = Oracle(SAVE_SPEC).run(SAVE_STEPS, 2).run(RESUME_STEPS, world)
    want = oracle.snaps[len(SAVE_STEPS) :]
    if world == 1:
        by_rank = [job_resume(0, 1, path)]
    else:
        by_rank = run_distributed(job_resume, world, path, timeout=120)
    for res in by_rank:
        assert_snaps_equal(res["snaps"], want)


@pytest.mark.timeout(150)
def test_state_loads_into_torch_optimizers(saved):
    """The consolidated state is torch's format: split by group it loads into torch.optim.Muon / AdamW."""
    path, _, _ = saved
    sd = torch.load(os.path.join(path, "opt.pt"), weights_only=True)
    params = torch.load(os.path.join(path, "params.pt"), weights_only=True)
    ref = Oracle(SAVE_SPEC).run(SAVE_STEPS, 2).run(RESUME_STEPS, 2)
    resumed = Oracle(SAVE_SPEC)
    with torch.no_grad():
        for p, saved_p in zip(resumed.params, params, strict=True):
            p.copy_(saved_p)
    for gi, (opt, idxs) in enumerate(
        zip(resumed.opts, [range(N_MUON), range(N_MUON, N_MUON + 4)], strict=True)
    ):
        group = {k: v for k, v in sd["param_groups"][gi].items() if k != "kind"}
        group["params"] = list(range(len(idxs)))
        opt.load_state_dict(
            {"state": {i: sd["state"][j] for i, j in enumerate(idxs)}, "param_groups": [group]}
        )
    resumed.run(RESUME_STEPS, 2)
    assert_snaps_equal(resumed.snaps, ref.snaps[len(SAVE_STEPS) :])


def test_single_process_state_dict_round_trip(tmp_path):
    """W=1: state_dict() works without consolidate and equals torch's; load it into a fresh optimizer."""
    spec = dict(SAVE_SPEC)
    res = run_dist_case(spec, 0, 1, SAVE_STEPS)
    oracle = Oracle(spec).run(SAVE_STEPS, 1)
    sd = res["opt"].state_dict()
    torch.save(sd, tmp_path / "opt.pt")
    sd = torch.load(tmp_path / "opt.pt", weights_only=True)
    assert torch.equal(
        sd["state"][N_MUON + 2]["exp_avg_sq"], oracle.opts[1].state_dict()["state"][2]["exp_avg_sq"]
    )
    cont = run_dist_case(spec, 0, 1, RESUME_STEPS, params=res["params"], state=sd)
    assert_snaps_equal(cont["snaps"], oracle.run(RESUME_STEPS, 1).snaps[len(SAVE_STEPS) :])


NORMUON_SPEC = {"kind": "muon", "ns_dtype": "float32", "normuon": 0.9}


@pytest.mark.timeout(200)
def test_normuon_row_moments_are_saved_whole_and_resume_on_other_world_sizes(tmp_path):
    """NorMuon's per-row second moments (state "normuon_v", (rows, 1)) consolidate from their owners like the
    momentum, and a resume at 1 and 3 ranks from 2 ranks' state continues the paper's algorithm (the oracle run
    straight through), within test_dist_optim's NORMUON_TOLERANCE."""
    from tests.optim.test_dist_optim import NORMUON_TOLERANCE

    run_distributed(job_save, 2, str(tmp_path), NORMUON_SPEC, timeout=120)
    oracle = Oracle(NORMUON_SPEC).run(SAVE_STEPS, 2)
    sd = torch.load(tmp_path / "opt.pt", weights_only=True)
    want = oracle.opts[0].state
    for i, p in enumerate(oracle.params[:N_MUON]):
        assert sd["state"][i]["normuon_v"].shape == (p.shape[0], 1)
        torch.testing.assert_close(sd["state"][i]["normuon_v"], want[p]["normuon_v"], **NORMUON_TOLERANCE)
    for world in (1, 3):  # the averaged gradients depend on the world size: one oracle each
        want = Oracle(NORMUON_SPEC).run(SAVE_STEPS, 2).run(RESUME_STEPS, world).snaps[len(SAVE_STEPS) :]
        by_rank = (
            [job_resume(0, 1, str(tmp_path), NORMUON_SPEC)]
            if world == 1
            else run_distributed(job_resume, world, str(tmp_path), NORMUON_SPEC, timeout=120)
        )
        for res in by_rank:
            assert_snaps_equal(res["snaps"], want, **NORMUON_TOLERANCE)
