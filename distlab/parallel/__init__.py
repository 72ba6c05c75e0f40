"""Parallelising a model: FSDP2 (``fully_shard``) applied by the strategy, torchtitan-style.

Example::

    from distlab.parallel import apply_fsdp2
    apply_fsdp2(model, init_device_mesh("cpu", (world,)))
"""

from distlab.parallel.parallelize import apply_fsdp2, full_state_dict, is_fsdp2, shard_lightning_module

__all__ = ["apply_fsdp2", "full_state_dict", "is_fsdp2", "shard_lightning_module"]
