"""Bad input to the data layer from Python, one line each: a MicroShards with fewer samples than a batch, distlab's
streams under a DataLoader of several worker processes (each would yield the whole stream), load_corpus given one
path instead of a list (or a list holding a non-path); and the draw plan a checkpoint records counts the windows it
draws from."""

from __future__ import annotations

import traceback
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from distlab.callbacks import DataResumeCheck
from distlab.data import MicroShards, load_corpus
from distlab.data.corpus import write_bin_shard
from distlab.data.windows import TrainWindows
from distlab.errors import ConfigError


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text, text
    return text


# ---- 1. MicroShards with fewer samples than one global batch: refused at the first batch ----------------------
@pytest.mark.parametrize("dataset", [[], list(range(3))])
def test_micro_shards_with_fewer_samples_than_a_batch_is_one_line(dataset):
    with pytest.raises(ValueError) as e:
        next(iter(MicroShards(dataset, batch_size=4)))
    assert "fewer than one global batch of batch_size x micro_shards = 4 x 1; lower batch_size" in _one_line(
        e
    )


def test_micro_shards_of_enough_samples_still_builds():
    ds = MicroShards(TensorDataset(torch.arange(8.0)), batch_size=4)
    assert next(iter(DataLoader(ds, batch_size=None)))[0].shape == (4,)


# ---- 2. several DataLoader workers over distlab's streams ------------------------------------------------------
def _streams():
    yield MicroShards(list(range(16)), batch_size=4)
    yield TrainWindows([np.arange(200, dtype=np.uint16)], seq_len=4, batch_size=2, seed=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("make", [0, 1], ids=["MicroShards", "TrainWindows"])
def test_a_stream_under_several_loader_workers_is_one_line(make):
    dataset = list(_streams())[make]
    name = type(dataset).__name__
    with pytest.raises(ConfigError) as e:
        next(iter(DataLoader(dataset, batch_size=None, num_workers=2)))
    # The traceback's frames hold the loader's iterator in a reference cycle: left to a later gc pass, its worker
    # shutdown runs after the queues' finalizers and waits 5 s per worker. Cleared, the iterator closes its workers now.
    traceback.clear_frames(e.tb)
    said = _one_line(e)  # the worker's traceback does not come along
    assert said.startswith(
        f"{name} is iterated by a DataLoader with num_workers=2: each worker process would yield"
    )
    assert "set num_workers=0 (or 1)" in said


@pytest.mark.timeout(120)
@pytest.mark.parametrize("make", [0, 1], ids=["MicroShards", "TrainWindows"])
def test_one_loader_worker_yields_the_stream_of_the_main_process(make):
    def batches(num_workers: int) -> list:
        it = iter(DataLoader(list(_streams())[make], batch_size=None, num_workers=num_workers))
        return [next(it) for _ in range(4)]

    main, worker = batches(0), batches(1)
    flat = lambda bs: [b if isinstance(b, torch.Tensor) else torch.cat([t.flatten() for t in b]) for b in bs]  # noqa: E731
    assert all(torch.equal(a, b) for a, b in zip(flat(main), flat(worker), strict=True))


def test_a_config_error_from_a_loader_worker_keeps_its_line():
    """torch re-raises a worker's exception as its class built from "Caught ... in DataLoader worker process N." and
    the worker's traceback: a ConfigError built from that text is the worker's one line again."""
    wrapped = (
        "Caught ConfigError in DataLoader worker process 3.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n    raise ConfigError("the line")\ndistlab.errors.ConfigError: the line\n'
    )
    assert str(ConfigError(wrapped)) == "the line"
    assert str(ConfigError("Caught nothing: an ordinary message")) == "Caught nothing: an ordinary message"


# ---- 3. load_corpus given one path, or a list holding a non-path ----------------------------------------------
@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("a line of text to train on\n" * 40)
    return path


def test_load_corpus_given_one_path_reads_that_path(text_file, tmp_path, monkeypatch):
    expected = load_corpus([str(text_file)], val_fraction=0.1)
    for one in (str(text_file), text_file):
        got = load_corpus(one, val_fraction=0.1)
        assert got.description == expected.description == "1 file (its last 0.1 held out)"
        assert np.array_equal(np.concatenate(got.train), np.concatenate(expected.train))
    monkeypatch.chdir(tmp_path)  # a relative name whose first letter is a file here: never read as characters
    (tmp_path / "n").write_text("the wrong file, named by the first character\n" * 40)
    got = load_corpus("notes.txt", val_fraction=0.1)
    assert np.array_equal(np.concatenate(got.train), np.concatenate(expected.train))


@pytest.mark.parametrize(
    "paths, said",
    [
        ([None], "load_corpus: paths=[None] is not accepted"),
        (["FILE", 3], "load_corpus: paths=["),
        (5, "load_corpus: paths=5 is not accepted"),
        (b"notes.txt", "load_corpus: paths=b'notes.txt' is not accepted"),
    ],
)
def test_load_corpus_refuses_a_non_path_in_one_line(paths, said, text_file):
    paths = [str(text_file) if p == "FILE" else p for p in paths] if isinstance(paths, list) else paths
    with pytest.raises(ConfigError) as e:
        load_corpus(paths)
    assert said in _one_line(e) and "is not accepted" in str(e.value)


def test_load_corpus_given_no_paths_is_not_the_embedded_corpus():
    with pytest.raises(ConfigError) as e:
        load_corpus([])
    assert "no .bin shards found under []" in _one_line(e)


def test_load_corpus_reads_a_generator_of_paths_once(text_file):
    assert load_corpus(p for p in [str(text_file)]).description.startswith("1 file")


def test_one_extension_given_as_text_is_that_suffix(tmp_path):
    """``in`` on a str is a substring test: '.txt' would have let in files without a suffix (and '.t', '.x')."""
    (tmp_path / "a.txt").write_text("kept text\n" * 40)
    (tmp_path / "b.txt").write_text("kept too\n" * 40)
    (tmp_path / "README").write_text("no suffix: not a .txt file\n" * 40)
    splits = load_corpus([str(tmp_path)], val_fraction=0.5, extensions=".txt")
    assert sorted(name for name, _ in splits.train_docs + splits.val_docs) == ["a.txt", "b.txt"]


# ---- 4. data.extensions beside token shards ---------------------------------------------------------------------
@pytest.fixture
def shards(tmp_path) -> Path:
    folder = tmp_path / "shards"
    folder.mkdir()
    write_bin_shard(folder / "train_000.bin", np.arange(3000) % 256)
    write_bin_shard(folder / "val_000.bin", np.arange(600) % 256)
    return folder


# ---- 5. the draw plan counts the windows (a checkpoint's, and an older one's without the count) ----------------
def _resumed(saved: str | None, plan: str) -> DataResumeCheck:
    check = DataResumeCheck()
    check.on_load_checkpoint(None, None, {} if saved is None else {DataResumeCheck.CHECKPOINT_KEY: saved})
    return check, SimpleNamespace(
        ckpt_path="last.ckpt",
        global_step=2,
        current_epoch=0,
        train_dataloader=SimpleNamespace(
            dataset=SimpleNamespace(draw_plan=lambda: plan, resumes_from_step=True)
        ),
        fit_loop=SimpleNamespace(
            epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(current=SimpleNamespace(completed=0)))
        ),
    )


HOW = "4 windows per micro step (batch_size 4 x 1 rank)"


@pytest.mark.parametrize(
    "saved, plan, said",
    [
        (f"{HOW} from 5,000 windows", f"{HOW} from 5,000 windows", None),
        (
            f"{HOW} from 5,000 windows",
            f"{HOW} from 4,968 windows",
            "the training data holds 4,968 windows, and the "
            "checkpoint's run drew from 5,000 windows (the dataset changed)",
        ),
        (HOW, f"{HOW} from 4,968 windows", None),  # a checkpoint from before the count: the rest is the same
        (None, f"{HOW} from 4,968 windows", None),  # a checkpoint without any plan
        (
            "8 windows per micro step (batch_size 4 x 2 ranks)",
            f"{HOW} from 4,968 windows",
            "the checkpoint's run drew 8 windows per micro step (batch_size 4 x 2 ranks)",
        ),
    ],
)
def test_a_resume_compares_the_plan_and_the_windows_it_draws_from(saved, plan, said, monkeypatch):
    import distlab.callbacks.preemption as preemption

    notes: list[str] = []
    monkeypatch.setattr(preemption, "rank_zero_info", notes.append)
    check, trainer = _resumed(saved, plan)
    check.on_train_start(trainer, None)
    if said is None:
        assert notes == []
    else:
        assert len(notes) == 1 and said in notes[0], notes


def test_the_plan_counts_the_windows_of_the_data_not_its_tokens():
    """The same 6,000 training tokens in one shard or in two: windows never cross a shard, so the second has fewer,
    and a window id names another window."""
    one = TrainWindows([np.zeros(6000, np.uint16)], seq_len=31, batch_size=4, seed=0)
    two = TrainWindows([np.zeros(3000, np.uint16)] * 2, seq_len=31, batch_size=4, seed=0)
    assert one.draw_plan() == f"{HOW} from 5,969 windows"
    assert two.draw_plan() == f"{HOW} from 5,938 windows"
    assert MicroShards(list(range(10)), batch_size=2).draw_plan().endswith(" from 10 samples")
