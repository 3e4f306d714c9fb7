"""What a pod gets on a node: kubelet allocatable, pod CPU and memory, /dev/shm, object store, huge pages, EFA."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from config.catalog import InstanceType
from config.cluster_fields import WorkerGroup

# kubelet reserves on EKS AMIs (the bootstrap formula): CPU in millicores by core band,
# memory 255 MiB + 11 MiB per schedulable pod, plus the 100 MiB hard eviction threshold.
_EVICTION_MIB = 100
# DaemonSets on every node (aws-node, kube-proxy, pod-identity agent, device plugins,
# CloudWatch agent): budgeted generously so a worker pod never sits Pending.
_DAEMONSET_CPU_M = 1000
_DAEMONSET_MEM_MIB = 2048
# The kernel and firmware keep part of the nominal memory: kubelet capacity is MemTotal.
_USABLE_MEMORY_FRACTION = 0.95
# System pods that share the head's node (CoreDNS, KubeRay operator, metrics).
_SYSTEM_PODS_CPU_M = 1000
_SYSTEM_PODS_MEM_MIB = 2048
# libfabric's EFA provider registers its bounce buffers in 2 MiB huge pages; the AWS EFA
# examples give each pod 5 GiB of them.
EFA_HUGEPAGES_MIB_PER_POD = 5120
# /dev/shm: NCCL's intra-node buffers and the data loader live there; memory-backed, it
# counts against the pod's memory limit, so a quarter of it, capped.
_SHM_FRACTION = 0.25
_SHM_CAP_GIB = 64
# Ray's object store lives in /dev/shm. Left to itself Ray sizes it at 30% of the pod's memory,
# capped at 95% of /dev/shm, which would leave NCCL's intra-node buffers and the data loader's
# shared tensors almost nothing; and where the object store does not fit, Ray puts it in /tmp on
# the root disk. Set explicitly: three quarters of /dev/shm, the rest left to NCCL.
_OBJECT_STORE_SHM_FRACTION = 0.75


@dataclass(frozen=True, kw_only=True)
class PodResources:
    """Resources one Ray pod requests (and limits to) on a node of a group."""

    cpu: int
    """Whole CPUs per pod."""
    memory_gib: int
    """Memory per pod, GiB (excludes huge pages)."""
    shm_gib: int
    """Size of the memory-backed /dev/shm, GiB (part of the memory above)."""
    object_store_mib: int
    """Ray object store, MiB (`ray start --object-store-memory`; inside /dev/shm, with room left for NCCL)."""
    hugepages_2mi_mib: int
    """2 MiB huge pages per pod, MiB (0 without EFA)."""
    efa_devices: int
    """`vpc.amazonaws.com/efa` devices per pod (0 for socket transport)."""
    gpus: int
    """`nvidia.com/gpu` per pod."""

    @property
    def object_store_bytes(self) -> int:
        """The object store in bytes, as `ray start --object-store-memory` takes it."""
        return self.object_store_mib * 1024**2


class ResourcesMixin:
    """`ClusterConfig`'s pod resources (needs the topology: `instance`, `pods_per_node`)."""

    @cached_property
    def pod_resources(self) -> dict[str, PodResources]:
        """Per-pod resources for each worker group, by group name."""
        return {g.name: self._pod_resources(g) for g in self.cluster.worker_groups}

    def _pod_resources(self, group: WorkerGroup) -> PodResources:
        itype = self.instance(group)
        pods = self.pods_per_node(group)
        efa = self.nccl.transport == "efa"
        hugepages = EFA_HUGEPAGES_MIB_PER_POD if efa else 0
        cpu_m, mem_mib = _allocatable(itype)
        cpu = (cpu_m - _DAEMONSET_CPU_M) // pods // 1000
        mem_gib = (mem_mib - _DAEMONSET_MEM_MIB - hugepages * pods) // pods // 1024
        shm_gib = _shm_gib(mem_gib)
        return PodResources(
            cpu=cpu,
            memory_gib=mem_gib,
            shm_gib=shm_gib,
            object_store_mib=_object_store_mib(shm_gib),
            hugepages_2mi_mib=hugepages,
            efa_devices=itype.efa_interfaces // pods if efa else 0,
            gpus=group.gpus_per_pod,
        )

    @cached_property
    def head_resources(self) -> PodResources:
        """The Ray head pod: `ray.head`'s CPU and memory, a /dev/shm and object store sized like a worker's."""
        head = self.ray.head
        shm_gib = _shm_gib(head.memory_gib)
        return PodResources(cpu=head.cpu, memory_gib=head.memory_gib, shm_gib=shm_gib,
                            object_store_mib=_object_store_mib(shm_gib), hugepages_2mi_mib=0, efa_devices=0, gpus=0)

    def nvidia_nodes_hugepages(self, group: WorkerGroup) -> int:
        """2 MiB huge pages each node of the group must reserve (vm.nr_hugepages)."""
        return self.pod_resources[group.name].hugepages_2mi_mib * self.pods_per_node(group) // 2


def _allocatable(itype: InstanceType) -> tuple[int, int]:
    """Node allocatable (millicores, MiB) after kubelet reserves, as the EKS bootstrap computes it."""
    cores = itype.vcpus
    reserved_m = 60 + (10 if cores > 1 else 0) + 5 * min(max(cores - 2, 0), 2) + 2.5 * max(cores - 4, 0)
    max_pods = 110 if cores < 30 else 250
    capacity_mib = int(itype.memory_gib * 1024 * _USABLE_MEMORY_FRACTION)
    mem_mib = capacity_mib - (255 + 11 * max_pods) - _EVICTION_MIB
    return int(cores * 1000 - reserved_m), mem_mib


def _shm_gib(memory_gib: int) -> int:
    """A pod's memory-backed /dev/shm, GiB: a quarter of its memory, capped, at least 1."""
    return max(1, min(_SHM_CAP_GIB, int(memory_gib * _SHM_FRACTION)))


def _object_store_mib(shm_gib: int) -> int:
    """Ray's object store inside a /dev/shm of `shm_gib` GiB, MiB."""
    return int(shm_gib * 1024 * _OBJECT_STORE_SHM_FRACTION)
