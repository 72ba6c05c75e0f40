import math
import re

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
        (dict(depth=0), "GPTConfig: depth=0 is not accepted; set depth to an integer >= 1"),
    ],
)
def test_bad_config_one_line_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        GPTConfig(**kwargs)
    assert "\n" not in str(info.value)


def test_input_longer_than_context_is_rejected():
    model = tiny()
    with pytest.raises(
        AssertionError, match="exceeds the context"
    ):  # an assert: forward reads no batch's values
        model(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize(
    "idx,expected",
    [
        (torch.tensor([[100, 300, 32]]), r"token id 300 is outside the model's vocabulary \(0..256\)"),
        (torch.tensor([[-1, 3]]), r"token id -1 is outside"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_named_by_generate(idx, expected):
    with pytest.raises(ConfigError, match=expected):
        tiny().generate(idx, max_new_tokens=2)


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


def _complex_rotation(x: torch.Tensor, position: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary embedding written another way (the oracle): pair i of the head, (x_i, x_{i+D/2}), as a complex number
    turned by angle position x base**(-i/(D/2)) (clockwise, as distlab's tables are laid out)."""
    d = x.shape[-1] // 2
    freqs = base ** (-torch.arange(d, dtype=torch.float64) / d)
    angle = position[:, None].double() * freqs[None]  # (T, D/2)
    z = torch.complex(x[..., :d].double(), x[..., d:].double()) * torch.polar(torch.ones_like(angle), -angle)
    return torch.cat([z.real, z.imag], dim=-1)


@pytest.mark.parametrize("head_dim", [2, 8, 16, 64])
def test_rotary_is_a_rotation_by_position_and_attention_sees_only_distances(head_dim):
    """apply_rotary with the model's own tables equals a complex-number rotation written independently; it keeps each
    vector's length, and a query/key dot product depends only on their distance (shifting both positions by s
    changes nothing): the property rotary embeddings exist for."""
    from distlab.models.gpt import apply_rotary

    torch.manual_seed(head_dim)
    T = 24
    model = GPT(GPTConfig(depth=1, n_embd=head_dim * 2, n_head=2, sequence_len=T))
    cos, sin = model._rotary_tables(T)
    cos, sin = cos.double(), sin.double()
    q, k = (
        torch.randn(1, 1, T, head_dim, dtype=torch.float64),
        torch.randn(1, 1, T, head_dim, dtype=torch.float64),
    )
    rq = apply_rotary(q, cos, sin)
    torch.testing.assert_close(rq, _complex_rotation(q, torch.arange(T)), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    same_q, same_k = q[..., :1, :].expand_as(q), k[..., :1, :].expand_as(k)  # one vector at every position
    scores = apply_rotary(same_q, cos, sin) @ apply_rotary(same_k, cos, sin).transpose(-1, -2)  # (T, T)
    for shift in (1, 5):
        torch.testing.assert_close(
            scores[..., shift:, shift:], scores[..., :-shift, :-shift], rtol=1e-5, atol=1e-5
        )


def test_flops_of_a_batch_count_its_own_length():
    """GPTLightningModule.flops_of a (B, T) batch shorter than the context counts attention over T, not
    over sequence_len: (6N + 12·L·C·T)·B·T by hand (MFU would read high when data.seq_len < model.sequence_len)."""
    from distlab.modules import GPTLightningModule

    module = GPTLightningModule(depth=2, n_embd=64, n_head=4, sequence_len=32)
    model = module.model
    C, L, V = 64, 2, model.config.vocab_size
    matmul_params = L * (4 * C * C + 2 * 4 * C * C) + V * C
    for B, T in ((3, 32), (2, 8), (5, 1)):
        x = torch.zeros(B, T, dtype=torch.long)
        expected = (6 * matmul_params + 12 * L * C * T) * B * T
        assert module.flops_of((x, x)) == expected, (B, T)
        module.training_step((x, x), 0)  # Lightning's convention: a number, for the latest training batch
        assert module.flops_per_batch == expected, (B, T)


def test_distlab_modules_refuse_data_of_another_kind_from_python(tmp_path):
    """A fit from Python (no CLI preflight): the GPT on the digits, a vocabulary smaller than the data's token ids,
    the classifier on text, each end in distlab's one-line ConfigError at fit start, not deep in the forward pass."""
    import lightning as L

    from distlab.data import DigitsDataModule, TextDataModule
    from distlab.errors import ConfigError
    from distlab.modules import GPTLightningModule, ImageClassifier

    tiny = dict(depth=1, sequence_len=16, head_dim=16, aspect_ratio=32)
    text = TextDataModule(seq_len=16, batch_size=2)
    cases = (
        (GPTLightningModule(**tiny), DigitsDataModule(), "trains on (B, T) token batches"),
        (GPTLightningModule(**tiny, vocab_size=128), text, "but model.vocab_size=128"),
        (ImageClassifier(), text, "trains on (images, labels) batches"),
        (
            ImageClassifier(n_classes=5),
            DigitsDataModule(),
            "model.n_classes=5 but the digits data has 10 labels",
        ),
    )
    for module, data, expected in cases:
        trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=tmp_path)  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(expected)):
            trainer.fit(module, data)


def test_a_digits_loader_asked_before_setup_is_built():
    """A notebook's ``DigitsDataModule().train_dataloader()`` before any Trainer called setup: the split is made."""
    from distlab.data import DigitsDataModule

    dm = DigitsDataModule(batch_size=16)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape[0] == 16 and len(dm.val_dataloader()) > 0


def test_a_temperature_too_small_to_divide_by_samples_the_top_token():
    """1e-40 lies in the declared domain (>= 0); the division overflows to inf, which must not become NaN."""
    model = tiny()
    idx = torch.tensor([[1, 2, 3]])
    tiny_t = model.generate(
        idx, max_new_tokens=4, temperature=1e-40, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(tiny_t, model.generate(idx, max_new_tokens=4, temperature=0.0))


def test_generate_builds_no_autograd_graph():
    """Sampling runs under no_grad: every forward it makes records nothing for backward (a graph kept per token
    would grow memory with every step of a long sample)."""
    model = tiny()
    seen = []
    model.register_forward_hook(lambda *_: seen.append(torch.is_grad_enabled()))
    out = model.generate(torch.randint(0, 257, (1, 3)), 4, temperature=0.0)
    assert seen and not any(seen) and not out.requires_grad, seen


def test_generate_refuses_a_top_k_beyond_the_vocabulary_before_sampling():
    """top_k past the vocabulary would sample from all of it without a word: named with the vocabulary's size
    (the other sampling settings are the generated suite's: tests/cli/test_domains.py walks GPT.generate)."""
    model = tiny()
    with pytest.raises(
        ConfigError, match=r"GPT.generate: top_k=258 is more than the model's vocabulary \(257"
    ):
        model.generate(torch.tensor([[1, 2]]), 2, top_k=258)
    assert model.generate(torch.tensor([[1, 2]]), 2, top_k=257).shape == (1, 4)  # the whole vocabulary: taken


def test_orthogonalizer_and_normuon_reach_the_matrix_group():
    from distlab.errors import ConfigError
    from distlab.modules import GPTLightningModule
    from tests.helpers.optim_cases import POLAR_EXPRESS

    groups = {
        g["name"]: g for g in GPTLightningModule(depth=1, orthogonalizer="polar_express").param_groups()
    }
    assert [tuple(t) for t in groups["matrix"]["ns_coefficients"]] == POLAR_EXPRESS
    assert groups["matrix"]["ns_steps"] == 5
    assert (
        "ns_coefficients" not in GPTLightningModule(depth=1).param_groups()[-1]
    )  # torch's quintic by default
    with pytest.raises(ConfigError, match="model.orthogonalizer=polar_express .* set model.optimizer=muon"):
        GPTLightningModule(depth=1, optimizer="adamw", orthogonalizer="polar_express")
    matrix = GPTLightningModule(depth=1, normuon_beta2=0.9).param_groups()[-1]
    assert matrix["name"] == "matrix" and matrix["normuon_beta2"] == 0.9
    with pytest.raises(ConfigError, match="model.normuon_beta2=0.9 .* set model.optimizer=muon"):
        GPTLightningModule(depth=1, optimizer="adamw", normuon_beta2=0.9)
