"""Pinned Helm charts and the kubectl layer: the one place to bump a version, then rerun `make test`."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from constructs import Construct

from config import ConfigError, Problem


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
KUBERAY_NAMESPACE = "kuberay-system"


def kuberay_operator(version: str) -> ChartPin:
    """The KubeRay operator chart at `version` (the variable file's `ray.kuberay_version`)."""
    return ChartPin(chart=KUBERAY_CHART, repository=KUBERAY_REPOSITORY, version=version,
                    release="kuberay-operator", namespace=KUBERAY_NAMESPACE)


def kubectl_layer(scope: Construct, id: str, *, kubernetes_version: str):
    """The `aws-cdk.lambda-layer-kubectl-vNN` layer for the cluster's version.

    The exact minor is preferred; kubectl's skew policy allows one minor either side, so the
    nearest installed layer within that range is used instead. Anything further is refused.
    """
    minor = int(kubernetes_version.split(".")[1])
    for candidate in (minor, minor - 1, minor + 1):
        try:
            module = importlib.import_module(f"aws_cdk.lambda_layer_kubectl_v{candidate}")
        except ModuleNotFoundError:
            continue
        return getattr(module, f"KubectlV{candidate}Layer")(scope, id)
    raise ConfigError("(variable file)", [Problem(
        path="cluster.kubernetes_version",
        message=f"no kubectl layer within one minor version of {kubernetes_version} is installed; "
                f"pip install aws-cdk.lambda-layer-kubectl-v{minor} (and pin it in requirements.txt)")])
