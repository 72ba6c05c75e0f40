"""Guards for claims no earlier test held (audit 24): each test fails on one realistic mistake.

- FSDP2's data-parallel mesh spans every process of every node (not one node's).
- A checkpoint written by VerifiedCheckpointIO gets the mode any new file gets under the umask.
- DigitsDataModule's train/val split is decided by ``seed`` alone, not by the global RNG.
- ``distlab generate --top_k`` reaches the sampler.

Every oracle is computed here without the code under test.
"""

from __future__ import annotations

import os
from unittest import mock

import lightning as L
import torch
from lightning.pytorch.demos.boring_classes import BoringModel


def test_fsdp2_data_parallel_mesh_covers_every_node(monkeypatch):
    """FSDP2Strategy shards over all ranks: with 2 nodes x 2 processes its mesh is data_parallel=4 x tensor=1.

    Catches a data-parallel size of ``num_processes`` alone (one node's ranks), which on several nodes gives
    a mesh that does not cover the world (Lightning refuses it, or FSDP2 would shard over a node only). The
    Trainer's accelerator connector sets num_nodes / parallel_devices as in a real job; only the process
    group and the mesh construction (which need the 4 processes) are replaced by recorders.
    """
    import lightning.pytorch.strategies.model_parallel as model_parallel

    from distlab.strategies import FSDP2Strategy

    monkeypatch.setenv("NODE_RANK", "0")  # what a multi-node job sets on each node
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    strategy = FSDP2Strategy()
    L.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=2,
        num_nodes=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    assert (strategy.num_nodes, strategy.num_processes) == (2, 2)
    strategy.connect(BoringModel())
    meshes: list[tuple[int, int, int]] = []

    def record_mesh(data_parallel, tensor_parallel, world_size, device):
        meshes.append((data_parallel, tensor_parallel, world_size))
        return object()

    monkeypatch.setattr(model_parallel, "_init_dist_connection", mock.Mock())
    monkeypatch.setattr(model_parallel, "_setup_device_mesh", record_mesh)
    strategy.setup_environment()
    world = 2 * 2  # nodes x processes per node
    assert meshes == [(world, 1, world)], meshes


def test_verified_checkpoint_gets_the_umask_mode(tmp_path):
    """A checkpoint saved through VerifiedCheckpointIO is as readable as any new file (0o666 & ~umask).

    Catches the temporary file's mkstemp mode (0600) surviving the rename: checkpoints other users or a
    serving job cannot read. The umask is set to 022 for the test (so 0600 and the expected 0644 differ)
    and the oracle is a plain file created under the same umask.
    """
    from distlab.checkpoint import VerifiedCheckpointIO

    previous = os.umask(0o022)
    try:
        umask = os.umask(0o022)  # read back (os.umask returns the mask it replaces)
        target = tmp_path / "step=1.ckpt"
        VerifiedCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(3)}}, target)
        plain = tmp_path / "plain"
        plain.write_text("")
    finally:
        os.umask(previous)
    assert umask == 0o022
    mode = target.stat().st_mode & 0o777
    assert mode == 0o666 & ~umask, oct(mode)
    assert mode == plain.stat().st_mode & 0o777
    assert torch.load(target, weights_only=True)["state_dict"]["w"].tolist() == [1.0, 1.0, 1.0]


def test_every_atomic_write_gets_the_umask_mode_or_keeps_the_replaced_files(tmp_path):
    """Every file distlab writes whole (checkpoints, exports, consolidated copies) goes through one atomic writer:
    a new file gets 0o666 & ~umask, not mkstemp's 0600; a replaced file keeps its mode (the private 0600 copy the
    CLI gathers in /tmp stays private)."""
    from distlab.checkpoint.writing import _atomic_target

    previous = os.umask(0o022)
    try:
        new, private = tmp_path / "new.safetensors", tmp_path / "private.ckpt"
        private.write_text("")
        private.chmod(0o600)
        for path in (new, private):
            with _atomic_target(path) as tmp:
                tmp.write_text("whole")
    finally:
        os.umask(previous)
    assert (new.stat().st_mode & 0o777, private.stat().st_mode & 0o777) == (0o644, 0o600)
    assert new.read_text() == private.read_text() == "whole"


def _digits_split(seed: int, global_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    from distlab.data import DigitsDataModule

    torch.manual_seed(global_seed)  # whatever consumed the global RNG before setup
    torch.rand(int(global_seed) + 1)
    data = DigitsDataModule(seed=seed)
    data.setup("fit")
    return data.train_set.tensors[1], data.val_set.tensors[1]


def test_digits_split_is_decided_by_its_seed_not_the_global_rng():
    """DigitsDataModule(seed=s) holds out the same images whatever state the global RNG is in at setup.

    Catches the permutation being drawn from the global RNG: validate/test in another process (another
    seed_everything, other RNG use before setup) would then score images the model trained on. Compared
    via the labels in split order, which a different permutation of the 1797 images changes.
    """
    with torch.random.fork_rng():
        train_a, val_a = _digits_split(seed=7, global_seed=1)
        train_b, val_b = _digits_split(seed=7, global_seed=2)
        train_c, val_c = _digits_split(seed=8, global_seed=1)
    same = torch.equal(val_a, val_b) and torch.equal(train_a, train_b)
    assert same, "the same data.seed gave another train/val split under another global RNG state"
    assert len(val_a) + len(train_a) == 1797
    assert not torch.equal(val_a, val_c)  # the seed does decide it


def test_generate_top_k_one_is_greedy_whatever_the_seed(tmp_path, capsys):
    """``distlab generate --top_k 1 --temperature 1.0`` samples only the most likely byte: the text is the
    greedy continuation, the same for every seed.

    Catches --top_k not being passed to the model's sampler (sampling from all 257 ids: two seeds give
    different text). The checkpoint is a tiny randomly initialised GPT saved as a Lightning checkpoint dict;
    the greedy oracle is an argmax loop over the model's forward written here.
    """
    from distlab.cli import main
    from distlab.models.gpt import GPT, GPTConfig
    from distlab.testing import TINY_GPT

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT(GPTConfig(**TINY_GPT)).eval()
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, 1.0)  # well-separated logits: no ties at the top
    ckpt = tmp_path / "tiny.ckpt"
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"hyper_parameters": dict(TINY_GPT), "state_dict": state}, ckpt)

    prompt, n_new = "def ", 12
    ids = [256, *prompt.encode()]  # the byte tokenizer: document separator 256, then the bytes
    with torch.no_grad():
        for _ in range(n_new):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    greedy = bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    texts = []
    for seed in (1, 2):
        capsys.readouterr()
        args = ["--ckpt_path", str(ckpt), "--prompt", prompt, "--max_new_tokens", str(n_new)]
        main(["generate", *args, "--top_k", "1", "--temperature", "1.0", "--seed", str(seed)])
        texts.append(capsys.readouterr().out.rstrip("\n"))
    assert texts == [greedy, greedy], (texts, greedy)
