"""The NetworkPolicy of a Ray cluster: who may connect to its pods.

A Ray cluster's pods accept connections only from
- pods of the same Ray cluster, on every port (GCS, raylets, object manager, NCCL's TCP bootstrap
  and socket transport, the dashboard agent): they carry the pod-template label `ray.OWNER_LABEL`;
- the KubeRay operator, on the dashboard port (it reads job status and submits through the Jobs API);
- for a RayJob, its K8sJobMode submitter pod, on the dashboard port (KubeRay labels it with the
  RayJob's name). In SidecarMode the submitter is a container of the head pod and needs no rule;
- with `observability.enabled`, the metrics stack's Prometheus pods, on the Ray metrics port only.
Egress is not restricted: the pods pull from S3, the Hugging Face Hub and PyPI.

`kubectl exec` and `kubectl port-forward` reach a container through the kubelet, not over the pod
network, so the policy does not stand in their way. EFA's SRD traffic bypasses the kernel's IP
stack and is not seen by the policy at all (the node group's EFA security group is its boundary).
"""

from __future__ import annotations

from charts.ray import DASHBOARD_PORT, OWNER_LABEL
from config.k8s import (
    KUBERAY_NAMESPACE,
    KUBERAY_OPERATOR_POD_LABELS,
    NAMESPACE_NAME_LABEL,
    RAY_NODE_TYPE_LABEL,
    RAY_ORIGINATED_FROM_CRD_LABEL,
    RAY_ORIGINATED_FROM_NAME_LABEL,
)
from config.observability import (
    MONITORING_NAMESPACE,
    PROMETHEUS_POD_LABELS,
    RAY_METRICS_PORT,
)

API_VERSION = "networking.k8s.io/v1"


def policy_name(owner: str) -> str:
    """Name of the NetworkPolicy guarding the Ray cluster of RayCluster or RayJob `owner`."""
    return f"{owner}-ray"


def ray_pods(owner: str) -> dict:
    """The selector of the Ray head and worker pods of `owner`'s Ray cluster."""
    return {"matchLabels": {OWNER_LABEL: owner},
            "matchExpressions": [{"key": RAY_NODE_TYPE_LABEL, "operator": "In", "values": ["head", "worker"]}]}


def _dashboard() -> list[dict]:
    return [{"protocol": "TCP", "port": DASHBOARD_PORT}]


def scraper_peer() -> dict:
    """The NetworkPolicy peer of the metrics stack's Prometheus: its pods, in its namespace."""
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: MONITORING_NAMESPACE}},
            "podSelector": {"matchLabels": dict(PROMETHEUS_POD_LABELS)}}


def network_policy_spec(owner: str, *, rayjob: str | None = None, scraper: bool = False) -> dict:
    """`NetworkPolicy.spec` for the Ray cluster of `owner`; `rayjob` also admits that RayJob's submitter,
    `scraper` the metrics stack's Prometheus on the metrics port."""
    ingress = [
        {"from": [{"podSelector": {"matchLabels": {OWNER_LABEL: owner}}}]},
        {"from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: KUBERAY_NAMESPACE}},
                   "podSelector": {"matchLabels": dict(KUBERAY_OPERATOR_POD_LABELS)}}],
         "ports": _dashboard()},
    ]
    if rayjob is not None:
        ingress.append({"from": [{"podSelector": {"matchLabels": {RAY_ORIGINATED_FROM_NAME_LABEL: rayjob,
                                                                  RAY_ORIGINATED_FROM_CRD_LABEL: "RayJob"}}}],
                        "ports": _dashboard()})
    if scraper:
        ingress.append({"from": [scraper_peer()], "ports": [{"protocol": "TCP", "port": RAY_METRICS_PORT}]})
    # Only Ingress in policyTypes: egress stays open.
    return {"podSelector": ray_pods(owner), "policyTypes": ["Ingress"], "ingress": ingress}


def deny_ingress_spec(labels: dict[str, str]) -> dict:
    """`NetworkPolicy.spec` that admits no connection to the pods with `labels` (egress open)."""
    return {"podSelector": {"matchLabels": dict(labels)}, "policyTypes": ["Ingress"], "ingress": []}
