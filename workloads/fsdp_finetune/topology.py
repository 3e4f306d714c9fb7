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
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from config.model import ClusterConfig

Sharding = Literal["full", "hybrid"]
MESH_DIMS_HYBRID = ("replicate", "shard")
MESH_DIMS_FULL = ("shard",)


@dataclass(frozen=True, kw_only=True)
class MeshPlan:
    """How the ranks are arranged: `replicate` nodes x `shard` ranks per shard group."""

    sharding: Sharding
    """The resolved sharding (never `auto`)."""
    world_size: int
    """All ranks."""
    replicate: int
    """Replicas of the model: 1 for full sharding, the node count for hybrid."""
    shard: int
    """Ranks one parameter is sharded over: the world size (full), the ranks per node (hybrid)."""
    ranks_per_node: int
    """Ranks (GPUs) each node holds."""

    @property
    def nodes(self) -> int:
        """Nodes the job spans."""
        return self.world_size // self.ranks_per_node

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """Shape of the device mesh: (world,) for full, (replicate, shard) for hybrid."""
        return (self.world_size,) if self.sharding == "full" else (self.replicate, self.shard)

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        return MESH_DIMS_FULL if self.sharding == "full" else MESH_DIMS_HYBRID

    def node_index(self, rank: int) -> int:
        """The node (0-based, in rank order) that `rank` runs on."""
        self._check_rank(rank)
        return rank // self.ranks_per_node

    def node_ranks(self, node: int) -> list[int]:
        """The ranks on node `node`."""
        return list(range(node * self.ranks_per_node, (node + 1) * self.ranks_per_node))

    def shard_group(self, rank: int) -> list[int]:
        """The ranks `rank` shards parameters with (all ranks under full sharding, its node's under hybrid)."""
        self._check_rank(rank)
        start = rank // self.shard * self.shard
        return list(range(start, start + self.shard))

    def replicate_group(self, rank: int) -> list[int]:
        """The ranks holding the same shard as `rank` (one per node under hybrid; just `rank` under full)."""
        self._check_rank(rank)
        return list(range(rank % self.shard, self.world_size, self.shard))

    def shard_group_spans_nodes(self) -> bool:
        """Whether a shard group's collectives cross the network."""
        return self.shard > self.ranks_per_node or (self.sharding == "full" and self.nodes > 1)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside 0..{self.world_size - 1}")


def resolve_sharding(requested: str, *, nodes: int, ranks_per_node: int | None) -> Sharding:
    """`auto`: hybrid when the job spans several nodes holding more than one rank each, else full.

    `ranks_per_node` is None for heterogeneous worker groups (auto gives full there).
    """
    if requested in ("full", "hybrid"):
        return requested  # type: ignore[return-value]
    if requested != "auto":
        raise ValueError(f"sharding '{requested}': use auto, full or hybrid")
    return "hybrid" if ranks_per_node is not None and nodes > 1 and ranks_per_node > 1 else "full"


def plan_from(sharding: str, *, world_size: int, ranks_per_node: int) -> MeshPlan:
    """The mesh plan for `world_size` ranks, `ranks_per_node` to a node, under `sharding` (auto/full/hybrid)."""
    if world_size < 1 or ranks_per_node < 1 or (sharding != "full" and world_size % ranks_per_node):
        raise ValueError(f"world size {world_size} is not a whole number of nodes of {ranks_per_node} ranks")
    nodes = max(1, world_size // ranks_per_node)
    resolved = resolve_sharding(sharding, nodes=nodes, ranks_per_node=ranks_per_node)
    if resolved == "full":
        return MeshPlan(sharding="full", world_size=world_size, replicate=1, shard=world_size,
                        ranks_per_node=ranks_per_node)
    return MeshPlan(sharding="hybrid", world_size=world_size, replicate=nodes, shard=ranks_per_node,
                    ranks_per_node=ranks_per_node)


def mesh_plan(cfg: ClusterConfig) -> MeshPlan:
    """The mesh plan the variable file implies (its worker groups and `job.sharding`).

    Heterogeneous worker groups (unequal GPUs per node) always shard fully; the loader refuses
    `hybrid` for them (`ClusterConfig.cross_field_problems`). `ranks_per_node` is then the
    smallest node's, used only for reporting.
    """
    per_node = cfg.ranks_per_node
    if per_node is None:
        if cfg.job.sharding == "hybrid":
            raise ValueError("job.sharding: hybrid needs the same number of GPUs on every worker node")
        smallest = min(cfg.pods_per_node(g) * g.gpus_per_pod for g in cfg.cluster.worker_groups)
        return MeshPlan(sharding="full", world_size=cfg.world_size, replicate=1, shard=cfg.world_size,
                        ranks_per_node=smallest)
    return plan_from(cfg.job.sharding, world_size=cfg.world_size, ranks_per_node=per_node)


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
                              reduce_bytes: int, root_params: int = 0) -> int:
    """Per-rank bytes of one optimizer step's FSDP2 collectives whose process group spans nodes (ring model).

    `params` is the (padded) parameter count; `root_params` those of the root unit, which stays
    gathered from forward to backward (`reshard_after_forward=False`), so backward re-gathers only
    `params - root_params`. Per micro-batch, full sharding all-gathers in forward and in backward
    and reduce-scatters, all across nodes when the job spans more than one; hybrid keeps those in
    the node and all-reduces each rank's 1/shard of the gradients across nodes once per step (on
    the last micro-batch). The step's scalar all-reduces (label count, loss, grad norm) are left out.
    """
    if plan.nodes <= 1:
        return 0
    if plan.sharding == "full":
        g = plan.world_size
        gathered = params + (params - root_params)
        per_micro = (ring_bytes("all_gather", size_bytes=gathered * param_bytes, group_size=g)
                     + ring_bytes("reduce_scatter", size_bytes=params * reduce_bytes, group_size=g))
        return grad_accumulation * per_micro
    shard_elems = params // plan.shard
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
