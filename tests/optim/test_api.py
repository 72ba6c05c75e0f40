"""Single-process API checks: Newton-Schulz bit-identity, argument validation, closure, grad_sync setter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz

from distlab.optim import DistAdamW, DistMuon, DistMuonAdamW, adjust_lr, newton_schulz
from distlab.perf import native_bf16_matmul


@pytest.mark.parametrize("shape", [(16, 5), (5, 16), (7, 7), (1, 9)])
def test_newton_schulz_bit_identical_to_torch(shape):
    G = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    coeffs = (3.4445, -4.7750, 2.0315)
    assert torch.equal(newton_schulz(G), _zeropower_via_newtonschulz(G, coeffs, 5, 1e-7))
    Gb = G.bfloat16()
    before = Gb.clone()
    newton_schulz(Gb)
    assert torch.equal(Gb, before)  # never modifies its input (torch's divides in place)
    for fn in (None, "original", "match_rms_adamw"):
        assert adjust_lr(0.02, fn, torch.Size(shape)) == _adjust_lr(0.02, fn, torch.Size(shape))


@pytest.mark.parametrize("shape,steps", [((16, 40), 5), ((40, 16), 5), ((24, 24), 3), ((3, 7, 2, 2), 5)])
def test_optimizer_counts_the_newton_schulz_flops_torch_counts(shape, steps):
    """``DistMuon.flops`` (what SpeedMonitor reads) equals torch's own FLOP counter over a step."""
    from torch.utils.flop_counter import FlopCounterMode

    w = torch.nn.Parameter(torch.randn(shape, generator=torch.Generator().manual_seed(0)))
    w.grad = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    opt = DistMuon([w], ns_steps=steps, ns_dtype=torch.float32)
    with FlopCounterMode(display=False) as counter:
        opt.step()
    assert counter.get_total_flops() > 0
    assert opt.flops == counter.get_total_flops()
    opt.step()
    assert opt.flops == 2 * counter.get_total_flops()  # cumulative


def test_bad_args_raise_clear_value_errors():
    w, b = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))
    with pytest.raises(ValueError, match=r"grad_sync='?foo'?.*'reduce', 'averaged'"):
        DistMuon([w], grad_sync="foo")
    with pytest.raises(ValueError, match=r"2-D.*\(3,\).*adamw"):
        DistMuon([b])
    with pytest.raises(ValueError, match=r"lr=-0.1"):
        DistMuon([w], lr=-0.1)
    with pytest.raises(ValueError, match=r"lr=-1"):
        DistAdamW([b], lr=-1)
    with pytest.raises(ValueError, match="amsgrad=True"):
        DistMuonAdamW([{"params": [b], "kind": "adamw", "amsgrad": True}])
    with pytest.raises(
        ValueError, match="this one has no kind; build the groups with distlab.optim.muon_param_groups"
    ):
        DistMuonAdamW([{"params": [b]}])
    with pytest.raises(ValueError, match="kind='sgd' is not supported"):
        DistMuonAdamW([{"params": [b], "kind": "sgd"}])
    with pytest.raises(ValueError, match="ns_dtype='?int8'?"):
        DistMuon([w], ns_dtype="int8")
    with pytest.raises(ValueError, match="adjust_lr_fn='?x'?"):
        DistMuon([w], adjust_lr_fn="x")
    with pytest.raises(ValueError, match="betas"):
        DistAdamW([b], betas=(0.9, 1.0))
    opt = DistMuon([w])
    with pytest.raises(ValueError, match="grad_sync='?bar'?"):
        opt.grad_sync = "bar"
    opt.grad_sync = "averaged"
    assert opt.grad_sync == "averaged"


def test_ns_dtype_defaults_and_strings():
    w = torch.nn.Parameter(torch.randn(4, 3))
    assert DistMuon([w]).ns_dtype is None  # resolved per param (bf16 where the device multiplies it natively)
    assert DistMuon([w], ns_dtype="bfloat16").ns_dtype == torch.bfloat16
    assert DistMuon([w], ns_dtype=torch.float32).ns_dtype == torch.float32
    assert DistMuon([w], ns_dtype="float32").flops_dtype == torch.float32
    assert DistAdamW([torch.nn.Parameter(torch.randn(3))]).flops_dtype is None  # no Muon, no matmuls


@pytest.mark.parametrize(
    "caps, expected",
    [
        ({"avx512_bf16": True, "avx512_f": True}, torch.bfloat16),  # e.g. AMD Zen 4, Intel Cooper Lake
        ({"amx_bf16": True}, torch.bfloat16),  # Intel Sapphire Rapids
        ({"avx512_f": True, "avx512_bf16": False}, torch.float32),  # Skylake-X: bf16 emulated, far slower
        ({"architecture": "aarch64"}, torch.float32),
    ],
)
def test_cpu_default_ns_dtype_is_bf16_only_with_native_bf16_matmul(monkeypatch, caps, expected):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    w = torch.nn.Parameter(torch.randn(4, 3))
    assert DistMuon([w])._resolved_ns_dtype(w) == expected
    assert DistMuon([w]).flops_dtype == expected  # what SpeedMonitor measures its matmuls against


@pytest.mark.parametrize(
    "capability, native", [((7, 0), False), ((7, 5), False), ((8, 0), True), ((9, 0), True)]
)
def test_cuda_counts_as_native_bf16_from_ampere_on(monkeypatch, capability, native):
    """V100 (7.0) and T4 (7.5) emulate bf16 matmul; A100 (8.0) and H100 (9.0) have it. Other devices: emulating."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert native_bf16_matmul(torch.device("cuda", 0)) is native
    assert native_bf16_matmul(torch.device("mps")) is False


@pytest.mark.skipif(
    not Path("/proc/cpuinfo").exists(),
    reason="needs Linux's /proc/cpuinfo",
)
def test_native_bf16_matmul_agrees_with_the_kernel_cpu_flags():
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags |= set(line.split(":", 1)[1].split())
    assert native_bf16_matmul(torch.device("cpu")) == bool(flags & {"avx512_bf16", "amx_bf16"}), sorted(flags)


def test_closure_and_grad_none_skipped_like_torch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    ref = [p.detach().clone().requires_grad_() for p in model.parameters()]
    frozen = torch.nn.Parameter(torch.randn(3, 3))  # never gets a grad: skipped, no state, like torch
    mats = [model[0].weight, model[2].weight, frozen]
    rest = [model[0].bias, model[2].bias]
    opt = DistMuonAdamW(
        [{"params": mats, "kind": "muon", "lr": 0.02}, {"params": rest, "kind": "adamw"}],
        ns_dtype=torch.bfloat16,
    )
    t_muon, t_adamw = torch.optim.Muon([ref[0], ref[2]], lr=0.02), torch.optim.AdamW([ref[1], ref[3]])
    x, y = torch.randn(8, 6), torch.randn(8, 2)
    frozen_before = frozen.detach().clone()
    for _ in range(3):

        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        loss = opt.step(closure)
        assert loss.ndim == 0
        for o in (t_muon, t_adamw):
            o.zero_grad()
        h = torch.relu(x @ ref[0].T + ref[1])
        torch.nn.functional.mse_loss(h @ ref[2].T + ref[3], y).backward()
        t_muon.step()
        t_adamw.step()
    for p, r in zip(model.parameters(), ref, strict=True):
        assert torch.equal(p, r)
    assert torch.equal(frozen, frozen_before) and len(opt.state[frozen]) == 0


@pytest.mark.parametrize("cls", [DistAdamW, DistMuon, DistMuonAdamW], ids=lambda c: c.__name__)
def test_a_sparse_gradient_is_named_with_its_fix(cls):
    """An Embedding(sparse=True): torch's AdamW refuses sparse gradients in words; so do these, before any reshape."""
    from distlab.errors import ConfigError

    table = torch.nn.Embedding(10, 4, sparse=True)
    opt = (
        cls(table.parameters(), default_kind="adamw")
        if cls is DistMuonAdamW
        else cls(table.parameters(), lr=1e-3)
    )
    table(torch.tensor([1, 2, 3])).sum().backward()
    with pytest.raises(
        ConfigError, match=r"shape \(10, 4\) has a sparse gradient .* build it with sparse=False"
    ):
        opt.step()


def test_per_iteration_coefficients_apply_each_papers_quintic_to_the_singular_values():
    """Polar Express's claim, checked by the SVD (not by another Newton-Schulz): after normalising G by its Frobenius
    norm, the iteration maps each singular value s through p_5(...p_1(s)), p_k(s) = a_k s + b_k s^3 + c_k s^5, and
    keeps the singular vectors. Here in float64 on a tall and a wide matrix."""
    from distlab.optim import POLAR_EXPRESS_COEFFICIENTS, newton_schulz
    from tests.helpers.optim_cases import POLAR_EXPRESS

    torch.manual_seed(0)
    for shape in [(24, 10), (7, 19)]:
        G = torch.randn(*shape, dtype=torch.float64)
        U, S, Vh = torch.linalg.svd(G / G.norm(), full_matrices=False)
        for a, b, c in POLAR_EXPRESS:
            S = a * S + b * S**3 + c * S**5
        expected = U @ torch.diag(S) @ Vh
        got = newton_schulz(G, POLAR_EXPRESS_COEFFICIENTS, steps=5, dtype=torch.float64)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
        assert S.min() > 0.85 and S.max() < 1.15  # near-orthogonal after 5 steps


def test_per_iteration_coefficients_need_as_many_steps():
    from distlab.optim import POLAR_EXPRESS_COEFFICIENTS

    w = torch.nn.Parameter(torch.randn(4, 3))
    with pytest.raises(ValueError, match="holds 5 per-iteration triples but ns_steps=4; set ns_steps=5"):
        DistMuon([w], ns_coefficients=POLAR_EXPRESS_COEFFICIENTS, ns_steps=4)


def test_a_param_whose_storage_is_replaced_between_steps_is_updated_where_it_now_lives():
    """Module.to() and .half() swap ``p.data``; the optimizer keeps views of its params between steps and must follow
    the swap (an update written to the old storage would be lost without a word). Compared with torch's AdamW."""
    ours, theirs = torch.nn.Parameter(torch.ones(5)), torch.nn.Parameter(torch.ones(5))
    opts = [DistAdamW([ours], lr=0.1), torch.optim.AdamW([theirs], lr=0.1)]
    for step in range(3):
        if step == 1:
            ours.data, theirs.data = torch.zeros(5), torch.zeros(5)
        for p, opt in zip((ours, theirs), opts, strict=True):
            p.grad = torch.full((5,), 1.0 + step)
            opt.step()
    assert torch.equal(ours, theirs)


def test_normuon_leaves_a_matrix_with_a_zero_gradient_as_it_is():
    """A zero gradient (a zero-initialised projection's first step) orthogonalises to zero; NorMuon's rescaling to an
    orthogonal matrix's norm divides by that zero norm: the update must be zero, not NaN (weight decay aside)."""
    from tests.helpers.optim_cases import ReferenceMuon

    ours, theirs = (torch.nn.Parameter(torch.ones(4, 3)) for _ in range(2))
    opts = [
        DistMuon([ours], normuon_beta2=0.9, ns_dtype="float32"),
        ReferenceMuon([theirs], normuon_beta2=0.9),
    ]
    for step in range(3):
        for p, opt in zip((ours, theirs), opts, strict=True):
            p.grad = torch.zeros(4, 3) if step < 2 else torch.arange(12.0).view(4, 3)
            opt.step()
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_a_parameter_in_two_groups_is_named_by_shape_and_groups():
    from distlab.errors import ConfigError

    w, b = torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(
        ConfigError, match=r"shape \(3, 2\) is in param group 0 and again in group 1 \(kind='adamw'\)"
    ):
        DistMuonAdamW([{"kind": "muon", "params": [w]}, {"kind": "adamw", "params": [b, w]}])
    DistMuonAdamW([{"kind": "muon", "params": [w]}, {"kind": "adamw", "params": [b]}])  # each once: accepted


@pytest.mark.parametrize("cls, kind", [(DistMuonAdamW, "muon"), (DistMuon, "muon"), (DistAdamW, "adamw")])
def test_a_group_given_its_params_as_a_generator_keeps_them(cls, kind):
    """torch's optimizers take any iterable of params in a group; a generator was read once by the empty-input check,
    and the group then held no params: nothing trained, nothing said."""
    w = torch.nn.Parameter(torch.randn(4, 3))
    group = {"params": (p for p in [w])}
    if cls is DistMuonAdamW:
        group["kind"] = kind
    opt = cls([group])
    assert [len(g["params"]) for g in opt.param_groups] == [1]
    assert opt.param_groups[0]["params"][0] is w
