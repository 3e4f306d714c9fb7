"""Cluster add-ons installed as Helm charts, one small construct each (versions in `stacks.versions`)."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from config import ClusterConfig
from config.k8s import EFA_PRESENT_LABEL, GPU_PRESENT_LABEL, GPU_TAINT, system_node_labels
from stacks.versions import EFA_DEVICE_PLUGIN, NVIDIA_DEVICE_PLUGIN, ChartPin, kuberay_operator

_HELM_TIMEOUT = cdk.Duration.minutes(15)


def pinned_chart(scope: Construct, cluster: eks.ICluster, pin: ChartPin, values: dict) -> eks.HelmChart:
    return eks.HelmChart(
        scope, "Chart", cluster=cluster, chart=pin.chart, repository=pin.repository, version=pin.version,
        release=pin.release, namespace=pin.namespace, create_namespace=True, values=values,
        # CRDs ship in the charts' crds/ directories; skipping them would leave RayCluster and
        # RayJob unknown to the API server.
        skip_crds=False, wait=True, timeout=_HELM_TIMEOUT,
    )


class NvidiaDevicePlugin(Construct):
    """NVIDIA's device plugin DaemonSet: advertises `nvidia.com/gpu` on the GPU nodes."""

    def __init__(self, scope: Construct, id: str, *, cluster: eks.ICluster, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        self.values = {
            "nodeSelector": {GPU_PRESENT_LABEL: "true"},
            "tolerations": [GPU_TAINT.toleration(), {"key": "CriticalAddonsOnly", "operator": "Exists"}],
        }
        self.chart = pinned_chart(self, cluster, NVIDIA_DEVICE_PLUGIN, self.values)


class EfaDevicePlugin(Construct):
    """The EFA device plugin DaemonSet: advertises `vpc.amazonaws.com/efa` on EFA nodes."""

    def __init__(self, scope: Construct, id: str, *, cluster: eks.ICluster, config: ClusterConfig, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        efa_types = sorted({g.instance_type for g in config.cluster.worker_groups if config.instance(g).has_efa})
        self.values = {
            "nodeSelector": {EFA_PRESENT_LABEL: "true"},
            "tolerations": [GPU_TAINT.toleration()],
            # The chart's node affinity only admits instance types on its own list; name ours so a
            # type the chart's list lags behind on still gets the plugin.
            "supportedInstanceLabels": {"keys": ["node.kubernetes.io/instance-type"], "values": efa_types},
        }
        self.chart = pinned_chart(self, cluster, EFA_DEVICE_PLUGIN, self.values)


class KubeRayOperator(Construct):
    """The KubeRay operator and its CRDs (from the chart), on the system nodes."""

    def __init__(self, scope: Construct, id: str, *, cluster: eks.ICluster, config: ClusterConfig, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        self.pin = kuberay_operator(config.ray.kuberay_version)
        self.values = {"nodeSelector": system_node_labels()}
        self.chart = pinned_chart(self, cluster, self.pin, self.values)
