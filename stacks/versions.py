"""Pinned Helm charts and the kubectl layer: the one place to bump a version, then rerun `make test`."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from constructs import Construct

from config.k8s import KUBERAY_NAMESPACE
from config.model import kubectl_layer_module


@dataclass(frozen=True, kw_only=True)
class ChartPin:
    """A Helm chart pinned to one version, with the release name and namespace it is installed as."""

    chart: str
    repository: str
    version: str
    release: str
    namespace: str


NVIDIA_DEVICE_PLUGIN = ChartPin(
    chart="nvidia-device-plugin",
    repository="https://nvidia.github.io/k8s-device-plugin",
    version="0.20.0",
    release="nvidia-device-plugin",
    namespace="kube-system",
)

# Releases before v0.5.32 do not list g6.12xlarge among the chart's supported instance types, so
# their DaemonSet's node affinity matched no node of the reference setup and EFA stayed invisible.
EFA_DEVICE_PLUGIN = ChartPin(
    chart="aws-efa-k8s-device-plugin",
    repository="https://aws.github.io/eks-charts",
    version="v0.5.32",
    release="aws-efa-k8s-device-plugin",
    namespace="kube-system",
)

KUBERAY_CHART = "kuberay-operator"
KUBERAY_REPOSITORY = "https://ray-project.github.io/kuberay-helm/"


def kuberay_operator(version: str) -> ChartPin:
    """The KubeRay operator chart at `version` (the variable file's `ray.kuberay_version`)."""
    return ChartPin(chart=KUBERAY_CHART, repository=KUBERAY_REPOSITORY, version=version,
                    release="kuberay-operator", namespace=KUBERAY_NAMESPACE)


def kubectl_layer(scope: Construct, id: str, *, kubernetes_version: str):
    """The `aws-cdk.lambda-layer-kubectl-vNN` layer for exactly the cluster's Kubernetes minor version.

    The variable file's validation (`ClusterConfig.cross_field_problems`) has already refused a
    version whose layer is not installed, so `python -m config check` fails the same way.
    """
    module = importlib.import_module(kubectl_layer_module(kubernetes_version))
    return getattr(module, f"KubectlV{kubernetes_version.split('.')[1]}Layer")(scope, id)
