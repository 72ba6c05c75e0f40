"""FSDP2 strategy selection, configs and one-line errors (no process group needed), and apply_fsdp2's dtypes (a 1-rank group)."""

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
    assert StrategyRegistry.get("fsdp2_spawn")._start_method == "forkserver"
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


@pytest.mark.timeout(120)
def test_mixed_precision_computes_in_param_dtype_and_reduces_in_reduce_dtype(tmp_path):
    """apply_fsdp2's dtypes land where their names say (a 1-rank gloo group in this process): the forward
    computes in ``param_dtype`` and the gradients arrive in the sharded params' own dtype, reduced in
    ``reduce_dtype`` (bf16 compute, fp32 reduction: the GPU preset's pair, tried on CPU)."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh

    from distlab.parallel.parallelize import apply_fsdp2

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        seen: list[torch.dtype] = []
        model[0].register_forward_hook(lambda m, i, out: seen.append(out.dtype))
        apply_fsdp2(model, init_device_mesh("cpu", (1,)), param_dtype="bfloat16", reduce_dtype="float32")
        model(torch.randn(4, 8)).float().sum().backward()
        assert seen == [torch.bfloat16], f"the forward computed in {seen}, not in param_dtype bfloat16"
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
        policy = model._get_fsdp_state()._mp_policy  # noqa: SLF001 - what fully_shard was given
        assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32), policy
    finally:
        dist.destroy_process_group()
