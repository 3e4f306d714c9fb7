"""Version rules: the Ray version of an image, the kubectl layer and Cluster Autoscaler chart per Kubernetes minor.

The Cluster Autoscaler pins live here, not in `stacks/versions.py`, because the variable file's validation
checks against them and `config` knows nothing of the stacks; `stacks/versions.py` imports them.
"""

from __future__ import annotations

import re

# Images whose Ray version is known. A rayproject/ray:X.Y.Z tag is parsed instead. The Ray Train DLC's tags and
# bundled versions per release: aws/deep-learning-containers docs/ray-train/changelog/index.md (77223f78):
# "Ray Train v1.1 - 2026-09-01, Tags: train-ml-cuda, train-ml-cuda-v1, train-ml-cuda-v1.1, train-ml-cuda-v1.1.0,
# Bundled versions: Ray 2.58.0 ..."; v1.0 (2026-08-26) the same with -v1.0 and -v1.0.0. The unversioned and
# major-only tags move to the next release, whatever Ray it carries, so they are not listed.
DLC_RAY = "public.ecr.aws/deep-learning-containers/ray"
KNOWN_IMAGES: dict[str, str] = {
    f"{DLC_RAY}:train-ml-cuda-v1.0": "2.58.0",
    f"{DLC_RAY}:train-ml-cuda-v1.0.0": "2.58.0",
    f"{DLC_RAY}:train-ml-cuda-v1.1": "2.58.0",
    f"{DLC_RAY}:train-ml-cuda-v1.1.0": "2.58.0",
}
# The DLC's patch-level tag (-vX.Y.Z) names one release; the shorter tags of the same changelog entry move with
# each later release, so nodes pulling IfNotPresent on different days would run different builds.
_DLC_RELEASE_TAG = re.compile(r".*-v\d+\.\d+\.\d+")


def image_tag_moves(image: str) -> bool:
    """Whether `image` (no digest) names a tag its publisher moves: a DLC tag short of -vX.Y.Z, or any tag of
    another publisher, whose policy this project does not know."""
    name, _, tag = image.rpartition(":")
    return not (name == DLC_RAY and _DLC_RELEASE_TAG.fullmatch(tag))

# KubeRay refuses authOptions.mode token for older Ray (its validation, 1.7.0).
RAY_TOKEN_AUTH_MIN = (2, 52, 0)

# Cluster Autoscaler releases track Kubernetes minors (CA 1.34.x for EKS 1.34). Seen in kubernetes/autoscaler
# gh-pages index.yaml (entries to 2026-03-02): chart 9.53.0 is the newest with appVersion 1.34.x (1.34.2);
# 9.54.0 and later ship 1.35. One chart per supported minor: a new minor needs its line here.
CLUSTER_AUTOSCALER_CHARTS = {"1.34": ("9.53.0", "v1.34.2")}
"""Kubernetes minor -> (cluster-autoscaler Helm chart version, image tag); the stacks install it from here."""


def pinned_autoscaler_minors() -> list[str]:
    """Kubernetes minors with a pinned Cluster Autoscaler chart."""
    return sorted(CLUSTER_AUTOSCALER_CHARTS)


def kubectl_layer_module(kubernetes_version: str) -> str:
    """The Python module of the CDK kubectl layer for exactly this Kubernetes minor version."""
    return f"aws_cdk.lambda_layer_kubectl_v{kubernetes_version.split('.')[1]}"


def kubectl_layer_package(kubernetes_version: str) -> str:
    """The pip distribution that provides `kubectl_layer_module(kubernetes_version)`."""
    return f"aws-cdk.lambda-layer-kubectl-v{kubernetes_version.split('.')[1]}"


def _image_ray_version(image: str) -> str | None:
    image = image.split("@", 1)[0]  # repo:tag@sha256:... is that tag's image, pinned
    if image in KNOWN_IMAGES:
        return KNOWN_IMAGES[image]
    match = re.fullmatch(r"(docker\.io/)?rayproject/ray(-ml)?:(\d+\.\d+\.\d+).*", image)
    return match.group(3) if match else None


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])

# EKS managed add-on versions, per Kubernetes minor. Unpinned, EKS installs its default build at deploy time,
# so what the tests validate (the node monitoring agent's configuration schema) need not be what runs. Each
# version is one that AWS documents for that minor:
#   vpc-cni: EKS user guide "Assign IPs to Pods with the Amazon VPC CNI", table "Amazon VPC CNI versions", row
#     1.34 (https://docs.amazonaws.cn/eks/latest/userguide/pod-networking.html; the docs.aws.amazon.com copy in the
#     store predates 1.34).
#   kube-proxy: EKS user guide "Manage kube-proxy in Amazon EKS clusters", table "kube-proxy versions", row 1.34
#     (https://docs.aws.amazon.com/eks/latest/userguide/managing-kube-proxy.html).
#   coredns: EKS user guide "Manage CoreDNS for DNS in Amazon EKS clusters", table "CoreDNS versions", row 1.34
#     (https://docs.aws.amazon.com/eks/latest/userguide/managing-coredns.html).
#   eks-pod-identity-agent: the user guide keeps no per-version table; v1.3.10-eksbuild.1 is the build an EKS
#     maintainer names as "set to default version in all regions" (aws/containers-roadmap#2684, 2025-11-24).
#   eks-node-monitoring-agent: v1.7.0-eksbuild.1, the image tag of chart 1.7.0 (aws/eks-node-monitoring-agent
#     tag v1.7.0, charts/eks-node-monitoring-agent/values.yaml `nodeAgent.image.tag`), whose configuration schema
#     (charts/configuration.schema.json at that tag) the tests validate the add-on's values against.
#   amazon-cloudwatch-observability: no per-version table either; v4.10.3-eksbuild.1 is the build AWS's own
#     sample pins (aws-observability/application-signals-demo#334, 2026-04-07) after v5.3.0 dropped a ClusterRole
#     rule the agent's EKS resource detector needs (aws-observability/helm-charts#287).
# `aws eks describe-addon-versions --kubernetes-version 1.34 --addon-name NAME` lists what a region offers, and
# `python -m config check --online` asks it for every pin the file uses (config/online.py); offline they are
# unconfirmed. A new
# Kubernetes minor needs its line here: the kubectl layer rule in `python -m config check` refuses a minor with
# no layer installed, and tests/test_addon_versions.py checks that every installed layer's minor has a line.
MANAGED_ADDON_VERSIONS: dict[str, dict[str, str]] = {
    "1.34": {
        "vpc-cni": "v1.20.4-eksbuild.1",
        "kube-proxy": "v1.34.1-eksbuild.2",
        "coredns": "v1.12.4-eksbuild.1",
        "eks-pod-identity-agent": "v1.3.10-eksbuild.1",
        "eks-node-monitoring-agent": "v1.7.0-eksbuild.1",
        "amazon-cloudwatch-observability": "v4.10.3-eksbuild.1",
    },
}

# The KubeRay operator chart (its version is the file's `ray.kuberay_version`); `python -m config check --online`
# looks the version up in the repository's index.yaml (config/online.py), since the stored index could not confirm
# 1.7.0 (stacks/versions.py).
KUBERAY_CHART = "kuberay-operator"
KUBERAY_REPOSITORY = "https://ray-project.github.io/kuberay-helm/"
