"""muon_param_groups / split_params on models that are not distlab's: every trainable parameter exactly once."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from distlab.models.cnn import DigitsCNN
from distlab.models.gpt import GPT, GPTConfig
from distlab.optim import DistMuonAdamW, muon_param_groups, split_params
from tests.helpers.gpt_roles import gpt_roles


def names(roles, role):
    return [n for n, _ in roles[role]]


def test_gpt_roles_equal_the_split_read_off_its_structure():
    model = GPT(GPTConfig(depth=2, sequence_len=16))
    roles, own = split_params(model), gpt_roles(model)
    for role, key in (("muon", "matrix"), ("embedding", "embedding"), ("head", "head"), ("adamw", "scalar")):
        assert [id(p) for _, p in roles[role]] == [id(p) for p in own[key]], role


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_the_gpt_modules_groups_are_muon_param_groups_with_its_names_and_rates(optimizer):
    """GPTLightningModule builds its groups with muon_param_groups: the structural roles, each group's kind and
    settings (the matrices are AdamW's under optimizer='adamw', with their own rate)."""
    from distlab.modules import GPTLightningModule

    module = GPTLightningModule(
        depth=2, sequence_len=16, optimizer=optimizer, weight_decay=0.05, betas=(0.8, 0.9)
    )
    own = gpt_roles(module.model)
    groups = {g["name"]: g for g in module.param_groups()}
    assert list(groups) == ["embedding", "head", "matrix"]
    for name in groups:
        assert [id(p) for p in groups[name]["params"]] == [id(p) for p in own[name]], name
    adamw = [groups["embedding"], groups["head"]] + ([groups["matrix"]] if optimizer == "adamw" else [])
    for g in adamw:
        assert (g["kind"], g["betas"], g["eps"], g["weight_decay"]) == ("adamw", (0.8, 0.9), 1e-10, 0.05)
    if optimizer == "muon":
        m = groups["matrix"]
        assert (m["kind"], m["lr"], m["momentum"], m["weight_decay"]) == ("muon", 0.02, 0.95, 0.05)
    # a frozen token embedding leaves its group out; the other groups keep their settings
    module.model.wte.weight.requires_grad_(False)
    frozen = {g["name"]: g for g in module.param_groups()}
    assert list(frozen) == ["head", "matrix"]
    for name, g in frozen.items():
        assert {k: v for k, v in g.items() if k != "params"} == {
            k: v for k, v in groups[name].items() if k != "params"
        }


def test_cnn_kernels_go_to_muon_head_and_biases_to_adamw():
    roles = split_params(DigitsCNN(width=4))
    assert names(roles, "muon") == ["conv1.weight", "conv2.weight", "conv3.weight"]
    assert names(roles, "head") == ["head.weight"]
    assert names(roles, "adamw") == ["conv1.bias", "conv2.bias", "conv3.bias", "head.bias"]


class LoRALike(nn.Module):
    """Frozen base, trainable low-rank adapters, a tied embedding/head, a norm and a scalar gate."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.base = nn.Linear(8, 8)
        self.base.requires_grad_(False)
        self.lora_a = nn.Linear(8, 2, bias=False)
        self.lora_b = nn.Linear(2, 8, bias=False)
        self.norm = nn.LayerNorm(8)
        self.gate = nn.Parameter(torch.zeros(()))
        self.out = nn.Linear(8, 11, bias=False)
        self.out.weight = self.emb.weight  # tied


def test_frozen_tied_overrides_and_head_choice():
    model = LoRALike()
    roles = split_params(model)
    assert names(roles, "embedding") == ["emb.weight"]  # the tied weight once, as the embedding
    assert names(roles, "muon") == ["lora_a.weight", "lora_b.weight"]
    assert names(roles, "head") == []  # the last Linear's weight is the embedding's
    assert sorted(names(roles, "adamw")) == ["gate", "norm.bias", "norm.weight"]
    assert all(p.requires_grad for ps in roles.values() for _, p in ps)  # frozen base left out
    roles = split_params(model, adamw=["lora_b.*"], head=["lora_a"])
    assert names(roles, "head") == ["lora_a.weight"] and "lora_b.weight" in names(roles, "adamw")
    assert names(split_params(model, head=None), "muon") == ["lora_a.weight", "lora_b.weight"]
    with pytest.raises(ValueError, match="matches no module"):
        split_params(model, head=["nonexistent"])
    with pytest.raises(ValueError, match="Muon needs >= 2-D"):
        split_params(model, muon=["gate"])


def test_groups_feed_distmuonadamw_and_log_one_line(caplog):
    model = DigitsCNN(width=4)
    with caplog.at_level("INFO", logger="distlab"):
        groups = muon_param_groups(model, lr=0.02, adamw_lr=1e-3, head_lr=5e-4)
    assert [g["name"] for g in groups] == ["muon", "head", "adamw"]
    assert {g["name"]: g["lr"] for g in groups} == {"muon": 0.02, "head": 5e-4, "adamw": 1e-3}
    placed = [id(p) for g in groups for p in g["params"]]
    assert sorted(placed) == sorted(id(p) for p in model.parameters())
    opt = DistMuonAdamW(groups)
    model(torch.rand(2, 1, 8, 8)).sum().backward()
    opt.step()  # one process: torch's math; conv kernels through their 2-D views
    assert any("Muon 3 tensors" in r.message and "AdamW 5 tensors" in r.message for r in caplog.records)


def test_a_pattern_or_setting_name_that_means_nothing_is_refused():
    """A muon/adamw pattern that matches no parameter, and a kind_defaults key its kind does not have, are
    ValueErrors: they would be kept and ignored, so the model trained with the default split or hyperparameters."""
    import pytest
    import torch.nn as nn

    from distlab.optim import DistMuonAdamW, muon_param_groups

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"'encoder\.\*' matches no parameter of Sequential"):
        muon_param_groups(model, muon=["encoder.*"], verbose=False)
    with pytest.raises(ValueError, match=r"'decoder\.\*' matches no parameter"):
        muon_param_groups(model, adamw=["decoder.*"], verbose=False)
    weight = model[0].weight
    with pytest.raises(
        ValueError, match=r"kind_defaults\['adamw'\] sets \['wd'\], which adamw groups do not have"
    ):
        DistMuonAdamW([{"params": [weight], "kind": "muon"}], kind_defaults={"adamw": {"wd": 0.1}})
    with pytest.raises(ValueError, match="kind_defaults has a kind 'sgd'"):
        DistMuonAdamW([{"params": [weight], "kind": "muon"}], kind_defaults={"sgd": {"lr": 0.1}})
    tagged = DistMuonAdamW(
        [{"params": [weight], "kind": "muon", "my_tag": "encoder"}]
    )  # a user's own key: kept
    assert tagged.param_groups[0]["my_tag"] == "encoder"
