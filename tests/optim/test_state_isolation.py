"""A loaded optimizer state is the optimizer's own: ``load_state_dict`` copies every tensor, so stepping afterwards
never changes the dict it was given (a checkpoint held in memory, a state shared between two optimizers), and the
loaded optimizer continues exactly as the one that saved it.

Over every optimizer class ``distlab.optim`` exports (discovered, not listed), on one process, with Muon matrices,
conv kernels, vectors and an embedding; each class built as its docstring shows."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch import nn

import distlab.optim
from distlab.optim import muon_param_groups

OPTIMIZERS = sorted(
    name
    for name in distlab.optim.__all__
    if inspect.isclass(getattr(distlab.optim, name))
    and issubclass(getattr(distlab.optim, name), torch.optim.Optimizer)
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.Conv1d(8, 4, 3), nn.LayerNorm(4))


def _build(name: str, model: nn.Module, scale: float = 1.0) -> torch.optim.Optimizer:
    """``scale`` != 1 builds it with other hyperparameters (learning rates and weight decay)."""
    cls = getattr(distlab.optim, name)
    wd = 0.0 if scale == 1.0 else 0.1 * scale
    if name == "DistMuon":
        return cls(
            [p for p in model.parameters() if p.ndim >= 2 and p.shape[0] != 10],
            lr=0.02 * scale,
            weight_decay=wd,
            ns_dtype="float32",
        )
    if name == "DistAdamW":
        return cls(model.parameters(), lr=1e-2 * scale, weight_decay=wd)
    groups = muon_param_groups(
        model, lr=0.02 * scale, adamw_lr=1e-2 * scale, weight_decay=wd, adamw_weight_decay=wd, verbose=False
    )
    return cls(groups, ns_dtype="float32")


def _step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)
    opt.step()


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)


def test_every_optimizer_is_covered():
    assert {"DistMuonAdamW", "DistMuon", "DistAdamW"} <= set(OPTIMIZERS)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_loaded_state_is_copied_and_continues_exactly(name):
    saver_model = _model()
    saver = _build(name, saver_model)
    for seed in (1, 2):
        _step(saver_model, saver, seed)
    given = copy.deepcopy(saver.state_dict())  # a checkpoint held in memory (torch's state_dict() is live)
    frozen = copy.deepcopy(given)
    loader_model = copy.deepcopy(saver_model)
    loader = _build(name, loader_model)
    loader.load_state_dict(given)
    given_storages = {t.untyped_storage().data_ptr() for t in _tensors(given) if t.numel()}
    assert not any(
        t.untyped_storage().data_ptr() in given_storages for t in _tensors(loader.state) if t.numel()
    )
    for seed in (3, 4):
        _step(saver_model, saver, seed)
        _step(loader_model, loader, seed)
    assert all(torch.equal(a, b) for a, b in zip(_tensors(given), _tensors(frozen), strict=True)), (
        "stepping after load_state_dict changed the dict it was given"
    )
    for a, b in zip(saver_model.parameters(), loader_model.parameters(), strict=True):
        assert torch.equal(a, b), "the loaded optimizer did not continue as the one that saved it"


def _hyperparameters(opt: torch.optim.Optimizer) -> list[dict]:
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_loaded_state_brings_its_groups_hyperparameters(name):
    """As torch's own optimizers do (checked here on torch.optim.AdamW, the oracle of the semantics): after
    load_state_dict, every group's hyperparameters are the saved ones, whatever the loader was built with, and
    stepping continues as the saver would."""
    oracle_model = _model()
    torch_saver = torch.optim.AdamW(oracle_model.parameters(), lr=0.5, weight_decay=0.3)
    torch_loader = torch.optim.AdamW(copy.deepcopy(oracle_model).parameters(), lr=1e-3)
    torch_loader.load_state_dict(torch_saver.state_dict())
    assert torch_loader.param_groups[0]["lr"] == 0.5 and torch_loader.param_groups[0]["weight_decay"] == 0.3

    saver_model = _model()
    saver = _build(name, saver_model, scale=3.0)
    _step(saver_model, saver, 1)
    loader_model = copy.deepcopy(saver_model)
    loader = _build(name, loader_model)  # built with other learning rates and weight decay
    assert _hyperparameters(loader) != _hyperparameters(saver)
    loader.load_state_dict(copy.deepcopy(saver.state_dict()))
    assert _hyperparameters(loader) == _hyperparameters(saver)
    for seed in (2, 3):
        _step(saver_model, saver, seed)
        _step(loader_model, loader, seed)
    for a, b in zip(saver_model.parameters(), loader_model.parameters(), strict=True):
        assert torch.equal(a, b), "the loaded optimizer did not continue with the saved hyperparameters"
