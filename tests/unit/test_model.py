import math

import pytest
import torch

from distlab.errors import ConfigError
from distlab.models.gpt import GPT, GPTConfig


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{"depth": 2, "aspect_ratio": 32, "head_dim": 16, "sequence_len": 16, **kw}))


def test_depth_derives_width_and_heads():
    cfg = GPTConfig(depth=4)
    assert (cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.n_layer) == (256, 4, 4, 4)
    cfg = GPTConfig(depth=3, aspect_ratio=50, head_dim=64)  # 150 rounds up to 192
    assert (cfg.n_embd, cfg.n_head) == (192, 3)
    assert GPTConfig(depth=2, n_embd=96, n_head=6).n_head == 6  # explicit override wins


def test_forward_shapes_and_initial_loss():
    model = tiny()
    idx = torch.randint(0, 257, (3, 16))
    logits = model(idx)
    assert logits.shape == (3, 16, 257)
    assert logits.abs().max() <= model.config.logit_softcap  # soft-capped
    loss = model(idx, targets=idx)
    # Near-uniform at init (tiny LM head, zeroed output projections): loss ~ ln(vocab).
    assert abs(loss.item() - math.log(257)) < 0.05
    per_token = model(idx, targets=idx, reduction="none")
    assert per_token.shape == (48,)


def test_causality_future_tokens_do_not_change_past_logits():
    model = tiny()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # make the zero-initialised projections non-trivial
    a = torch.randint(0, 257, (1, 16))
    b = a.clone()
    b[0, 10:] = (b[0, 10:] + 1) % 257
    torch.testing.assert_close(model(a)[:, :10], model(b)[:, :10])
    assert not torch.allclose(model(a)[:, 10:], model(b)[:, 10:])


def test_output_projections_zero_initialised_and_no_biases():
    model = tiny()
    for block in model.blocks:
        assert torch.count_nonzero(block.attn.c_proj.weight) == 0
        assert torch.count_nonzero(block.mlp.c_proj.weight) == 0
    assert all(p.ndim == 2 for p in model.parameters())  # no biases, no norm weights
    assert model.wte.weight.data_ptr() != model.lm_head.weight.data_ptr()  # untied


def test_param_groups_cover_every_parameter_once():
    from distlab.optim import split_params

    model = tiny(n_kv_head=1)
    roles = {role: [p for _, p in members] for role, members in split_params(model).items()}
    ids = [id(p) for ps in roles.values() for p in ps]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert all(p.ndim == 2 for p in roles["muon"])
    assert roles["embedding"] == [model.wte.weight] and roles["head"] == [model.lm_head.weight]


def test_flops_per_token_matches_hand_count():
    cfg = GPTConfig(depth=2, n_embd=64, n_head=4, sequence_len=32)
    model = GPT(cfg)
    C, L, V, T = 64, 2, cfg.vocab_size, 32
    matmul_params = L * (4 * C * C + 2 * 4 * C * C) + V * C  # attention + MLP + LM head
    assert model.flops_per_token() == 6 * matmul_params + 12 * L * C * T


def test_generate_greedy_and_topk_sampling():
    model = tiny()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    prompt = torch.randint(0, 257, (2, 5))
    greedy = model.generate(prompt, 8, temperature=0.0)
    assert greedy.shape == (2, 13) and torch.equal(greedy[:, :5], prompt)
    # top_k=1 sampling is greedy whatever the temperature.
    assert torch.equal(model.generate(prompt, 8, temperature=1.7, top_k=1), greedy)
    # Sampling is reproducible from a generator and never leaves the top-k set.
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    s1 = model.generate(prompt, 8, temperature=1.0, top_k=5, generator=g1)
    assert torch.equal(s1, model.generate(prompt, 8, temperature=1.0, top_k=5, generator=g2))
    logits = model(s1[:, :5])[:, -1]
    for b in range(2):
        assert s1[b, 5].item() in logits[b].topk(5).indices.tolist()
    # Long generations crop the context to sequence_len instead of failing.
    assert model.generate(prompt, 20, temperature=0.0).shape == (2, 25)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(depth=2, n_embd=100, n_head=3), "not divisible by n_head"),
        (dict(depth=2, n_embd=96, n_head=4, n_kv_head=3), "not divisible by n_kv_head"),
        (dict(depth=0), "depth must be >= 1"),
    ],
)
def test_bad_config_one_line_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        GPTConfig(**kwargs)
    assert "\n" not in str(info.value)


def test_input_longer_than_context_is_rejected():
    model = tiny()
    with pytest.raises(ValueError, match="exceeds the model context"):
        model(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("module_name", ["GPTLightningModule", "ImageClassifier"])
@pytest.mark.parametrize("name", ["float32", "bfloat16", "auto"])
@pytest.mark.parametrize("host_bf16", [True, False])
def test_module_ns_dtype_reaches_the_optimizer(monkeypatch, module_name, name, host_bf16):
    import lightning as L

    import distlab.modules

    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": host_bf16})
    cls = getattr(distlab.modules, module_name)
    sizes = (
        dict(depth=1, sequence_len=16, aspect_ratio=32, head_dim=16) if module_name.startswith("GPT") else {}
    )
    module = cls(**sizes, ns_dtype=name)
    module.trainer = L.Trainer(
        max_steps=10, logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    optimizer = module.configure_optimizers()["optimizer"]
    expected = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(
        name, torch.bfloat16 if host_bf16 else torch.float32
    )
    assert optimizer.flops_dtype == expected
    with pytest.raises(ConfigError, match="ns_dtype=fp8 is not accepted; set ns_dtype to one of"):
        cls(**sizes, ns_dtype="fp8")
