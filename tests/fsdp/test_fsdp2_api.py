"""FSDP2 strategy selection, configs and one-line errors (no process group needed)."""

from __future__ import annotations

import pytest
import torch
import yaml
from lightning.pytorch.strategies import StrategyRegistry

from distlab.cli import main
from distlab.dtypes import parse_dtype
from distlab.errors import ConfigError
from distlab.optim import DistMuonAdamW
from distlab.strategies import FSDP2Strategy
from tests.helpers.cli import CONFIGS


def test_registered_names_and_grad_sync():
    assert {"fsdp2", "fsdp2_spawn"} <= set(StrategyRegistry.available_strategies())
    assert StrategyRegistry.get("fsdp2_spawn")._start_method == "spawn"
    strategy = StrategyRegistry.get("fsdp2")
    assert isinstance(strategy, FSDP2Strategy) and strategy._start_method == "popen"
    assert strategy.grad_sync == "sharded"  # what it tells a DistMuonAdamW left at grad_sync="auto"
    assert (
        strategy.fsdp2_kwargs["reduce_dtype"] == torch.float32
        and strategy.fsdp2_kwargs["param_dtype"] is None
    )


def test_dtype_options_and_errors():
    s = FSDP2Strategy(param_dtype="bfloat16", cpu_offload=True)
    assert s.fsdp2_kwargs["param_dtype"] == torch.bfloat16 and s.fsdp2_kwargs["cpu_offload"]
    assert parse_dtype("fp32", "x") == torch.float32
    with pytest.raises(ConfigError, match="param_dtype=int8 is not accepted"):
        FSDP2Strategy(param_dtype="int8")
    with pytest.raises(ConfigError, match="start_method"):
        FSDP2Strategy(start_method="thread")


def test_sharded_mode_refuses_plain_params():
    opt = DistMuonAdamW(
        [{"params": [torch.nn.Parameter(torch.ones(4, 4))], "kind": "muon"}], grad_sync="sharded"
    )
    opt.param_groups[0]["params"][0].grad = torch.ones(4, 4)
    with pytest.raises(ValueError, match="needs FSDP2-sharded \\(DTensor\\) params"):
        opt.step()


def test_gpu_preset_parses(capsys):
    with pytest.raises(SystemExit) as info:
        main(
            [
                "fit",
                "--config",
                str(CONFIGS / "debug.yaml"),
                "--config",
                str(CONFIGS / "trainer" / "fsdp2_gpu.yaml"),
                "--print_config",
            ]
        )
    assert info.value.code == 0
    strategy = yaml.safe_load(capsys.readouterr().out)["trainer"]["strategy"]
    assert strategy["class_path"] == "distlab.strategies.FSDP2Strategy"
    assert (
        strategy["init_args"]["param_dtype"] == "bfloat16"
        and strategy["init_args"]["reduce_dtype"] == "float32"
    )


class _RunsCode:
    """Unpickling this runs ``touch <marker>``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.timeout(120)
def test_the_strategys_own_load_refuses_a_strangers_file_from_python(tmp_path):
    """``trainer.fit(ckpt_path=...)`` from Python reaches FSDP2Strategy.load_checkpoint without the CLI's checks:
    the strategy makes them itself (a pickle that would run code, a file that is not a Lightning checkpoint)."""
    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel

    marker = tmp_path / "ran"
    payload, bare = tmp_path / "payload.ckpt", tmp_path / "bare.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"x": _RunsCode(marker)}}, payload)
    torch.save({"layer.weight": torch.zeros(2, 32)}, bare)
    for path, said in [(payload, "cannot read it"), (bare, "is not a Lightning checkpoint")]:
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            strategy=FSDP2Strategy(),
            max_steps=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            default_root_dir=tmp_path,
        )
        with pytest.raises(ConfigError, match=said):
            trainer.fit(BoringModel(), ckpt_path=str(path))
    assert not marker.exists(), "the checkpoint's pickle ran code"
