"""Short single-process fits on CPU that guard claims no earlier test held (audit 25).

- FSDP2Strategy(param_dtype="bfloat16") computes the sharded module's forward in bfloat16.
- SyncEarlyStopping's non-finite-loss check sees every accumulation micro-batch, not only the last.

Every oracle is computed here without the code under test.
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from distlab.callbacks import SyncEarlyStopping
from distlab.callbacks.early_stopping import NonFiniteLossError
from tests.helpers.tiny import quiet_cpu_trainer


class _RecordsComputeDtype(BoringModel):
    """BoringModel (self.layer = Linear(32, 2)) recording the dtype its layer computes in."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.dtype] = []
        self.layer.register_forward_hook(lambda m, i, out: self.seen.append(out.dtype))


@pytest.mark.timeout(120)
def test_fsdp2_param_dtype_reaches_the_sharded_module(tmp_path):
    """A 1-rank in-process FSDP2 fit (gloo) with param_dtype="bfloat16": the strategy shards the module's child
    with that mixed-precision policy, so the training forward computes in bfloat16 and the sharded master
    weights stay float32.

    Catches the strategy passing only some of its options (reshard_after_forward, cpu_offload) to the
    sharding: bf16 compute would be silently dropped.
    """
    from distlab.strategies import FSDP2Strategy

    model = _RecordsComputeDtype()
    trainer = quiet_cpu_trainer(
        strategy=FSDP2Strategy(param_dtype="bfloat16"),
        max_steps=1,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    try:
        trainer.fit(model)
    finally:  # the 1-rank process group this fit made in the test process is not left to later tests
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert model.seen, "the layer never ran"
    assert set(model.seen) == {torch.bfloat16}, f"the forward computed in {model.seen}, not bfloat16"
    policy = model.layer._get_fsdp_state()._mp_policy  # noqa: SLF001 - what fully_shard was given
    assert policy.param_dtype == torch.bfloat16, policy
    assert all(p.dtype == torch.float32 for p in model.layer.parameters())


class _NaNFirstMicroBatch(BoringModel):
    """BoringModel whose loss is NaN on batch 0 only (the first micro-batch of the first optimizer step)."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)["loss"]
        return loss * float("nan") if batch_idx == 0 else loss


@pytest.mark.timeout(120)
def test_a_nan_in_the_first_accumulation_micro_batch_stops_the_fit(tmp_path):
    """With accumulate_grad_batches=2, a NaN loss in the FIRST micro-batch of a step (the second is finite)
    raises NonFiniteLossError before that optimizer step: the weights are never touched by the NaN gradient.

    Catches the flag following only the last micro-batch's loss (the NaN would be stepped into the weights).
    """
    torch.manual_seed(0)
    model = _NaNFirstMicroBatch()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer = quiet_cpu_trainer(
        max_steps=2,
        limit_val_batches=0,
        accumulate_grad_batches=2,
        callbacks=[SyncEarlyStopping(monitor="val_loss", strict=False)],
        default_root_dir=tmp_path,
    )
    with pytest.raises(NonFiniteLossError) as info:
        trainer.fit(model)
    after = model.state_dict()
    for k, v in before.items():
        assert torch.equal(after[k], v), f"{k} changed: the step with the NaN micro-batch was taken"
    assert "non-finite loss on rank 0 at step 0" in str(info.value), info.value
