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
