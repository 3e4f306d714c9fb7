"""Which ranks shard together: the device mesh, derived from the variable file's topology.

The reference setup is 2 x g6.12xlarge: 4 L4 per node on PCIe, one 40 Gbit/s EFA interface per
node. Full sharding runs every FSDP2 collective over all 8 ranks, so each all-gather and
reduce-scatter of every micro-batch crosses the EFA link (about 10.8 GB per rank per 8k-token
micro-batch for Qwen2.5-1.5B). Hybrid sharding shards within a node and replicates across nodes:
the per-micro-batch traffic stays on the node's PCIe, and only one all-reduce of each rank's
gradient shard per optimizer step crosses the network (about 1.5 GB per rank). The cost is
memory: parameters, gradients and optimizer state are sharded 4 ways, not 8.

Ranks are laid out node by node (Ray Train numbers the workers of one node, one pod, contiguously),
so node i holds ranks i*S .. i*S+S-1 (S = ranks per node), which is row i of the
("replicate", "shard") mesh. `placement_problem` checks at start-up that Ray really put them there.

Heterogeneous worker groups (different GPUs per node): `auto` resolves to full sharding, and
`hybrid` is refused when the file is loaded (`ClusterConfig.cross_field_problems`): a 2-D mesh
needs equal shard groups.

The plan itself (`MeshPlan`, `mesh_plan`, `plan_from`) is a fact of the variable file and lives in
`config.mesh`, so `python -m config check` prints it without importing the workload; it is re-exported here.
"""

from __future__ import annotations

import os
import socket

from config.mesh import (  # noqa: F401
    MESH_DIMS_FULL,
    MESH_DIMS_HYBRID,
    MeshPlan,
    Sharding,
    mesh_plan,
    plan_from,
    resolve_sharding,
)


def build_mesh(plan: MeshPlan, device_type: str):
    """The `DeviceMesh` for `fully_shard(mesh=...)`: 1-D ("shard",) for full, 2-D ("replicate", "shard") for hybrid.

    Collective: every rank must call it (the hybrid mesh creates one process group per row and column).
    """
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, plan.mesh_shape, mesh_dim_names=plan.mesh_dim_names)


# ---- placement ------------------------------------------------------------------------------


class PlacementError(RuntimeError):
    """Ray placed the ranks of a shard group on more than one node (or the node sizes differ from the file)."""


def placement_problem(plan: MeshPlan, node_names: list[str]) -> str | None:
    """Why the observed placement (`node_names[rank]`: the node each rank runs on) breaks the plan, or None.

    Under hybrid sharding each shard group must sit on one node and no two groups on the same one;
    full sharding works with any placement (every collective spans all ranks anyway).
    """
    if len(node_names) != plan.world_size:
        return f"expected {plan.world_size} ranks, found {len(node_names)}"
    if plan.sharding != "hybrid":
        return None
    problems = []
    owner: dict[str, int] = {}
    for node in range(plan.replicate):
        ranks = plan.shard_group(node * plan.shard)
        found = sorted({node_names[r] for r in ranks})
        if len(found) != 1:
            where = ", ".join(f"rank {r} on {node_names[r]}" for r in ranks)
            problems.append(f"shard group {ranks} should share one node but is spread over {found} ({where})")
            continue
        if found[0] in owner:
            problems.append(f"shard groups {plan.shard_group(owner[found[0]] * plan.shard)} and {ranks} are both on "
                            f"{found[0]}; expected one group of {plan.shard} ranks per node")
        owner[found[0]] = node
    if not problems:
        return None
    return (f"hybrid sharding expects {plan.nodes} nodes of {plan.ranks_per_node} ranks with ranks "
            f"i*{plan.shard}..i*{plan.shard}+{plan.shard - 1} on node i; found: " + "; ".join(problems)
            + ". Ray numbers workers pod by pod: with several pods per node use one pod per node "
            "(gpus_per_pod = the node's GPUs), or set job.sharding: full")


def check_placement(plan: MeshPlan, node_name: str) -> None:
    """Gather every rank's node name and raise `PlacementError` when the plan does not hold (collective).

    Runs before the model is loaded, so a bad placement costs seconds, not a model download.
    """
    import torch.distributed as dist

    names: list[str] = [node_name]
    if dist.is_initialized():
        names = [""] * dist.get_world_size()
        dist.all_gather_object(names, node_name)
    problem = placement_problem(plan, names)
    if problem:
        raise PlacementError(problem)


def node_name(ray_node_id: str | None = None) -> str:
    """The Kubernetes node this worker runs on (`K8S_NODE_NAME`; several pods on one node share it),
    else Ray's node id (one per pod or machine), else the host name."""
    from config.k8s import NODE_NAME_ENV

    return os.environ.get(NODE_NAME_ENV) or ray_node_id or socket.gethostname()


# ---- cross-node traffic ---------------------------------------------------------------------


def ring_bytes(kind: str, *, size_bytes: int, group_size: int) -> int:
    """Bytes one rank sends in a ring implementation of a collective over `group_size` ranks.

    `size_bytes` is the full (gathered / unreduced) tensor: all-gather and reduce-scatter send
    (g-1)/g of it, all-reduce twice that (a reduce-scatter then an all-gather), broadcast all of it
    from the root (counted for every rank, an upper bound).
    """
    g = group_size
    if g <= 1:
        return 0
    if kind in ("all_gather", "reduce_scatter"):
        return size_bytes * (g - 1) // g
    if kind == "all_reduce":
        return 2 * size_bytes * (g - 1) // g
    if kind == "broadcast":
        return size_bytes
    raise ValueError(f"unknown collective kind '{kind}'")


def cross_node_bytes_per_step(plan: MeshPlan, *, params: int, grad_accumulation: int, param_bytes: int,
                              reduce_bytes: int, root_params: int = 0, grad_params: int | None = None) -> int:
    """Per-rank bytes of one optimizer step's FSDP2 collectives whose process group spans nodes (ring model).

    `params` is the (padded) parameter count; `root_params` those of the root unit, which stays
    gathered from forward to backward (`reshard_after_forward=False`), so backward re-gathers only
    `params - root_params`. Per micro-batch, full sharding all-gathers in forward and in backward
    and reduce-scatters, all across nodes when the job spans more than one; hybrid keeps those in
    the node and all-reduces each rank's 1/shard of the gradients across nodes once per step (on
    the last micro-batch). The step's scalar all-reduces (label count, loss, grad norm) are left out.
    `grad_params` (default `params`) are those with gradients: under LoRA the adapters alone, so only they are
    reduced, while every parameter is still gathered.
    """
    grads = params if grad_params is None else grad_params
    if plan.nodes <= 1:
        return 0
    if plan.sharding == "full":
        g = plan.world_size
        gathered = params + (params - root_params)
        per_micro = (ring_bytes("all_gather", size_bytes=gathered * param_bytes, group_size=g)
                     + ring_bytes("reduce_scatter", size_bytes=grads * reduce_bytes, group_size=g))
        return grad_accumulation * per_micro
    shard_elems = grads // plan.shard
    return ring_bytes("all_reduce", size_bytes=shard_elems * reduce_bytes, group_size=plan.replicate)


def padded_numel(shapes, shard: int) -> int:
    """Elements FSDP2 communicates for parameters of these shapes sharded `shard` ways (dim 0 padded)."""
    total = 0
    for shape in shapes:
        shape = tuple(shape)
        rows = -(-shape[0] // shard) * shard if shape else shard
        rest = 1
        for dim in shape[1:]:
            rest *= dim
        total += rows * rest
    return total
