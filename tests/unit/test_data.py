import random
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distlab.data.corpus import (
    is_val,
    load_corpus,
    read_bin_shard,
    stable_fraction,
    stdlib_files,
    write_bin_shard,
)
from distlab.data.datamodule import TextDataModule
from distlab.data.tokenizer import ByteTokenizer
from distlab.data.windows import TrainWindows, ValWindows, WindowIndex
from distlab.errors import ConfigError


def test_tokenizer_round_trip_including_non_ascii():
    tok = ByteTokenizer()
    text = "def f(x):\n    return x ** 2  # ünïcødé ✓ 🐍"
    ids = tok.encode(text, bos=True)
    assert ids[0] == tok.bos_id and max(ids[1:]) < 256
    assert tok.decode(ids) == text
    with pytest.raises(ValueError, match="token id 300 is not a byte-tokenizer id"):
        tok.decode([256, 104, 105, 300])  # another tokenizer's ids: not dropped without a word
    assert tok.decode([256, 104, 105, 300], drop_unknown=True) == "hi"
    arr = tok.encode_array(text.encode(), bos=True)
    assert arr.dtype == np.uint16 and arr.tolist() == ids


def test_stable_hash_is_fixed_across_machines_and_runs():
    # sha1-based: these constants would change if the split depended on PYTHONHASHSEED or the machine.
    assert stable_fraction("json/decoder.py") == pytest.approx(0.736520, abs=1e-6)
    assert stable_fraction("asyncio/tasks.py") == pytest.approx(0.269602, abs=1e-6)  # a second pinned value


def test_stdlib_split_is_deterministic_and_order_independent():
    files = stdlib_files()
    assert len(files) > 500 and files == sorted(files)
    assert all("site-packages" not in key for key, _ in files)
    keys = [k for k, _ in files]
    val = {k for k in keys if is_val(k, 0.02)}
    shuffled = keys[:]
    random.Random(0).shuffle(shuffled)
    assert {k for k in shuffled if is_val(k, 0.02)} == val
    assert 0.005 < len(val) / len(keys) < 0.05


def test_stdlib_corpus_loads_without_network():
    splits = load_corpus(None, val_fraction=0.02)
    assert splits.n_train > 10_000_000 and splits.n_val > 100_000
    assert splits.train[0][0] == ByteTokenizer.bos_id


def test_train_batches_deterministic_and_disjoint_across_ranks():
    arrays = [np.arange(5000, dtype=np.uint16), np.arange(7000, 9000, dtype=np.uint16)]
    single = TrainWindows(arrays, seq_len=16, batch_size=6, seed=7)
    x1, y1 = single.batch(3)
    x1b, _ = TrainWindows(arrays, seq_len=16, batch_size=6, seed=7).batch(3)
    assert torch.equal(x1, x1b)  # same (seed, step) -> same batch
    assert not torch.equal(x1, single.batch(4)[0])  # next step differs
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are inputs shifted by one
    for world in (2, 3):
        parts = [TrainWindows(arrays, 16, 6 // world, 7, r, world).batch(3) for r in range(world)]
        union = torch.cat([p[0] for p in parts])
        assert torch.equal(union, x1)  # ranks partition the 1-process global batch: no overlap
    # Resuming at micro step k continues the exact stream.
    it = iter(TrainWindows(arrays, 16, 6, 7, start_micro_step=3))
    assert torch.equal(next(it)[0], x1)


def test_windows_never_cross_array_boundaries():
    arrays = [np.zeros(20, dtype=np.uint16), np.ones(20, dtype=np.uint16)]
    index = WindowIndex(arrays, 9)
    assert index.n_windows == 24
    for i in range(index.n_windows):
        w = index.window(i)
        assert len(w) == 9 and len(set(w.tolist())) == 1


def test_val_windows_predict_every_token_exactly_once():
    arr = np.arange(1, 101, dtype=np.uint16)  # 100 tokens
    ds = ValWindows([arr], seq_len=10)
    targets = torch.cat([ds[i][1] for i in range(len(ds))]).tolist()
    assert targets == list(range(2, 101))[: len(targets)]
    assert len(targets) == 90 and len(set(targets)) == 90
    assert len(ValWindows([arr], seq_len=10, max_windows=3)) == 3


def test_val_windows_over_every_length_and_window():
    """Every array length 1..60 and window 1..12 (the boundaries where the last window just fits included): the
    targets are exactly the tokens after the first, in order, up to the last whole window (oracle: arithmetic)."""
    for n in range(1, 61):
        arr = np.arange(1, n + 1, dtype=np.uint16)
        for seq_len in range(1, 13):
            ds = ValWindows([arr], seq_len=seq_len)
            whole = (n - 1) // seq_len  # windows of seq_len predictions that fit
            assert len(ds) == whole, (n, seq_len)
            targets = torch.cat([ds[i][1] for i in range(len(ds))]).tolist() if whole else []
            assert targets == list(range(2, 2 + whole * seq_len)), (n, seq_len)


def test_bin_shards_round_trip_both_formats(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 257, size=1000).astype(np.uint16)
    write_bin_shard(tmp_path / "train_000.bin", tokens)
    assert np.array_equal(read_bin_shard(tmp_path / "train_000.bin"), tokens)
    tokens[:50].tofile(tmp_path / "val_000.bin")  # raw nanoGPT format, no header
    assert np.array_equal(read_bin_shard(tmp_path / "val_000.bin"), tokens[:50])
    splits = load_corpus([str(tmp_path)])
    assert splits.n_train == 1000 and splits.n_val == 50
    assert not list(tmp_path.glob("*.tmp"))  # atomic write leaves no temp file


def test_shards_each_shorter_than_a_window_are_told_the_seq_len_that_fits(tmp_path):
    """Four 20-token training shards hold 80 tokens, but a window never crosses shards: seq_len=32 is refused with
    the largest seq_len one shard holds, and that seq_len, taken, trains."""
    rng = np.random.default_rng(0)
    for i in range(4):
        write_bin_shard(tmp_path / f"train_{i:03d}.bin", rng.integers(0, 257, size=20).astype(np.uint16))
    write_bin_shard(tmp_path / "val_000.bin", rng.integers(0, 257, size=100).astype(np.uint16))
    with pytest.raises(
        ConfigError,
        match=r"training split has 80 tokens, fewer than one window of seq_len\+1=33 in any one shard",
    ) as err:
        TextDataModule(paths=[str(tmp_path)], seq_len=32).prepare_splits()
    most = int(re.search(r"set data.seq_len to at most (\d+)", str(err.value)).group(1))
    assert most == 19
    TextDataModule(paths=[str(tmp_path)], seq_len=most).prepare_splits()


def _shard_bytes(n_header: int, tokens: list[int]) -> bytes:
    """A modded-nanogpt shard written by hand (the format's spec, not distlab's writer): 256 little-endian
    int32 [magic 20240520, version 1, n_tokens, 0...], then uint16 tokens."""
    return struct.pack("<256i", 20240520, 1, n_header, *([0] * 253)) + struct.pack(
        f"<{len(tokens)}H", *tokens
    )


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(0, 3000), present=st.integers(0, 3100), extra_byte=st.booleans())
def test_a_shard_is_read_exactly_when_it_holds_every_token_its_header_counts(n, present, extra_byte):
    """Over header counts and file lengths: fewer tokens than the header says (by one, or by half) is refused in
    one line, and so is any byte past them (a joined or damaged file: the rest would be dropped without a word);
    exactly as many reads the header's tokens, equal to what was written."""
    import tempfile

    tokens = [(7 * i + 3) % 65536 for i in range(present)]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "train_000.bin"
        path.write_bytes(_shard_bytes(n, tokens) + (b"\x01" if extra_byte else b""))
        if present != n or extra_byte:
            with pytest.raises(ConfigError, match=f"does not match its header: it says {n:,} tokens"):
                read_bin_shard(path)
        else:
            assert read_bin_shard(path).tolist() == tokens[:n]


@pytest.mark.parametrize("n", [1, 2, 999, 1000])
def test_a_shard_one_token_short_is_refused(tmp_path, n):
    path = tmp_path / "train_000.bin"
    path.write_bytes(_shard_bytes(n, list(range(n - 1))))
    with pytest.raises(ConfigError, match="does not match its header"):
        read_bin_shard(path)
    path.write_bytes(_shard_bytes(n, list(range(n))))
    assert read_bin_shard(path).tolist() == list(range(n))


def test_text_paths_and_errors(tmp_path):
    (tmp_path / "a.txt").write_text("hello world " * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("print(1)\n" * 100)
    (tmp_path / "skip.bin.bak").write_bytes(b"\x00" * 10)
    splits = load_corpus([str(tmp_path)], val_fraction=0.5)
    assert splits.n_train + splits.n_val == 1200 + 900 + 2
    with pytest.raises(ConfigError, match="does not exist"):
        load_corpus([str(tmp_path / "missing")])
    dm = TextDataModule(paths=[str(tmp_path / "a.txt")], seq_len=16)
    one = dm.prepare_splits()  # a single file: its last val_fraction (0.02 of 1,201 tokens: 24) is held out
    assert [len(one.train[0]), len(one.val[0])] == [1201 - 24, 24]
    # the byte tokenizer: BOS (256), then one token per byte
    whole = [256, *(tmp_path / "a.txt").read_bytes()]
    assert one.train[0].tolist() == whole[:-24] and one.val[0].tolist() == whole[-24:]
    # a folder reached through a symlink is walked too (Path.rglob would skip it without a word)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    (elsewhere / "c.py").write_text("x = 1\n" * 100)
    (tmp_path / "linked").symlink_to(elsewhere)
    (tmp_path / "sub" / "loop").symlink_to(tmp_path / "sub")  # a cycle ends; a folder seen twice counts once
    with_link = load_corpus([str(tmp_path)], val_fraction=0.5)
    assert with_link.n_train + with_link.n_val == 1200 + 900 + 600 + 3
    with pytest.raises(ConfigError, match="seq_len=0 is not accepted; set seq_len to an integer >= 1"):
        TextDataModule(seq_len=0)


@pytest.mark.parametrize("text", [None, [104, 105], 5, 3.0])
def test_tokenizer_encode_refuses_what_is_not_text(text):
    with pytest.raises(TypeError, match="a bytes-like object is required"):  # bytes(5) was five zero bytes
        ByteTokenizer().encode(text)
    assert ByteTokenizer().encode(b"hi") == ByteTokenizer().encode("hi") == [104, 105]  # bytes as they are


@pytest.mark.parametrize(
    "ids,expected",
    [
        ("hi", "'str' object cannot be interpreted as an integer"),
        (torch.tensor([104.5, 105.0]), "'float' object cannot be interpreted as an integer"),  # was 'hi'
        ([104.7], "'float' object cannot be interpreted as an integer"),  # was 'h'
        ([[104, 105]], "'list' object cannot be interpreted as an integer"),
        (torch.tensor([[104, 105]]), "'list' object cannot be interpreted as an integer"),
        (None, "'NoneType' object is not iterable"),
        (104, "'int' object is not iterable"),
    ],
)
def test_tokenizer_decode_refuses_what_is_not_a_row_of_token_ids(ids, expected):
    tok = ByteTokenizer()
    with pytest.raises(TypeError, match=expected):
        tok.decode(ids)
    for row in (
        [104, 105],
        torch.tensor([104, 105]),
        np.array([104, 105]),
        [torch.tensor(104), np.int64(105)],
    ):
        assert tok.decode(row) == "hi"
    with pytest.raises(ValueError, match="token id 300 is not a byte-tokenizer id"):  # unknown ids: as strict
        tok.decode([300])
