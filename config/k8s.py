"""Kubernetes names shared by the CDK stacks and the cdk8s charts.

Node labels and taints are put on node groups by the stacks and selected or tolerated by the
charts; keeping them here is what stops the two from drifting apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from config.model import ClusterConfig, WorkerGroup

ROLE_LABEL = "ray-efa.io/role"
"""Node label: `system` on the system node group, `gpu` on worker node groups."""
WORKER_GROUP_LABEL = "ray-efa.io/worker-group"
"""Node label on GPU nodes: the worker group's name (Ray worker pods select it)."""
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
"""The NVIDIA device plugin chart schedules only on nodes labelled with this = "true"."""
EFA_PRESENT_LABEL = "vpc.amazonaws.com/efa.present"
"""The EFA device plugin chart schedules only on nodes labelled with this = "true"."""


# Kubernetes' taint effects and how CloudFormation's AWS::EKS::Nodegroup spells them.
_CFN_TAINT_EFFECTS = {"NoSchedule": "NO_SCHEDULE", "PreferNoSchedule": "PREFER_NO_SCHEDULE", "NoExecute": "NO_EXECUTE"}


def cfn_taint_effect(effect: str) -> str:
    """A Kubernetes taint effect (`NoSchedule`) as an EKS node group's `Taints` writes it (`NO_SCHEDULE`)."""
    return _CFN_TAINT_EFFECTS[effect]

GPU_RESOURCE = "nvidia.com/gpu"
"""Extended resource of the NVIDIA device plugin: GPUs a pod requests."""
EFA_RESOURCE = "vpc.amazonaws.com/efa"
"""Extended resource of the EFA device plugin: EFA interfaces a pod requests."""
HUGEPAGES_RESOURCE = "hugepages-2Mi"
"""2 MiB huge pages a pod requests (libfabric's EFA bounce buffers)."""
NODE_NAME_ENV = "K8S_NODE_NAME"
"""Container env var holding the pod's node name (Downward API `spec.nodeName`); the preflight counts nodes by it."""

KUBERAY_NAMESPACE = "kuberay-system"
"""Namespace the stacks install the KubeRay operator into (the Ray pods' NetworkPolicy admits it from there)."""
KUBERAY_OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "kuberay-operator"}
"""Labels the kuberay-operator Helm chart puts on the operator's pods."""
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Label the API server puts on every namespace: its name (what a NetworkPolicy's namespaceSelector can match)."""
# Labels the KubeRay operator (1.7.0) puts on the pods it creates: `ray.io/cluster` (the RayCluster's
# name), `ray.io/node-type` (head or worker) on head and worker pods; on a RayJob's K8sJobMode
# submitter pod, `ray.io/originated-from-cr-name` (the RayJob's name) and `ray.io/originated-from-crd`.
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
RAY_ORIGINATED_FROM_NAME_LABEL = "ray.io/originated-from-cr-name"
RAY_ORIGINATED_FROM_CRD_LABEL = "ray.io/originated-from-crd"


@dataclass(frozen=True, kw_only=True)
class Taint:
    """A node taint (and, read the other way, the toleration that matches it)."""

    key: str
    value: str
    effect: str

    @property
    def cfn_effect(self) -> str:
        """The effect as CloudFormation's node group taint names it; also the member name of the
        `TaintEffect` enums of aws_eks_v2 and cdk8s-plus (`eks.TaintEffect[taint.cfn_effect]`)."""
        return cfn_taint_effect(self.effect)

    def toleration(self) -> dict[str, str]:
        """The pod-spec toleration that matches exactly this taint."""
        return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect}


GPU_TAINT = Taint(key="nvidia.com/gpu", value="true", effect="NoSchedule")
"""Keeps everything but GPU work (and the device plugins, which tolerate it) off GPU nodes."""


def system_node_labels() -> dict[str, str]:
    """Labels of the system node group (the Ray head's node selector uses them)."""
    return {ROLE_LABEL: "system"}


def worker_node_labels(config: ClusterConfig, group: WorkerGroup) -> dict[str, str]:
    """Labels of a worker group's nodes; the EFA label only where EFA transport is in use."""
    labels = {ROLE_LABEL: "gpu", WORKER_GROUP_LABEL: group.name, GPU_PRESENT_LABEL: "true"}
    if config.nccl.transport == "efa":
        labels[EFA_PRESENT_LABEL] = "true"
    return labels


def worker_pod_node_selector(group: WorkerGroup) -> dict[str, str]:
    """What a Ray worker pod of `group` selects: exactly its group's nodes."""
    return {WORKER_GROUP_LABEL: group.name}
