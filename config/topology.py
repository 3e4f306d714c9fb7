"""The cluster's shape: catalog entries, node group sizes, pods, world size and ranks per node, AZs."""

from __future__ import annotations

from functools import cached_property

from config.catalog import InstanceType, load_catalog
from config.cluster_fields import WorkerGroup


class TopologyMixin:
    """`ClusterConfig`'s derived topology (computed once, on first use, from the model and the catalog)."""

    def instance(self, group: WorkerGroup) -> InstanceType:
        """Catalog entry for a worker group (valid after loading); with `logical_gpus`, its logical GPUs."""
        itype = load_catalog().instances[group.instance_type]
        return itype if group.logical_gpus is None else with_logical_gpus(itype, group.logical_gpus)

    @cached_property
    def uses_logical_gpus(self) -> bool:
        """Whether the GPUs are logical (`logical_gpus`, a lab): the workload trains on CPU with gloo."""
        return any(g.logical_gpus is not None for g in self.cluster.worker_groups)

    @cached_property
    def system_instance(self) -> InstanceType:
        """Catalog entry of the system node group."""
        return load_catalog().instances[self.cluster.system_nodes.instance_type]

    def group_min(self, group: WorkerGroup) -> int:
        """Node group minimum, nodes: `min_nodes`, else 0 under the autoscaler, else `nodes`."""
        if group.min_nodes is not None:
            return group.min_nodes
        return 0 if self.autoscaling.enabled else group.nodes

    def group_max(self, group: WorkerGroup) -> int:
        """Node group maximum, nodes: `max_nodes`, else `nodes`."""
        return group.nodes if group.max_nodes is None else group.max_nodes

    def group_desired(self, group: WorkerGroup) -> int:
        """Node group desired size at deploy time, nodes.

        The minimum under the autoscaler (it raises the size when Ray worker pods are Pending) and for a
        capacity block (no instance can launch before the block starts); else `nodes`.
        """
        if self.autoscaling.enabled or group.capacity == "capacity_block":
            return self.group_min(group)
        return group.nodes

    def pods_per_node(self, group: WorkerGroup) -> int:
        """Ray worker pods on each node of the group."""
        return self.instance(group).gpus // group.gpus_per_pod

    def pods(self, group: WorkerGroup) -> int:
        """Ray worker pods (replicas) in the group."""
        return group.nodes * self.pods_per_node(group)

    @cached_property
    def availability_zones(self) -> list[str]:
        """VPC AZs: the GPU AZ first, then the region's other AZs in catalog order, `network.max_azs` in all."""
        others = [az for az in load_catalog().availability_zones(self.region) if az != self.gpu_availability_zone]
        return [self.gpu_availability_zone] + others[: self.network.max_azs - 1]

    @cached_property
    def world_size(self) -> int:
        """Ray Train workers, one per GPU, across all worker groups."""
        return sum(self.pods(g) * g.gpus_per_pod for g in self.cluster.worker_groups)

    @cached_property
    def ranks_per_node(self) -> int | None:
        """Ray Train workers (GPUs) on each worker node; None when the worker groups differ."""
        counts = {self.pods_per_node(g) * g.gpus_per_pod for g in self.cluster.worker_groups}
        return counts.pop() if len(counts) == 1 else None

    @cached_property
    def cpus_per_worker(self) -> int:
        """CPUs each Ray Train worker asks for (the smallest group's share, one CPU left for Ray)."""
        return max(1, min((self.pod_resources[g.name].cpu - 1) // g.gpus_per_pod for g in self.cluster.worker_groups))

    @cached_property
    def grad_accumulation(self) -> int:
        """Micro-batches per optimizer step on each worker."""
        return self.job.grad_accumulation(self.world_size)

    @cached_property
    def gpu_peak_tflops(self) -> float:
        """Dense bf16 peak per GPU of the first worker group, TFLOP/s (for MFU)."""
        return self.instance(self.cluster.worker_groups[0]).gpu_bf16_tflops


LOGICAL_GPU_RESOURCE = "logical_gpu"
"""The Ray custom resource each worker pod of a `logical_gpus` group holds, one per logical GPU.

Ray Train places a worker by its resources; a CPU worker cannot ask for Ray's `GPU` (ray 2.58.0 air/config.py
`ScalingConfig.__post_init__`: "`use_gpu` is False but `GPU` was found in `resources_per_worker`"), and asked for
CPU alone it could land on the head. One of these per worker keeps the workers on the worker pods, as `GPU` does
on real GPUs."""


def with_logical_gpus(itype: InstanceType, gpus: int) -> InstanceType:
    """A CPU instance type seen as holding `gpus` logical GPUs (`WorkerGroup.logical_gpus`, a lab).

    Each logical GPU's "memory" is its share of the node's RAM, where a CPU worker keeps its tensors; it has no
    bf16 peak (0: no MFU is reported, as on any CPU run) and no GPU model."""
    return itype.model_copy(update={"gpus": gpus, "gpu_model": None,
                                    "gpu_memory_gib": itype.memory_gib // gpus,
                                    "gpu_visible_memory_mib": itype.memory_gib * 1024 // gpus,
                                    "gpu_bf16_tflops": 0.0})
