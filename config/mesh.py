"""The device mesh the variable file implies: which ranks shard together (full or hybrid sharding).

A fact of the file's topology (worker groups, GPUs per node, `job.sharding`), so it lives here and
`python -m config check` prints it without the workload; `workloads.fsdp_finetune.topology` builds
the `DeviceMesh` from it and checks the placement Ray chose (see that module for the trade-off).

Ranks are laid out node by node (Ray Train numbers the workers of one node, one pod, contiguously),
so node i holds ranks i*S .. i*S+S-1 (S = ranks per node), which is row i of the
("replicate", "shard") mesh.
"""

from __future__ import annotations

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


def resolve_sharding(requested: str, *, nodes: int, ranks_per_node: int | None, pods_per_node: int = 1) -> Sharding:
    """`auto`: hybrid when the job spans several nodes holding more than one rank each, in one pod each, else full.

    `ranks_per_node` is None for heterogeneous worker groups (auto gives full there). With several pods on a
    node Ray numbers the workers pod by pod, in no particular order of nodes, so a node's ranks need not be
    consecutive and a hybrid shard group could span nodes (`workloads...topology.placement_problem`): full.
    """
    if requested in ("full", "hybrid"):
        return requested  # type: ignore[return-value]
    if requested != "auto":
        raise ValueError(f"sharding '{requested}': use auto, full or hybrid")
    return ("hybrid" if ranks_per_node is not None and nodes > 1 and ranks_per_node > 1 and pods_per_node == 1
            else "full")


def plan_from(sharding: str, *, world_size: int, ranks_per_node: int, pods_per_node: int = 1) -> MeshPlan:
    """The mesh plan for `world_size` ranks, `ranks_per_node` to a node, under `sharding` (auto/full/hybrid)."""
    if world_size < 1 or ranks_per_node < 1 or (sharding != "full" and world_size % ranks_per_node):
        raise ValueError(f"world size {world_size} is not a whole number of nodes of {ranks_per_node} ranks")
    nodes = max(1, world_size // ranks_per_node)
    resolved = resolve_sharding(sharding, nodes=nodes, ranks_per_node=ranks_per_node, pods_per_node=pods_per_node)
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
    pods = max(cfg.pods_per_node(g) for g in cfg.cluster.worker_groups)
    return plan_from(cfg.job.sharding, world_size=cfg.world_size, ranks_per_node=per_node, pods_per_node=pods)
