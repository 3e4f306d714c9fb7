"""Pinned Helm charts and the kubectl layer: the one place to bump a version, then rerun `make test`."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from constructs import Construct

from config.k8s import KUBERAY_NAMESPACE
from config.observability import MONITORING_NAMESPACE, STACK_RELEASE
from config.versions import (
    CLUSTER_AUTOSCALER_CHARTS,
    KUBERAY_CHART,
    KUBERAY_REPOSITORY,
    MANAGED_ADDON_VERSIONS,
    kubectl_layer_module,
)
from tools.pins import chart_version


@dataclass(frozen=True, kw_only=True)
class ChartPin:
    """A Helm chart pinned to one version, with the release name and namespace it is installed as."""

    chart: str
    repository: str
    version: str
    release: str
    namespace: str


# Chart versions come from the one table of pinned artifacts (tools/pins.py), which the tests render; the
# variable file's defaults and config/versions.py are checked against it (tests/test_pins.py).
# Each version below was looked up in its repository's published Helm index (index.yaml on the gh-pages
# branch), and the comment beside it says where it was seen: a version the index does not list fails
# `helm install` and, on a first create, rolls the whole cluster stack back.

# Seen in NVIDIA/k8s-device-plugin gh-pages index.yaml (generated 2026-08-20): nvidia-device-plugin 0.20.0,
# the newest listed.
NVIDIA_DEVICE_PLUGIN = ChartPin(
    chart="nvidia-device-plugin",
    repository="https://nvidia.github.io/k8s-device-plugin",
    version=chart_version("nvidia-device-plugin"),
    release="nvidia-device-plugin",
    namespace="kube-system",
)

# Seen in aws/eks-charts gh-pages index.yaml (generated 2026-08-03): aws-efa-k8s-device-plugin v0.5.30, the
# newest listed (v0.5.32, pinned before, is not published). The chart's supportedInstanceLabels list has named
# g6.12xlarge since v0.5.5; the construct passes the file's EFA types anyway, so a type newer than the chart's
# list still gets the plugin.
EFA_DEVICE_PLUGIN = ChartPin(
    chart="aws-efa-k8s-device-plugin",
    repository="https://aws.github.io/eks-charts",
    version=chart_version("aws-efa-k8s-device-plugin"),
    release="aws-efa-k8s-device-plugin",
    namespace="kube-system",
)

# The version is the variable file's `ray.kuberay_version` (default 1.7.0). The stored copy of
# ray-project/kuberay-helm's gh-pages index.yaml is from 2025-07-16 and lists kuberay-operator up to 1.4.2, so
# 1.7.0 could not be confirmed there; the CRDs the charts are validated against are KubeRay's v1.7.0 release.
# KUBERAY_CHART and KUBERAY_REPOSITORY are in config/versions.py: `python -m config check --online` reads the
# repository's index.yaml for the version.


# The Cluster Autoscaler chart and image per Kubernetes minor (CLUSTER_AUTOSCALER_CHARTS) are pinned in
# config/versions.py, with where each version was seen: the variable file's validation refuses a minor
# without a pin, and `config` reads nothing from the stacks.
CLUSTER_AUTOSCALER_SERVICE_ACCOUNT = "cluster-autoscaler"


# EKS managed add-on versions per Kubernetes minor (MANAGED_ADDON_VERSIONS): in config/versions.py, where each is
# sourced, so that `python -m config check --online` can ask EKS whether the region offers them.

# The chart whose configuration schema matches the pinned eks-node-monitoring-agent add-on (tests render it).
NODE_MONITORING_AGENT_CHART = chart_version("eks-node-monitoring-agent")


def managed_addon_version(kubernetes_version: str, addon: str) -> str:
    """The pinned EKS add-on version of `addon` for the cluster's Kubernetes minor."""
    pins = MANAGED_ADDON_VERSIONS.get(kubernetes_version)
    if pins is None or addon not in pins:
        raise KeyError(f"no {addon} add-on version pinned for Kubernetes {kubernetes_version}; add one to "
                       "MANAGED_ADDON_VERSIONS in config/versions.py (aws eks describe-addon-versions "
                       f"--kubernetes-version {kubernetes_version} --addon-name {addon})")
    return pins[addon]


def cluster_autoscaler(kubernetes_version: str) -> tuple[ChartPin, str]:
    """The Cluster Autoscaler chart and image tag matched to the cluster's Kubernetes minor version."""
    if kubernetes_version not in CLUSTER_AUTOSCALER_CHARTS:
        raise KeyError(f"no Cluster Autoscaler chart pinned for Kubernetes {kubernetes_version}; add one to "
                       "CLUSTER_AUTOSCALER_CHARTS in config/versions.py")
    chart_version, image_tag = CLUSTER_AUTOSCALER_CHARTS[kubernetes_version]
    pin = ChartPin(chart="cluster-autoscaler", repository="https://kubernetes.github.io/autoscaler",
                   version=chart_version, release="cluster-autoscaler", namespace="kube-system")
    return pin, image_tag


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

# The metrics stack (`observability` in the variable file). Exact copies of both charts are in
# ../shared/charts (README there: source commits), which the tests render with helm.
# Seen in prometheus-community/helm-charts at tag kube-prometheus-stack-88.5.3 (commit ea930baeeb, 2026-08-21,
# the newest release tag of the chart in the stored snapshot): Prometheus operator v0.93.1, with grafana 12.11.1,
# kube-state-metrics 8.4.0 and prometheus-node-exporter 4.56.1 as dependencies.
KUBE_PROMETHEUS_STACK = ChartPin(
    chart="kube-prometheus-stack",
    repository="https://prometheus-community.github.io/helm-charts",
    version=chart_version("kube-prometheus-stack"),
    release=STACK_RELEASE,
    namespace=MONITORING_NAMESPACE,
)

# The image of the node exporter's EFA sidecar (stacks/efa_counters.sh): node exporter's own, at the version of the
# prometheus-node-exporter 4.56.1 subchart (Chart.yaml appVersion 1.12.1), but its busybox variant: the stack runs
# the distroless one (kube-prometheus-stack values.yaml `prometheus-node-exporter.image.distroless: true`), which
# has no shell (prometheus/node_exporter v1.12.1 Dockerfile.distroless: FROM gcr.io/distroless/static-debian13),
# while Dockerfile is FROM quay.io/prometheus/busybox (/bin/sh). Same registry and repository as the chart's.
NODE_EXPORTER_VERSION = "1.12.1"
NODE_EXPORTER_SHELL_IMAGE = f"quay.io/prometheus/node-exporter:v{NODE_EXPORTER_VERSION}"

# Seen in NVIDIA/dcgm-exporter at tag 4.5.3-4.8.2 (commit 691c92762e, 2026-05-06; chart in `deployment/`):
# chart 4.8.2, image nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless.
DCGM_EXPORTER = ChartPin(
    chart="dcgm-exporter",
    repository="https://nvidia.github.io/dcgm-exporter/helm-charts",
    version=chart_version("dcgm-exporter"),
    release="dcgm-exporter",
    namespace=MONITORING_NAMESPACE,
)
