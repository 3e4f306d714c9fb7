"""The variable file's Ray sections: the image, KubeRay, the head pod, and checkpoint storage.

Every field states its constraint and its unit; the README's reference table is generated from these
descriptions (`config/reference.py`).
"""

from __future__ import annotations

import re
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import Field, field_validator, model_validator

from config.base import INT32_MAX, _Strict, limit

# Kubernetes object names that must be DNS-1123 labels (namespaces; we hold service accounts to the same):
# lowercase alphanumerics and '-', starting and ending alphanumeric, at most 63 characters
# (k8s.io/apimachinery pkg/util/validation IsDNS1123Label).
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# A released version number, as Ray and the KubeRay chart are published (MAJOR.MINOR.PATCH).
RELEASE_VERSION = r"^\d+\.\d+\.\d+$"

# An image pinned by content: `repo@sha256:<64 hex>` (a tag may stand before the digest).
_DIGEST_RE = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")


class HeadConfig(_Strict):
    """The Ray head pod (on a system node; no GPU)."""

    cpu: int = Field(default=4, ge=1, le=1024, description="Head CPUs (request = limit); must fit a system node.",
                     json_schema_extra=limit("the system node's allocatable CPU (rule); 1024: no EC2 type has more"))
    memory_gib: int = Field(default=16, ge=2, le=32768,
                            description="Head memory, GiB (request = limit); must fit a system node.",
                            json_schema_extra=limit("the system node's allocatable memory (rule); 2: Ray's head "
                                                    "needs it"))


class RayConfig(_Strict):
    """Ray, KubeRay and the container image."""

    image: str = Field(
        default="public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1.0",
        description="Container image for head and workers, pinned by tag or digest (repo@sha256:... or "
                    "repo:tag@sha256:...; never built). A tag can be republished: pin the digest (docs/lifecycle.md).",
        json_schema_extra=limit("OCI reference: a tag other than latest, or sha256 digest of 64 hex digits"),
    )
    ray_version: str = Field(default="2.58.0", pattern=RELEASE_VERSION,
                             description="Ray version inside the image (must match it), MAJOR.MINOR.PATCH.",
                             json_schema_extra=limit("Ray's release numbering; the image's Ray (rule)"))
    kuberay_version: str = Field(default="1.7.0", pattern=RELEASE_VERSION,
                                 description="KubeRay operator Helm chart version, MAJOR.MINOR.PATCH.",
                                 json_schema_extra=limit("KubeRay chart versions (semver)"))
    namespace: str = Field(default="ray", pattern=DNS1123_LABEL, description="Kubernetes namespace for Ray.",
                           json_schema_extra=limit("Kubernetes DNS-1123 label (apimachinery IsDNS1123Label)"))
    service_account: str = Field(
        default="ray-train", pattern=DNS1123_LABEL, description="Service account bound to S3 by Pod Identity.",
        json_schema_extra=limit("Kubernetes DNS-1123 label (apimachinery IsDNS1123Label)"),
    )
    head: HeadConfig = Field(default_factory=HeadConfig, description="Ray head resources.")
    extra_pip_packages: list[str] = Field(
        default_factory=list,
        description="Extra pip requirements for the runtime env (never torch/ray/transformers/NCCL).",
        json_schema_extra=limit("packaging.requirements.Requirement (PEP 508)"),
    )
    preflight: bool = Field(default=True, description="Run the EFA/GPU preflight checks before training.")

    @field_validator("extra_pip_packages")
    @classmethod
    def _requirements(cls, value: list[str]) -> list[str]:
        for requirement in value:
            try:
                Requirement(requirement)
            except InvalidRequirement as exc:
                raise ValueError(f"'{requirement}' is not a pip requirement ({exc}); write e.g. "
                                 "datasets==4.0.0") from exc
        return value
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
            raise ValueError("image has no tag; pin it, e.g. ...:train-ml-cuda-v1.1.0")
        if tag == "latest":
            raise ValueError("image pinned to 'latest' drifts between nodes; pin a versioned tag")
        return value


class StorageConfig(_Strict):
    """Where checkpoints and the exported model go."""

    bucket_name: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", min_length=3, max_length=63,
        description="S3 bucket name, 3-63 lowercase letters, digits, '.', '-' (None: "
                    "'<cluster>-ckpt-<account>-<region>', resolved at deploy and run time).",
        json_schema_extra=limit("cfn-lint AWS::S3::Bucket.BucketName (max 63, pattern); S3 bucket naming rules"),
    )
    prefix: str = Field(default="ray-finetune", pattern=r"^[A-Za-z0-9_.-]+$", max_length=512,
                        description="Key prefix the job may use.",
                        json_schema_extra=limit("S3 object keys (1024 bytes), half left to Ray's run directories"))
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
        default=7, ge=1, le=INT32_MAX, description="Days before superseded object versions are deleted, days.",
        json_schema_extra=limit("S3 NoncurrentDays: a positive botocore integer (32-bit)"),
    )
    checkpoint_expiry_days: int = Field(
        default=30, ge=1, le=INT32_MAX, description="Days before checkpoint objects under the prefix expire, days.",
        json_schema_extra=limit("S3 Expiration Days: a positive botocore integer (32-bit)"),
    )

    @model_validator(mode="after")
    def _existing_is_kept(self) -> StorageConfig:
        if self.existing_bucket and self.removal_policy == "destroy":
            raise ValueError("existing_bucket: true with removal_policy: destroy; the stack does not own an "
                             "existing bucket and never deletes it: set removal_policy: retain")
        return self

    @field_validator("bucket_name")
    @classmethod
    def _bucket_rules(cls, value: str | None) -> str | None:
        # S3's general-purpose bucket naming rules beyond the pattern (docs: "Bucket naming rules").
        if value is not None and (".." in value or re.fullmatch(r"\d+\.\d+\.\d+\.\d+", value)
                                  or value.startswith(("xn--", "sthree-", "amzn-s3-demo-"))
                                  or value.endswith(("-s3alias", "--ol-s3", ".mrap", "--x-s3"))):
            raise ValueError("not a valid S3 bucket name (no '..', no IP address, no reserved prefix or suffix)")
        return value

    @property
    def checkpoint_prefix(self) -> str:
        """Key prefix of Ray Train's run directories (checkpoints); only these expire, never the exported model."""
        return f"{self.prefix}/checkpoints/"

    @property
    def export_prefix(self) -> str:
        """Key prefix of the exported Hugging Face model (kept; no lifecycle expiry)."""
        return f"{self.prefix}/models/"
