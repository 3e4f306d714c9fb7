"""Version rules: the Ray version of an image, the kubectl layer and Cluster Autoscaler chart per Kubernetes minor.

The Cluster Autoscaler pins live here, not in `stacks/versions.py`, because the variable file's validation
checks against them and `config` knows nothing of the stacks; `stacks/versions.py` imports them.
"""

from __future__ import annotations

import re

# Images whose Ray version is known. A rayproject/ray:X.Y.Z tag is parsed instead.
KNOWN_IMAGES: dict[str, str] = {
    "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1": "2.58.0",
}

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
