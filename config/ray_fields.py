"""The variable file's Ray sections: the image, KubeRay, the head pod, and checkpoint storage.

Every field states its constraint and its unit; the README's reference table is generated from these
descriptions (`config/reference.py`).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from config.base import _Strict

# An image pinned by content: `repo@sha256:<64 hex>` (a tag may stand before the digest).
_DIGEST_RE = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")


class HeadConfig(_Strict):
    """The Ray head pod (on a system node; no GPU)."""

    cpu: int = Field(default=4, ge=1, description="Head CPUs (request = limit).")
    memory_gib: int = Field(default=16, ge=2, description="Head memory, GiB (request = limit).")


class RayConfig(_Strict):
    """Ray, KubeRay and the container image."""

    image: str = Field(
        default="public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1",
        description="Container image for head and workers, pinned by tag or digest (repo@sha256:... or "
                    "repo:tag@sha256:...; never built). A tag can be republished: pin the digest (docs/lifecycle.md).",
    )
    ray_version: str = Field(default="2.58.0", description="Ray version inside the image (must match it).")
    kuberay_version: str = Field(default="1.7.0", description="KubeRay operator Helm chart version.")
    namespace: str = Field(default="ray", pattern=r"^[a-z0-9-]{1,63}$", description="Kubernetes namespace for Ray.")
    service_account: str = Field(
        default="ray-train", pattern=r"^[a-z0-9-]{1,63}$", description="Service account bound to S3 by Pod Identity."
    )
    head: HeadConfig = Field(default_factory=HeadConfig, description="Ray head resources.")
    extra_pip_packages: list[str] = Field(
        default_factory=list,
        description="Extra pip requirements for the runtime env (never torch/ray/transformers/NCCL).",
    )
    preflight: bool = Field(default=True, description="Run the EFA/GPU preflight checks before training.")
    prepull_image: bool = Field(default=True, description="Pre-pull the image on every node (GPU and system) with a "
                                "DaemonSet.")
    auth: Literal["token", "disabled"] = Field(
        default="token",
        description="Ray token authentication (KubeRay authOptions): token (the operator makes a Secret per "
                    "cluster) or disabled (anyone reaching the head may run code).",
    )

    @property
    def image_by_digest(self) -> bool:
        """Whether `image` is pinned by content (repo@sha256:...) rather than by a tag."""
        return bool(_DIGEST_RE.fullmatch(self.image))

    @field_validator("image")
    @classmethod
    def _pinned(cls, value: str) -> str:
        name, _, tag = value.rpartition(":")
        if "@" in value:
            if not _DIGEST_RE.fullmatch(value):
                raise ValueError("malformed digest; pin it as repo@sha256:<64 lowercase hex digits>")
            return value
        if not name or "/" in tag or not tag:
            raise ValueError("image has no tag; pin it, e.g. ...:train-ml-cuda-v1.1")
        if tag == "latest":
            raise ValueError("image pinned to 'latest' drifts between nodes; pin a versioned tag")
        return value


class StorageConfig(_Strict):
    """Where checkpoints and the exported model go."""

    bucket_name: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$",
        description="S3 bucket name (None: '<cluster>-ckpt-<account>-<region>', resolved at deploy and run time).",
    )
    prefix: str = Field(default="ray-finetune", pattern=r"^[A-Za-z0-9_.-]+$", description="Key prefix the job may use.")
    removal_policy: Literal["retain", "destroy"] = Field(
        default="retain", description="What `cdk destroy` does to the bucket: retain or destroy (empties it)."
    )
    existing_bucket: bool = Field(
        default=False,
        description="The bucket already exists (kept by an earlier `cdk destroy` with removal_policy retain): the "
                    "storage stack uses it by name instead of creating it, so a redeploy does not fail with "
                    "'already exists' and finds the old checkpoints (docs/lifecycle.md).",
    )
    noncurrent_days: int = Field(
        default=7, ge=1, description="Days before superseded object versions are deleted, days."
    )
    checkpoint_expiry_days: int = Field(
        default=30, ge=1, description="Days before checkpoint objects under the prefix expire, days."
    )

    @model_validator(mode="after")
    def _existing_is_kept(self) -> StorageConfig:
        if self.existing_bucket and self.removal_policy == "destroy":
            raise ValueError("existing_bucket: true with removal_policy: destroy; the stack does not own an "
                             "existing bucket and never deletes it: set removal_policy: retain")
        return self

    @property
    def checkpoint_prefix(self) -> str:
        """Key prefix of Ray Train's run directories (checkpoints); only these expire, never the exported model."""
        return f"{self.prefix}/checkpoints/"

    @property
    def export_prefix(self) -> str:
        """Key prefix of the exported Hugging Face model (kept; no lifecycle expiry)."""
        return f"{self.prefix}/models/"
