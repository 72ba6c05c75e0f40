import numpy as np

from distlab.data.corpus import load_corpus, read_bin_shard
from distlab.data.prepare import main


def test_prepare_data_writes_the_same_split_as_the_loader(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"f{i}.py").write_text(f"x = {i}\n" * (i + 5))
    out = tmp_path / "bin"
    assert (
        main(["--paths", str(src), "--out", str(out), "--val_fraction", "0.3", "--shard_tokens", "200"]) == 0
    )
    expected = load_corpus([str(src)], val_fraction=0.3)
    train = np.concatenate([read_bin_shard(p) for p in sorted(out.glob("train_*.bin"))])
    val = np.concatenate([read_bin_shard(p) for p in sorted(out.glob("val_*.bin"))])
    assert np.array_equal(train, np.concatenate(expected.train)) and np.array_equal(
        val, np.concatenate(expected.val)
    )
    assert len(list(out.glob("train_*.bin"))) > 1  # sharded at 200 tokens
    assert main(["--paths", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_an_empty_split_is_one_line_and_writes_nothing(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "only.py").write_text("x = 1\n" * 50)  # one document: it lands in train or val, never both
    out = tmp_path / "bin"
    assert main(["--paths", str(src), "--out", str(out), "--val_fraction", "0.02"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "split of 1 files is empty with --val_fraction 0.02" in err[0], err
    assert not out.exists()
