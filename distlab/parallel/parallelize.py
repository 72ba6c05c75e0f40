"""FSDP2 for any model, applied by the strategy (torchtitan's ``parallelize`` pattern; docs/internals.md, "FSDP2").

:func:`apply_fsdp2` shards a model; :func:`shard_lightning_module` shards a LightningModule's children, the
LightningModule being the root unit (what ``FSDP2Strategy`` does). Every rank must run the same units in the same
order (an expert only some ranks call cannot be a unit): ``FSDP2Strategy`` checks that at each unit. Shared
parameters (a tied embedding and head, a submodule used twice) stay one parameter: FSDP2 shards a parameter in one
unit only, and two units sharding their own copies would silently train two untied weights (:func:`plan_units`).

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


def runs_forward(module: nn.Module) -> bool:
    """Whether ``module`` has a forward of its own: containers (``ModuleList``, ``ModuleDict``, ``ParameterList``,
    ``ParameterDict``) have none, so FSDP2 cannot gather their parameters when they are used."""
    return type(module).forward is not nn.Module.forward


def unit_candidates(module: nn.Module) -> list[nn.Module]:
    """The children of ``module`` that can be FSDP2 units, found through its containers (a ``ModuleList`` of
    blocks set on a LightningModule): each once, however often it is listed, in model order. A parameter
    container's parameters stay with ``module``."""
    found: dict[int, nn.Module] = {}
    for child in module.children():
        if runs_forward(child):
            found.setdefault(id(child), child)
        elif isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            for inner in unit_candidates(child):
                found.setdefault(id(inner), inner)
    return list(found.values())


def fsdp2_blocks(model: nn.Module) -> list[nn.Module]:
    """The candidate units sharded before the model itself: members of ``nn.ModuleList``s that hold parameters and
    run a forward, outermost only (a block's own inner lists stay inside it), each once (a block listed three
    times, ALBERT's sharing, is one block)."""
    blocks: dict[int, tuple[str, nn.Module]] = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList):
            continue
        if any(name.startswith(b + ".") for b, _ in blocks.values()):
            continue
        for i, member in enumerate(module):
            if runs_forward(member) and any(True for _ in member.parameters()):
                blocks.setdefault(id(member), (f"{name}.{i}" if name else str(i), member))
    return [m for _, m in blocks.values()]


def plan_units(roots: list[nn.Module]) -> list[list[nn.Module]]:
    """The blocks of ``roots`` (one model, or children of a LightningModule that share parameters) grouped into
    FSDP2 units so that no parameter is held by two units: blocks that share a parameter with each other form one
    unit; a block that shares one with anything outside the blocks is left to the roots' own unit. Each entry is
    the modules of one unit (``fully_shard`` takes the list), in model order."""
    blocks = [b for root in roots for b in fsdp2_blocks(root)]
    block_of = {id(b): i for i, b in enumerate(blocks)}
    held: list[set[int]] = [set() for _ in blocks]
    outside: set[int] = set()  # parameters reached through no block (a head tied to a block's weight)
    for root in roots:
        modules = dict(root.named_modules(remove_duplicate=False))
        for name, param in root.named_parameters(remove_duplicate=False):
            path = name.split(".")[:-1]
            through = [block_of[id(modules[".".join(path[:k])])] for k in range(1, len(path) + 1)
                       if id(modules[".".join(path[:k])]) in block_of]  # fmt: skip
            if through:
                held[through[0]].add(id(param))
            else:
                outside.add(id(param))
    return [
        [blocks[i] for i in unit]
        for unit in components(held)
        if not any(held[i] & outside for i in unit)  # shares with the model itself: the model's unit holds it
    ]


def components(held: list[set[int]]) -> list[list[int]]:
    """The indices of ``held`` (each a set of parameter ids) grouped so that two sets sharing an id, directly or
    through others, are in one group; groups in order of their first member."""
    groups: list[list[int]] = []
    for i in range(len(held)):
        joined = [g for g in groups if any(held[i] & held[j] for j in g)]
        groups = [g for g in groups if g not in joined] + [sorted({i, *(j for g in joined for j in g)})]
    return sorted(groups)


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
    check_domains(apply_fsdp2, locals())
    if is_fsdp2(model):
        raise RuntimeError("apply_fsdp2: the model is already sharded (fully_shard was applied)")
    check_shardable(model)
    if broadcast_from_rank0:
        broadcast_module_states(model, mesh_group(mesh))
    shard_tree(
        [model], model, fsdp2_options(mesh, param_dtype, reduce_dtype, reshard_after_forward, cpu_offload)
    )
    return model


def check_shardable(model: nn.Module) -> None:
    """torch's ``fully_shard`` shards every parameter along dim 0, so a 0-D one cannot be sharded: one line naming
    them, before anything is sharded."""
    scalars = [name for name, p in model.named_parameters() if p.ndim == 0]
    if scalars:
        raise ConfigError(
            f"FSDP2 cannot shard the 0-D parameter(s) {scalars} of {type(model).__name__} (torch's fully_shard splits "
            "each parameter along its first dimension); make each a 1-D tensor of one element, e.g. "
            "nn.Parameter(torch.ones(1)), or train with ddp_optimizer_sync"
        )


def fsdp2_options(
    mesh: DeviceMesh,
    param_dtype: torch.dtype | DtypeName | None,
    reduce_dtype: torch.dtype | DtypeName | None,
    reshard_after_forward: bool,
    cpu_offload: bool,
) -> dict[str, Any]:
    """``fully_shard``'s keyword arguments for these :func:`apply_fsdp2` settings (a block's)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    return {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=parse_dtype(param_dtype, "param_dtype"),
            reduce_dtype=parse_dtype(reduce_dtype, "reduce_dtype"),
        ),
        "offload_policy": CPUOffloadPolicy() if cpu_offload else OffloadPolicy(),
        "reshard_after_forward": reshard_after_forward,
    }


def shard_tree(parts: list[nn.Module], root: nn.Module, options: dict[str, Any]) -> None:
    """``fully_shard`` each unit :func:`plan_units` finds in ``parts``, then ``root``: the unit that holds the rest
    of their parameters (what the parts share with each other, and ``root``'s own)."""
    from torch.distributed.fsdp import fully_shard

    for unit in plan_units(parts):
        fully_shard(unit if len(unit) > 1 else unit[0], **options)
    fully_shard(root, **{**options, "reshard_after_forward": False})  # the root's stay gathered


STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")


def shard_lightning_module(
    pl_module: nn.Module,
    mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype | DtypeName | None = None,
    reduce_dtype: torch.dtype | DtypeName | None = torch.float32,
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
) -> list[str]:
    """What ``FSDP2Strategy`` does to the user's LightningModule: each child holding parameters
    (:func:`unit_candidates`) is sharded as :func:`apply_fsdp2` shards a model (children that share a parameter, a
    head tied to the embedding, by their blocks only), and the LightningModule is the root unit, whose step methods
    are FSDP's forward (it gathers and reduces once per step). Returns the children's names. Leaves alone a module
    that already holds FSDP2 modules (it sharded itself in ``configure_model``)."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    check_domains(shard_lightning_module, locals())
    if any(is_fsdp2(m) for m in pl_module.modules()):
        return []
    check_shardable(pl_module)
    broadcast_module_states(pl_module, mesh_group(mesh))
    options = fsdp2_options(mesh, param_dtype, reduce_dtype, reshard_after_forward, cpu_offload)
    names = {id(m): name for name, m in pl_module.named_modules()}
    holding = [child for child in unit_candidates(pl_module) if any(True for _ in child.parameters())]
    shared = []  # children that share a parameter with another: sharded by their blocks, the root holds the rest
    for group in components([{id(p) for p in child.parameters()} for child in holding]):
        unit = [holding[i] for i in group]
        if len(unit) == 1:
            shard_tree(unit, unit[0], options)
        else:
            shared += unit
    shard_tree(shared, pl_module, options)
    for method in STEP_METHODS:
        register_fsdp_forward_method(pl_module, method)
    return [names[id(child)] for child in holding]


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
