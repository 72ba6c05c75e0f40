"""What the spawn launcher refuses to send to fresh ranks: every object it carries whose class or function was
defined in an unimportable ``__main__`` (a notebook), however deep it sits in what the ranks receive."""

from __future__ import annotations

from torch import nn
from torch.utils.data import DataLoader

from distlab.strategies.launcher import objects_from_main


def defined_in_main(name: str, base: type = object) -> type:
    return type(name, (base,), {"__module__": "__main__"})  # as `class Name: ...` typed in a notebook


def test_classes_from_main_are_found_wherever_the_ranks_would_receive_them():
    Sub, Data, Sampler, Callback = (
        defined_in_main(n, b)
        for n, b in [("Sub", nn.Module), ("Data", list), ("Sampler", list), ("Callback", object)]
    )
    collate = eval("lambda batch: batch", {"__name__": "__main__"})  # a function typed in the notebook
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(Sub()))  # two levels down, inside torch's classes
    loader = DataLoader(Data([1, 2]), batch_size=1, collate_fn=collate, sampler=Sampler([0, 1]))
    assert objects_from_main(None, (model,)) == ["Sub"]
    assert objects_from_main(None, ({"train": loader},)) == ["Data", "<lambda>", "Sampler"]
    assert objects_from_main(None, ([nn.Linear(2, 2), (Callback(),)],)) == ["Callback"]

    class Trainer:  # only its callbacks matter
        callbacks = [Callback(), Callback()]

    assert objects_from_main(Trainer(), (model,)) == ["Sub", "Callback"]  # each name once
    assert objects_from_main(None, (nn.Sequential(nn.Linear(2, 2)), DataLoader([1, 2]))) == []


def test_a_spawn_strategy_under_a_launcher_and_a_script_from_stdin_are_refused(monkeypatch):
    """A *_spawn strategy in a script torchrun started (each process would spawn ranks of its own: two jobs that
    collide), and a script piped into `python -` (its ranks cannot re-import '<stdin>'), are one-line refusals."""
    import sys
    import types

    import pytest

    from distlab.errors import ConfigError
    from distlab.strategies.launcher import SpawnLauncher, main_importable

    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__file__="<stdin>", __spec__=None))
    assert not main_importable()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("WORLD_SIZE", "2")
    launcher = SpawnLauncher.__new__(SpawnLauncher)
    with pytest.raises(
        ConfigError, match="this strategy spawns its own ranks, but torchrun already started 2"
    ):
        launcher.launch(print)
