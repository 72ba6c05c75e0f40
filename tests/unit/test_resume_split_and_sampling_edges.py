"""Guards for claims no earlier test held (audit 25): each test fails on one realistic mistake.

- DistMuonAdamW on one process trains a non-contiguous AdamW parameter exactly as torch.optim.AdamW does.
- A resume from ``best-step=N.ckpt`` in its own folder is allowed when that folder's last.ckpt is at step N too.
- A text folder's train/val split does not depend on how (or from where) the folder is named.
- A failed start's cleanup keeps a run folder that holds a checkpoint under checkpoints/.
- The GPT module's AdamW learning rates scale as 1/sqrt(n_embd / 768) across widths.
- ``GPT.generate`` predicts each token from the last ``sequence_len`` tokens.

Every oracle is computed here without the code under test.
"""

from __future__ import annotations

import math
import types
from pathlib import Path

import pytest
import torch
from torch import nn


def test_dist_muon_adamw_trains_a_non_contiguous_param_like_torch_adamw():
    """One process, an AdamW group holding a transposed (non-contiguous) parameter: after a few steps it equals
    torch.optim.AdamW on a clone with the same hyperparameters.

    Catches an update that lands in the contiguous copy the optimizer works on and is never written back into
    the parameter (the parameter would never train).
    """
    from distlab.optim import DistMuonAdamW

    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(4, 6).t())  # (6, 4), a transposed view: not contiguous
    assert not w.is_contiguous()
    ref = nn.Parameter(w.detach().clone())
    hyper = dict(lr=0.05, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt = DistMuonAdamW([dict(name="adamw", kind="adamw", params=[w], **hyper)])
    torch_opt = torch.optim.AdamW([ref], **hyper)
    target = torch.randn(6, 4)
    start = w.detach().clone()
    for _ in range(4):
        for p, o in ((w, opt), (ref, torch_opt)):
            o.zero_grad()
            ((p - target) ** 2 * torch.arange(1.0, 25.0).view(6, 4)).sum().backward()
            o.step()
    assert not torch.equal(w.detach(), start), "the non-contiguous parameter never moved"
    torch.testing.assert_close(w.detach(), ref.detach(), rtol=1e-6, atol=1e-6)


def _checkpoint(path: Path, step: int) -> None:
    torch.save({"global_step": step, "pytorch-lightning_version": "2.5.0", "state_dict": {}}, path)


def test_resume_from_best_in_its_folder_with_last_at_the_same_step_is_allowed(tmp_path):
    """``best-step=2.ckpt`` resumed in its own folder, whose last.ckpt is also at step 2: the first save replaces
    last.ckpt with a step-3 checkpoint, and no step is lost, so the resume goes on (a last.ckpt at
    step 3 is still refused: the check is not simply off).

    Catches the "newer last.ckpt" comparison made with >= (the same step counted as newer).
    """
    from distlab.cli.checkpoint import _steps_left
    from distlab.errors import ConfigError

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    best, last = folder / "best-step=2.ckpt", folder / "last.ckpt"
    _checkpoint(best, 2)
    _checkpoint(last, 2)
    trainer = types.SimpleNamespace(max_steps=10, fast_dev_run=False, default_root_dir=str(tmp_path))
    _steps_left(trainer, str(best), [folder])  # no refusal

    _checkpoint(last, 3)  # a genuinely newer last.ckpt: refused
    with pytest.raises(ConfigError, match="would replace"):
        _steps_left(trainer, str(best), [folder])


def _split(splits) -> tuple[bytes, bytes]:
    return (
        b"".join(a.tobytes() for a in splits.train),
        b"".join(a.tobytes() for a in splits.val),
    )


def test_a_text_folders_split_does_not_depend_on_how_it_is_named(tmp_path, monkeypatch):
    """The same folder named relatively, absolutely, from another working directory, or copied elsewhere gives
    the same train/val split (the docstring: a stable hash of the path relative to its root).

    Catches keying the hash by the path as given: the split then moves with the working directory and the
    corpus's location, and validation documents leak into training.
    """
    from distlab.data.corpus import load_corpus

    n = 24  # 24 documents at val_fraction 0.5: a path-dependent split matches by chance with p ~ 2**-24
    for root in (tmp_path / "a" / "corpus", tmp_path / "b" / "deeper" / "corpus"):
        (root / "sub").mkdir(parents=True)
        for i in range(n):
            (root / ("sub" if i % 2 else "") / f"doc{i:02d}.txt").write_text(f"document number {i}\n")

    monkeypatch.chdir(tmp_path / "a")
    relative = _split(load_corpus(["corpus"], val_fraction=0.5))
    absolute = _split(load_corpus([str(tmp_path / "a" / "corpus")], val_fraction=0.5))
    monkeypatch.chdir(tmp_path)
    other_cwd = _split(load_corpus(["a/corpus"], val_fraction=0.5))
    moved = _split(load_corpus([str(tmp_path / "b" / "deeper" / "corpus")], val_fraction=0.5))

    assert relative[0] and relative[1], "both splits should hold documents"
    assert absolute == relative, "the split changed when the folder was named by its absolute path"
    assert other_cwd == relative, "the split changed with the working directory"
    assert moved == relative, "the split changed when the corpus moved"


def test_a_failed_starts_cleanup_keeps_a_checkpoint_under_checkpoints(tmp_path):
    """A fit that fails after saving checkpoints/step=3.ckpt, before metrics.csv got a row, leaves its run folder
    as it is: remove_failed_start deletes only a folder that holds nothing of value.

    Catches the checkpoint search made at the top of the folder only (glob, not rglob): the saved checkpoint
    and the run's config would be deleted.
    """
    from distlab.cli.run_folder import remove_failed_start

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("seed_everything: 0\n")
    (run / "metrics.csv").write_text("epoch,step,train_loss\n")  # the header only
    (run / "checkpoints" / "step=3.ckpt").write_bytes(b"checkpoint bytes")
    before = sorted(p.relative_to(run).as_posix() for p in run.rglob("*"))

    remove_failed_start(run)

    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*")) == before
    assert (run / "checkpoints" / "step=3.ckpt").read_bytes() == b"checkpoint bytes"


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_adamw_learning_rates_shrink_as_the_model_widens(optimizer):
    """At n_embd=64 the embedding and head (and, under optimizer=adamw, matrix) AdamW learning rates are the
    configured ones times sqrt(768 / 64) (= 1/sqrt(n_embd / 768), the width transfer); the scalar and Muon
    rates are unscaled.

    Catches the exponent's sign flipped (a 12x error at this width).
    """
    from distlab.modules.gpt_module import GPTLightningModule

    lrs = dict(embedding_lr=0.3, head_lr=0.005, scalar_lr=0.01, matrix_lr=0.007)
    module = GPTLightningModule(depth=1, n_embd=64, head_dim=16, sequence_len=16, optimizer=optimizer, **lrs)
    assert module.config.n_embd == 64
    up = math.sqrt(768 / 64)
    expected = {
        "embedding": 0.3 * up,
        "head": 0.005 * up,
        "scalar": 0.01,
        "matrix": 0.007 * up if optimizer == "adamw" else 0.007,
    }
    got = {g["name"]: g["lr"] for g in module.param_groups()}
    assert set(got) <= set(expected), got
    assert {"embedding", "head", "matrix"} <= set(got), got
    for name, lr in got.items():
        assert lr == pytest.approx(expected[name], rel=1e-9), (name, lr, expected[name])


def test_greedy_generation_past_the_context_reads_the_last_sequence_len_tokens():
    """Greedy generation that runs past ``sequence_len`` equals a loop that feeds the model's forward the last
    ``sequence_len`` tokens and takes the argmax.

    Catches the context cropped to the first ``sequence_len`` tokens (every later token predicted from the
    same stale window).
    """
    from distlab.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    window = 8
    model = GPT(GPTConfig(depth=1, aspect_ratio=32, head_dim=16, sequence_len=window)).eval()
    with torch.no_grad():
        for p in model.parameters():  # zero-initialized projections would make every argmax the same token
            p.add_(0.3 * torch.randn_like(p))
        prompt = torch.randint(0, 257, (2, 5))
        out = model.generate(prompt, 20, temperature=0.0)
        ref = prompt.clone()
        for _ in range(20):
            logits = model(ref[:, -window:])  # (B, T, V)
            ref = torch.cat([ref, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert out.shape == (2, 25)
    assert len(set(ref[:, window:].flatten().tolist())) > 1, "a constant continuation would prove nothing"
    assert torch.equal(out, ref), (out, ref)
