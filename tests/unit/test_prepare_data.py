import numpy as np

from distlab.data.corpus import load_corpus, read_bin_shard, stable_fraction


def main(argv: list[str]) -> int:
    """``distlab prepare ARGV``'s exit status."""
    from distlab.cli import main as distlab_main

    try:
        distlab_main(["prepare", *argv])
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def test_prepare_data_writes_the_same_split_as_the_loader(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"f{i}.py").write_text(f"x = {i}\n" * (i + 5) * 100)
    out = tmp_path / "bin"
    assert (
        main(["--paths", str(src), "--out", str(out), "--val_fraction", "0.3", "--shard_tokens", "65536"])
        == 0
    )
    expected = load_corpus([str(src)], val_fraction=0.3)
    train = np.concatenate([read_bin_shard(p) for p in sorted(out.glob("train_*.bin"))])
    val = np.concatenate([read_bin_shard(p) for p in sorted(out.glob("val_*.bin"))])
    assert np.array_equal(train, np.concatenate(expected.train)) and np.array_equal(
        val, np.concatenate(expected.val)
    )
    assert len(list(out.glob("train_*.bin"))) > 1  # sharded at 65,536 tokens
    assert main(["--paths", str(tmp_path / "missing"), "--out", str(tmp_path / "bin2")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_an_empty_split_is_one_line_and_writes_nothing(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    # two documents that both land in training at 2% (files go wholly to one split, by a hash of their path)
    names = [n for n in (f"doc{i}.py" for i in range(100)) if stable_fraction(n) >= 0.02][:2]
    for name in names:
        (src / name).write_text("x = 1\n" * 50)
    out = tmp_path / "bin"
    assert main(["--paths", str(src), "--out", str(out), "--val_fraction", "0.02"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "split of 2 files is empty with --val_fraction 0.02" in err[0], err
    assert not out.exists()


def test_one_file_is_split_by_position(tmp_path, capsys):
    """One text file: its last val_fraction of tokens is the validation shard, the rest the training shard."""
    text = tmp_path / "only.txt"
    text.write_bytes(bytes(range(32, 127)) * 20)  # 1,900 bytes -> 1,901 tokens with BOS; 10% -> 190 held out
    out = tmp_path / "bin"
    assert main(["--paths", str(text), "--out", str(out), "--val_fraction", "0.1"]) == 0
    whole = [256, *text.read_bytes()]
    train = np.concatenate([read_bin_shard(p) for p in sorted(out.glob("train_*.bin"))]).tolist()
    val = np.concatenate([read_bin_shard(p) for p in sorted(out.glob("val_*.bin"))]).tolist()
    assert train == whole[:-190] and val == whole[-190:]


def test_prepare_never_mixes_or_replaces_a_dataset_unasked(tmp_path, capsys):
    """A second prepare into the same folder is refused (it silently replaced the shards, and a smaller dataset left
    the first one's extra shards beside its own: a fit then trained on both); --overwrite replaces the dataset whole;
    --out naming a file is one line."""
    prepare = main

    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * 6000)
    out = tmp_path / "out"
    assert (
        prepare(["--paths", str(src), "--out", str(out), "--val_fraction", "0.3", "--shard_tokens", "65536"])
        == 0
    )
    many = sorted(p.name for p in out.glob("*.bin"))
    assert len(many) > 2
    assert prepare(["--paths", str(src), "--out", str(out), "--val_fraction", "0.3"]) == 2
    assert "already holds token shards" in capsys.readouterr().err
    assert sorted(p.name for p in out.glob("*.bin")) == many
    assert prepare(["--paths", str(src), "--out", str(out), "--val_fraction", "0.3", "--overwrite"]) == 0
    assert sorted(p.name for p in out.glob("*.bin")) == ["train_000.bin", "val_000.bin"]
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert prepare(["--paths", str(src), "--out", str(a_file)]) == 2
    assert "is a file" in capsys.readouterr().err.splitlines()[-1]


def test_prepare_names_its_own_options_and_never_leaves_foreign_shards_beside_its_own(tmp_path, capsys):
    """prepare's messages name prepare's options (not distlab fit's data.*); a .bin file of another tool in --out
    (which fit would read with the new shards) is refused, and --overwrite replaces it."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"f{i}.py").write_text(f"x = {i}\n" * (i + 5) * 100)
    for value, said in (
        ("0", "val_fraction=0 is not accepted"),
        ("10", "val_fraction=10 is not accepted"),
    ):
        assert main(["--paths", str(src), "--out", str(tmp_path / "v"), "--val_fraction", value]) == 2
        err = capsys.readouterr().err
        assert said in err and "data.val_fraction" not in err, err
    assert main(["--paths", str(tmp_path / "typo"), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "typo' does not exist" in err and "data.paths" not in err, err
    out = tmp_path / "mixed"
    out.mkdir()
    np.arange(3000, dtype=np.uint16).tofile(out / "train.bin")  # e.g. nanoGPT's raw shard
    assert main(["--paths", str(src), "--out", str(out)]) == 2
    assert "already holds token shards (1 .bin file(s), train.bin" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["train.bin"]
    assert main(["--paths", str(src), "--out", str(out), "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["train_000.bin", "val_000.bin"]


def test_prepare_is_a_command_whose_options_come_from_its_signature(tmp_path, capsys):
    """``distlab prepare`` refuses, in one line naming its own option and
    before anything is written: shards written into a source folder, an empty --paths (which once meant the embedded
    corpus), a missing --out, a word for a number; list options take shell words (--paths a b)."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i in range(30):
        (src / f"f{i}.py").write_text(f"x = {i}\n" * (i + 5) * 100)
    before = sorted(p.name for p in src.rglob("*"))
    cases = (
        (["--paths", str(src), "--out", str(src)], "lies inside --paths"),
        (["--paths", str(src), "--out", str(src / "sub" / "bins")], "lies inside --paths"),
        (["--paths", "--out", str(tmp_path / "o")], "--paths names no files"),
        (["--paths", str(src)], "required: out"),
        (["--paths", str(src), "--out", str(tmp_path / "o"), "--shard_tokens", "abc"], "shard_tokens=abc"),
        (["--paths", str(src), str(tmp_path / "nope"), "--out", str(tmp_path / "o")], "nope' does not exist"),
    )
    for argv, said in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("distlab: error:") and said in err[0], (argv, err)
    assert sorted(p.name for p in src.rglob("*")) == before and not (tmp_path / "o").exists()
    from distlab.cli import main as distlab

    distlab(
        [
            "prepare",
            "--paths",
            str(src / "f1.py"),
            str(src),
            "--out",
            str(tmp_path / "o"),
            "--val_fraction",
            "0.3",
        ]
    )
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["train_000.bin", "val_000.bin"]


def test_a_list_option_given_twice_adds_up_and_the_first_replaces_the_default():
    """``--paths a --paths b`` is both folders (argparse's store kept only the last, silently); ``--extensions .c``
    replaces the default list, a second ``--extensions .h`` adds to it."""
    from distlab.cli.commands import function_command_parser

    parser = function_command_parser("prepare")
    got = parser.parse_args(["--out", "x", "--paths", "a", "--paths", "b", "c"])
    assert got.paths == ["a", "b", "c"]
    got = parser.parse_args(["--out", "x", "--extensions", ".c", "--extensions", ".h"])
    assert got.extensions == [".c", ".h"]
    assert parser.parse_args(["--out", "x"]).extensions == [".py", ".txt", ".md", ".rst"]


def test_shards_sorted_by_name_are_in_the_order_written(tmp_path):
    """The reader takes shards in name order: past shard 999 a fixed 3-digit name sorted train_1000 before train_101
    (the tokens reordered). Every name has one width."""
    from distlab.data.shards import write_shards

    tokens = np.arange(1003, dtype=np.uint16)
    paths = write_shards([tokens], tmp_path, "train", 1)
    assert [p.name for p in paths] == sorted(p.name for p in paths)
    read = np.concatenate([read_bin_shard(p) for p in sorted(tmp_path.glob("train_*.bin"))])
    assert np.array_equal(read, tokens)
