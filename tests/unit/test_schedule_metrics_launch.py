import math

import pytest
import torch
import torch.nn.functional as F

from distlab.errors import ConfigError
from distlab.launch import reconcile_trainer_config
from distlab.modules.metrics import LanguageModelMetrics
from distlab.modules.schedule import lr_multiplier


def test_warmup_then_linear_warmdown():
    m = [lr_multiplier(s, 100, warmup_steps=10, schedule="linear", warmdown_ratio=0.2) for s in range(100)]
    assert m[0] == pytest.approx(0.1) and m[9] == pytest.approx(1.0)
    assert m[10:80] == [1.0] * 70
    assert m[80] == pytest.approx(1.0) and m[90] == pytest.approx(0.5) and m[99] == pytest.approx(0.05)


def test_cosine_reaches_min_ratio():
    assert lr_multiplier(0, 50, schedule="cosine") == pytest.approx(1.0)
    assert lr_multiplier(25, 50, schedule="cosine", min_lr_ratio=0.1) == pytest.approx(0.55)
    assert lr_multiplier(50, 50, schedule="cosine", min_lr_ratio=0.1) == pytest.approx(0.1)
    assert lr_multiplier(7, 50, warmup_steps=2, schedule="constant") == 1.0


def test_lm_metrics_match_direct_computation_and_exclude_bos_from_bytes():
    torch.manual_seed(0)
    logits = torch.randn(2, 8, 257)
    targets = torch.randint(0, 256, (2, 8))
    targets[0, 3] = 256  # a document separator: in the loss, not a byte
    metric = LanguageModelMetrics()
    nats = F.cross_entropy(logits.view(-1, 257), targets.view(-1), reduction="none")
    metric.update(nats[:7], targets.view(-1)[:7])
    metric.update(nats[7:], targets.view(-1)[7:])  # accumulation across batches
    out = metric.compute()
    assert out["loss"].item() == pytest.approx(nats.mean().item(), rel=1e-6)
    assert out["ppl"].item() == pytest.approx(math.exp(nats.mean().item()), rel=1e-5)
    is_byte = targets.view(-1) < 256
    assert out["bpb"].item() == pytest.approx(nats[is_byte].mean().item() / math.log(2), rel=1e-6)


TORCHRUN = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}


def test_torchrun_fills_auto_devices_nodes_and_strategy():
    cfg = {"devices": "auto", "num_nodes": 1, "strategy": "auto"}
    notes = reconcile_trainer_config(cfg, TORCHRUN)
    assert cfg == {"devices": 2, "num_nodes": 2, "strategy": "ddp_optimizer_sync"} and notes
    cfg = {"devices": 2, "num_nodes": 2, "strategy": "fsdp"}
    assert reconcile_trainer_config(cfg, TORCHRUN) == [] and cfg["strategy"] == "fsdp"


def test_torchrun_mismatch_fails_in_one_line():
    with pytest.raises(ConfigError, match=r"torchrun started 4 processes \(2 per node\).*devices=3") as info:
        reconcile_trainer_config({"devices": 3, "num_nodes": 1}, TORCHRUN)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="devices=1 x num_nodes=2"):
        reconcile_trainer_config({"devices": 1, "num_nodes": 1}, TORCHRUN)  # never fewer than launched
    with pytest.raises(ConfigError, match="spawns its own processes"):
        reconcile_trainer_config({"devices": 2, "num_nodes": 2, "strategy": "ddp_spawn"}, TORCHRUN)


def test_srun_reads_slurms_per_node_count_and_refuses_one_that_is_no_count():
    """SLURM writes "2(x2)" for 2 tasks on each of 2 nodes; a value that is no count is one line, never a guess."""
    cfg = {"devices": "auto", "num_nodes": 1, "strategy": "auto"}
    reconcile_trainer_config(cfg, {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2(x2)"})
    assert (cfg["devices"], cfg["num_nodes"]) == (2, 2)
    with pytest.raises(ConfigError, match=r"SLURM_NTASKS_PER_NODE='abc' is not a process count") as info:
        reconcile_trainer_config({"devices": "auto"}, {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "abc"})
    assert "\n" not in str(info.value)


def test_no_launcher_changes_nothing():
    cfg = {"devices": "auto", "strategy": "auto"}
    assert reconcile_trainer_config(cfg, {}) == [] and cfg == {"devices": "auto", "strategy": "auto"}
    assert reconcile_trainer_config(cfg, {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "1"}) == []


def test_distlab_errors_become_one_line_even_from_spawned_children():
    from distlab.callbacks import NonFiniteLossError
    from distlab.cli.errors import refused_line as one_line_error
    from distlab.errors import ConfigError

    direct = NonFiniteLossError("non-finite loss on rank 1 at step 5: all 2 rank(s) stopped")
    assert one_line_error(direct) == (str(direct), 1)
    # ddp_spawn re-raises a child's error in the parent as text (torch's ProcessRaisedException).
    wrapped = RuntimeError(
        "\n\n-- Process 1 terminated with the following error:\nTraceback (most recent call last):\n  ...\n"
        "distlab.callbacks.early_stopping.NonFiniteLossError: non-finite loss on rank 1 at step 5: stopped\n"
    )
    assert one_line_error(wrapped) == ("non-finite loss on rank 1 at step 5: stopped", 1)
    config = RuntimeError("Traceback ...\ndistlab.errors.ConfigError: strategy 'x' needs y; set z\n")
    assert one_line_error(config) == ("strategy 'x' needs y; set z", 2)
    assert one_line_error(ConfigError("bad value 3; set 4")) == ("bad value 3; set 4", 2)
    assert one_line_error(RuntimeError("something else")) is None
