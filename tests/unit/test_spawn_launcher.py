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


def _unbuilt_backends() -> list[str]:
    from typing import get_args

    from distlab.launch import _backend_built
    from distlab.strategies.base import BackendName

    return [b for b in get_args(BackendName) if not _backend_built(b)]


def test_a_distlab_strategy_built_from_python_refuses_a_backend_this_torch_lacks():
    """A plain Trainer given the strategy (no CLI): one line when the Trainer takes it, before any process starts,
    for every distlab strategy and every backend this torch build lacks (generated from both)."""
    import lightning as L
    import pytest

    import distlab.strategies as strategies
    from distlab.errors import ConfigError
    from distlab.strategies.base import DistlabStrategyMixin

    classes = [
        c
        for n in strategies.__all__
        if isinstance(c := getattr(strategies, n), type)
        and issubclass(c, DistlabStrategyMixin)
        and issubclass(c, L.pytorch.strategies.Strategy)
    ]
    assert classes and _unbuilt_backends(), "nothing to try"
    for cls in classes:
        for backend in _unbuilt_backends():
            for start in ("popen", "spawn"):
                with pytest.raises(
                    ConfigError, match=f"process_group_backend='{backend}' (is not built|needs CUDA)"
                ):
                    L.Trainer(
                        strategy=cls(process_group_backend=backend, start_method=start),
                        devices=2,
                        accelerator="cpu",
                        logger=False,
                    )


class _WeightNormed(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.utils.parametrizations.weight_norm(nn.Linear(32, 2))


def _model_with_a_parametrized_layer():
    from lightning.pytorch.demos.boring_classes import BoringModel

    model = BoringModel()
    model.body = _WeightNormed()
    return model


def test_a_parametrized_module_is_one_line_before_any_rank_starts(tmp_path):
    """torch pickles a parametrized module (weight_norm, spectral_norm, parametrize) only through its state_dict: the
    spawn start failed in a 41-line traceback from torch's pickler, Lightning's ddp_spawn alike."""
    import pytest

    from distlab.errors import ConfigError
    from tests.helpers.tiny import quiet_cpu_trainer

    trainer = quiet_cpu_trainer(strategy="fsdp2_spawn", devices=2, max_steps=1, default_root_dir=tmp_path)
    with pytest.raises(
        ConfigError, match=r"^BoringModel\.body\.layer is parametrized .* apply the parametrization in"
    ):
        trainer.fit(_model_with_a_parametrized_layer())
    assert not list(tmp_path.iterdir())  # nothing started, nothing written
