"""FSDP2 for any model, applied by the strategy (torchtitan's ``parallelize`` pattern).

:func:`apply_fsdp2` shards a model's blocks, then the model itself, with
``torch.distributed.fsdp.fully_shard``: every parameter becomes a DTensor sharded Shard(0) over the
mesh; a block's parameters are all-gathered just before it runs and freed after; gradients are
reduce-scattered (and averaged over the mesh) into local shards after backward. Blocks are the
members of the model's ``nn.ModuleList``s (a transformer's layers), outermost first; a model without
one is sharded as a single unit. DistMuonAdamW sees DTensor params and runs in its sharded mode.

:func:`shard_lightning_module` is what ``FSDP2Strategy`` calls on the user's LightningModule: it
applies :func:`apply_fsdp2` to each child module that holds parameters (the LightningModule itself
never runs ``forward`` under Lightning, so it cannot be an FSDP root). The module needs no FSDP2 code.

A run's sharded checkpoint folder becomes one plain file with :func:`distlab.checkpoint.export_consolidated`.

Example::

    mesh = init_device_mesh("cuda", (world,))
    apply_fsdp2(model, mesh, param_dtype=torch.bfloat16)          # bf16 compute, fp32 master + reduce
    opt = DistMuonAdamW(groups)                                    # sharded mode: params are DTensors
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from distlab.distributed import broadcast_module_states
from distlab.domains import check_domains, refusal
from distlab.dtypes import DtypeName, parse_dtype
from distlab.errors import ConfigError


def is_fsdp2(module: nn.Module) -> bool:
    """True when ``fully_shard`` has been applied to ``module``."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, nn.Module):  # cheap: it is asked of every submodule
        raise ConfigError(f"is_fsdp2: {refusal('module', module, nn.Module, python=True)}")

    return isinstance(module, FSDPModule)


def fsdp2_blocks(model: nn.Module) -> list[nn.Module]:
    """The units sharded before the model itself: members of ``nn.ModuleList``s that hold parameters,
    outermost only (a block's own inner lists stay inside it)."""
    blocks: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList):
            continue
        if any(name.startswith(b + ".") for b, _ in blocks):
            continue
        for i, member in enumerate(module):
            if any(True for _ in member.parameters()):
                blocks.append((f"{name}.{i}" if name else str(i), member))
    return [m for _, m in blocks]


def apply_fsdp2(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype | DtypeName | None = None,
    reduce_dtype: torch.dtype | DtypeName | None = torch.float32,
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
    broadcast_from_rank0: bool = True,
) -> nn.Module:
    """Shard ``model`` in place with FSDP2 over ``mesh``: each block (:func:`fsdp2_blocks`), then the model.
    Returns it.

    Args:
        mesh: a 1-D DeviceMesh (data parallel: FSDP2), or a 2-D one (replicate, shard): HSDP, each parameter
            sharded over the last dimension (a node's GPUs) and replicated over the first (the nodes); gradients
            are reduce-scattered in the shard group and all-reduced across replicas.
        param_dtype: compute dtype of the all-gathered params (bf16 on GPU); None keeps fp32. The
            sharded master params stay in their own dtype.
        reduce_dtype: dtype of the gradient reduce-scatter (fp32 by default, also under bf16 params).
        reshard_after_forward: free each block's gathered params after its forward (re-gather in
            backward). The model's own (root) params stay gathered: backward uses them first anyway.
        cpu_offload: keep sharded params, grads and optimizer state on CPU (CPUOffloadPolicy).
        broadcast_from_rank0: first make every rank's weights equal to rank 0's.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    check_domains(apply_fsdp2, locals())
    if is_fsdp2(model):
        raise RuntimeError("apply_fsdp2: the model is already sharded (fully_shard was applied)")
    if mesh.ndim not in (1, 2):
        raise ValueError(
            f"apply_fsdp2 needs a 1-D data-parallel mesh (FSDP2) or a 2-D (replicate, shard) one (HSDP), got a "
            f"{mesh.ndim}-D mesh; slice it"
        )
    param_dtype = parse_dtype(param_dtype, "param_dtype")
    reduce_dtype = parse_dtype(reduce_dtype, "reduce_dtype")
    if broadcast_from_rank0:
        broadcast_module_states(model, mesh_group(mesh))
    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
        "offload_policy": CPUOffloadPolicy() if cpu_offload else OffloadPolicy(),
    }
    for block in fsdp2_blocks(model):
        fully_shard(block, reshard_after_forward=reshard_after_forward, **kwargs)
    fully_shard(model, reshard_after_forward=False, **kwargs)
    return model


def shard_lightning_module(pl_module: nn.Module, mesh: DeviceMesh, **fsdp2_kwargs: Any) -> list[str]:
    """Apply :func:`apply_fsdp2` to each child of ``pl_module`` that holds parameters; returns their names.

    Leaves the module alone when it already holds FSDP2 modules (it sharded itself in ``configure_model``).
    Parameters registered on ``pl_module`` itself cannot be sharded (it is never called as a module):
    a one-line error says to move them into a submodule.
    """
    check_domains(shard_lightning_module, locals())
    if any(is_fsdp2(m) for m in pl_module.modules()):
        return []
    own = [name for name, _ in pl_module.named_parameters(recurse=False)]
    if own:
        raise ConfigError(
            f"FSDP2 shards the child modules of {type(pl_module).__name__}, but parameter(s) {own} sit on the "
            "LightningModule itself; move them into a submodule (e.g. self.net), or apply fully_shard in configure_model"
        )
    broadcast_module_states(pl_module, mesh_group(mesh))
    roots = []
    for name, child in pl_module.named_children():
        if any(True for _ in child.parameters()):
            apply_fsdp2(child, mesh, broadcast_from_rank0=False, **fsdp2_kwargs)
            roots.append(name)
    return roots


def hsdp_mesh(device_type: str, world: int, replicate_degree: int):
    """The 2-D (replicate, shard) mesh of HSDP over ``world`` ranks: ``replicate_degree`` replicas (one per node,
    typically) of ``world / replicate_degree`` shards; ranks [i*S, (i+1)*S) shard replica i. One-line ConfigError
    when it does not divide the world."""
    from torch.distributed.device_mesh import init_device_mesh

    if world % replicate_degree:
        raise ConfigError(
            f"replicate_degree={replicate_degree} does not divide the {world} ranks into equal replicas; set it to "
            f"a divisor of {world} (the number of nodes, usually)"
        )
    return init_device_mesh(
        device_type, (replicate_degree, world // replicate_degree), mesh_dim_names=("replicate", "shard")
    )


def mesh_group(mesh):
    """The process group of every rank of ``mesh`` (a 1-D mesh's own; a 2-D mesh spans the world here)."""
    return mesh.get_group() if mesh.ndim == 1 else None


def full_state_dict(module: nn.Module, rank0_only: bool = False) -> dict[str, torch.Tensor]:
    """Collective: ``module``'s full, unsharded state dict as plain CPU tensors.

    Every rank gets it, or with ``rank0_only`` only rank 0 (the others get {}), gathering one tensor at a
    time straight to CPU.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    check_domains(full_state_dict, locals())

    options = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)
    return {k: v.detach().cpu() for k, v in get_model_state_dict(module, options=options).items()}
