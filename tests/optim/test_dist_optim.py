"""DistMuon / DistAdamW / DistMuonAdamW on 1, 2 and 3 gloo ranks against single-process torch oracles.

All oracle comparisons are bit-exact (torch.equal): gradients are integers / 64, so the averaged gradient
is the same on both sides (see tests/helpers/optim_cases.py), except clipping, where the global norm is summed in
a different order (sum of squares of shards vs torch's norm of per-tensor norms): rtol 1e-5.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.dist import run_distributed
from tests.helpers.optim_cases import MUON_SHAPES, Oracle, averaged_grad_norm, shapes
from tests.optim._jobs_dist_optim import CASES, STEPS, job_all_cases

WORLDS = [1, 2, 3]


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"world{w}")
def results(request) -> tuple[int, list[dict]]:
    """One spawned job per world size runs every case; W=1 runs in-process (torch.distributed not initialised)."""
    world = request.param
    if world == 1:
        return world, [job_all_cases(0, 1)]
    return world, run_distributed(job_all_cases, world, timeout=150)


def assert_snaps_equal(got: list[list[torch.Tensor]], want: list[list[torch.Tensor]], **tol) -> None:
    assert len(got) == len(want)
    for step, (g_step, w_step) in enumerate(zip(got, want, strict=True)):
        for j, (g, w) in enumerate(zip(g_step, w_step, strict=True)):
            if tol:
                torch.testing.assert_close(g, w, **tol, msg=lambda m, s=step, j=j: f"step {s} param {j}: {m}")
            else:
                assert torch.equal(g, w), f"step {step} param {j}: max diff {(g - w).abs().max().item()}"


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "case", ["muon", "adamw", "mixed_sched", "nones", "mixed_pieces", "nones_pieces", "mixed_runs"]
)
def test_matches_torch_oracle(results, case):
    """DistMuon / DistAdamW / DistMuonAdamW(+LambdaLR) / missing grads == torch Muon+AdamW on the averaged grad."""
    world, by_rank = results
    oracle = Oracle(CASES[case]).run(STEPS, world)
    for res in by_rank:
        assert_snaps_equal(res[case]["snaps"], oracle.snaps)


# batch_ns=True: a batched matmul chain rounds its last bits otherwise than one matrix at a time (the guarantee)
BATCHED_TOLERANCE = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", ["muon_batched", "muon_fp32_batched", "mixed_batched"])
def test_batched_newton_schulz_matches_torch_within_the_stated_tolerance(results, case):
    """batch_ns=True == torch Muon (+AdamW) fed the averaged gradient, within BATCHED_TOLERANCE, at every world size
    (each rank batches the matrices it owns: 8 at one rank, fewer at 2 and 3)."""
    world, by_rank = results
    spec = CASES[case]
    oracle = Oracle({k: v for k, v in spec.items() if k not in ("batch_ns", "coalesce")}).run(STEPS, world)
    for res in by_rank:
        assert_snaps_equal(res[case]["snaps"], oracle.snaps, **BATCHED_TOLERANCE)


@pytest.mark.timeout(200)
def test_params_identical_across_ranks(results):
    world, by_rank = results
    if world == 1:
        pytest.skip("one rank: nothing to compare across ranks")
    assert len(by_rank) == world
    for case in CASES:
        for res in by_rank[1:]:
            assert_snaps_equal(res[case]["snaps"], by_rank[0][case]["snaps"])


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", ["muon", "adamw"])
def test_averaged_grad_sync_equals_reduce(results, case):
    """Both modes equal torch fed the averaged gradient. (Comparing the two modes with each other proved nothing
    at one rank, where both take the same branch; against torch, "averaged" at one process is a claim too.)"""
    world, by_rank = results
    oracle = Oracle(CASES[case]).run(STEPS, world)
    for res in by_rank:
        assert_snaps_equal(res[f"{case}_avg"]["snaps"], oracle.snaps)
        assert_snaps_equal(res[case]["snaps"], oracle.snaps)


@pytest.mark.timeout(200)
def test_muon_fp32_ns_matches_torch_algorithm_in_fp32(results):
    """torch.optim.Muon has no fp32 Newton-Schulz: the oracle is its algorithm written out with fp32 Newton-Schulz
    (tests/helpers/optim_cases.ReferenceMuon, equal to torch.optim.Muon in bf16 by test_properties), never
    distlab's own one-process path (with one rank that was the same code on the same inputs)."""
    world, by_rank = results
    oracle = Oracle(CASES["muon_fp32"]).run(STEPS, world)
    for res in by_rank:
        assert_snaps_equal(res["muon_fp32"]["snaps"], oracle.snaps)
    # and it really is a different (fp32) computation than the bf16 one
    assert not torch.equal(by_rank[0]["muon_fp32"]["snaps"][-1][0], by_rank[0]["muon"]["snaps"][-1][0])


@pytest.mark.timeout(200)
def test_polar_express_matches_the_papers_iteration(results):
    """ns_coefficients with one quintic per iteration (Polar Express) == the paper's iteration written out
    (ReferenceMuon with the paper's coefficients typed in the test helper), at every world size; and it is not the
    default iteration."""
    world, by_rank = results
    oracle = Oracle(CASES["muon_polar"]).run(STEPS, world)
    for res in by_rank:
        assert_snaps_equal(res["muon_polar"]["snaps"], oracle.snaps)
    assert not torch.equal(by_rank[0]["muon_polar"]["snaps"][-1][0], by_rank[0]["muon_fp32"]["snaps"][-1][0])


# NorMuon: the paper's math in another order of float32 operations (the oracle divides by the norm as a Python
# float; distlab keeps it a tensor and folds it into the update)
NORMUON_TOLERANCE = dict(rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(200)
def test_normuon_matches_the_papers_algorithm(results):
    """normuon_beta2 == NorMuon written from its paper (tests/helpers/optim_cases.ReferenceMuon: per-row second
    moments of the orthogonalised update, rows divided by their root, RMS 0.2 over the matrix; with adjust_lr_fn
    "original", an orthogonal matrix's norm), at every world size, within NORMUON_TOLERANCE; and it is not Muon."""
    world, by_rank = results
    for case in ("muon_normuon", "muon_normuon_original"):
        oracle = Oracle(CASES[case]).run(STEPS, world)
        for res in by_rank:
            assert_snaps_equal(res[case]["snaps"], oracle.snaps, **NORMUON_TOLERANCE)
    muon = by_rank[0]["muon_fp32"]["snaps"][-1][0]
    assert (by_rank[0]["muon_normuon"]["snaps"][-1][0] - muon).abs().max() > 1e-3


@pytest.mark.timeout(200)
def test_clipping_matches_clip_grad_norm(results):
    """Rank 1 has a 1024x gradient; global-norm clipping must match clip_grad_norm_ on the averaged grads."""
    world, by_rank = results
    oracle = Oracle(CASES["clip"]).run(STEPS, world)
    for res in by_rank:
        norms = torch.stack(res["clip"]["norms"])
        torch.testing.assert_close(norms, torch.stack(oracle.norms), rtol=1e-5, atol=0)
        assert (norms > 1.0).all()  # clipping was active on every step
        assert_snaps_equal(res["clip"]["snaps"], oracle.snaps, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", ["norm", "norm_pieces", "norm_avg"])
def test_synced_gradient_is_the_average(results, case):
    """The gradient the optimizer works with has the global norm of the *averaged* gradient (a sum over ranks
    would be W times larger, which Muon's orthogonalisation and Adam's normalisation would almost hide)."""
    world, by_rank = results
    for res in by_rank:
        norms = torch.stack(res[case]["norms"])
        want = torch.stack([averaged_grad_norm(CASES[case], s, world) for s in STEPS])
        torch.testing.assert_close(norms, want, rtol=1e-5, atol=0)
        assert_snaps_equal(res[case]["snaps"], Oracle(CASES[case]).run(STEPS, world).snaps)  # never clipped


def _expected_bytes(world: int, case: str) -> tuple[float, float]:
    """(reduce_scatter + all_gather bytes with padding, the same without padding) for one step."""
    W, frac = world, (world - 1) / world
    padded = unpadded = 0
    if case.startswith("muon"):
        for shape in dict.fromkeys(MUON_SHAPES):
            count, numel = MUON_SHAPES.count(shape), shape[0] * shape[1]
            padded += -(-count // W) * W * numel
            unpadded += count * numel
    else:
        for s in shapes(CASES[case]):
            numel = int(torch.Size(s).numel())
            padded += -(-numel // W) * W
            unpadded += numel
    return frac * padded * 4, frac * unpadded * 4


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", ["muon", "adamw"])
def test_logical_comm_bytes(results, case):
    world, by_rank = results
    padded, unpadded = _expected_bytes(world, case)
    for res in by_rank:
        steps = zip(res[case]["comm"], res[f"{case}_avg"]["comm"], strict=True)
        for step, (reduce_step, avg_step) in enumerate(steps):
            if world == 1:
                assert reduce_step == {} and avg_step == {}
                continue
            # An explicit "averaged" all-gathers a gradient checksum per rank (two float64) at step 0 (its
            # self-check); an explicit "reduce" needs none (averaging what is already averaged is harmless).
            check = (world - 1) * 2 * 8 if step == 0 else 0
            # "reduce": reduce_scatter + all_gather = 2(W-1)/W * P * 4 (+ padding); "averaged": all_gather only.
            # Muon's updates are gathered in Newton-Schulz's dtype (bf16: half the bytes of the fp32 gradients).
            gathered = padded * res[case]["update_itemsize"] / 4 if case == "muon" else padded
            assert reduce_step["reduce_scatter"]["bytes"] == pytest.approx(padded)
            assert reduce_step["all_gather"]["bytes"] == pytest.approx(gathered)
            assert "reduce_scatter" not in avg_step
            assert avg_step["all_gather"]["bytes"] == pytest.approx(gathered + check)
            assert padded >= unpadded
            # the only other traffic is one tiny all_reduce of per-param "has grad" flags
            assert reduce_step["all_reduce"]["bytes"] <= 2 * 4 * 16
            # gloo: every piece in one reduce_scatter and one all_gather
            assert reduce_step["reduce_scatter"]["calls"] == 1
            assert reduce_step["all_gather"]["calls"] == 1


@pytest.mark.timeout(200)
def test_coalesced_and_per_piece_move_the_same_bytes(results):
    """coalesce=False: one collective per piece; the coalesced reduce_scatter split in runs: same bytes, same result
    as the coalesced default."""
    world, by_rank = results
    if world == 1:
        pytest.skip("one rank: no collectives to coalesce")
    counts = [MUON_SHAPES.count(shape) for shape in dict.fromkeys(MUON_SHAPES)]
    n_pieces = (
        sum(-(-c // world) for c in counts) + 4
    )  # Muon chunks of W same-shape matrices + 4 AdamW params
    for res in by_rank:
        assert_snaps_equal(res["mixed_pieces"]["snaps"], res["mixed"]["snaps"])
        for coalesced, pieces in zip(res["mixed"]["comm"], res["mixed_pieces"]["comm"], strict=True):
            # coalesced: one reduce_scatter, and one all_gather per dtype sent (fp32 AdamW parts, Muon updates
            # in Newton-Schulz's dtype)
            dtypes = 1 if res["mixed"]["update_itemsize"] == 4 else 2
            for op, calls in (("reduce_scatter", 1), ("all_gather", dtypes)):
                assert pieces[op]["bytes"] == pytest.approx(coalesced[op]["bytes"])
                assert coalesced[op]["calls"] == calls
                assert pieces[op]["calls"] == n_pieces
    # In runs (a new one once a run holds a third of Muon's elements, at a bucket's end; AdamW last), at W = 2 or 3:
    # the (8, 4) bucket (64 or 96 of 132 or 164 elements), then (4, 8) and (6, 6), then AdamW. The same bits.
    for res in by_rank:
        assert_snaps_equal(res["mixed_runs"]["snaps"], res["mixed"]["snaps"])
        for coalesced, runs in zip(res["mixed"]["comm"], res["mixed_runs"]["comm"], strict=True):
            assert runs["reduce_scatter"]["bytes"] == pytest.approx(coalesced["reduce_scatter"]["bytes"])
            assert runs["reduce_scatter"]["calls"] == 3
