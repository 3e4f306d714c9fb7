"""S3 names: the `s3://` inputs the job reads and the checkpoint bucket the storage stack makes."""

from __future__ import annotations

import re
from dataclasses import dataclass

# S3 bucket names are 3 to 63 characters.
S3_BUCKET_NAME_MAX = 63
# The derived bucket name carries the 12-digit account id, known only at deploy and run time.
_ACCOUNT_ID_CHARS = 12

# `s3://BUCKET/KEY-PREFIX`: S3's bucket-name rules (3-63 lowercase letters, digits, '.', '-', starting
# and ending with a letter or digit) and a non-empty key with no whitespace or glob characters.
_S3_URI_RE = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<key>[^\s*?\[\]]+)$")
_S3_SCHEME_RE = re.compile(r"^s3[an]?:", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class S3Location:
    """An `s3://bucket/key` the job reads: the bucket and the key prefix (no trailing '/')."""

    bucket: str
    key: str


def parse_s3_uri(value: str) -> S3Location | None:
    """`S3Location` of an `s3://` URI, None for anything that is not one (hub id, local path).

    Raises `ValueError` for a malformed S3 URI, so a typo cannot fall through to "hub id".
    """
    if not _S3_SCHEME_RE.match(value):
        return None
    match = _S3_URI_RE.fullmatch(value)
    bucket, key = (match.group("bucket"), match.group("key")) if match else ("", "")
    if (not key.strip("/") or key.startswith("/") or "//" in key or ".." in bucket
            or re.fullmatch(r"\d+\.\d+\.\d+\.\d+", bucket)):
        raise ValueError(f"malformed S3 URI '{value}'; write s3://BUCKET/PREFIX (a bucket name of 3-63 lowercase "
                         "letters, digits, '.' or '-', then a non-empty key prefix without wildcards)")
    return S3Location(bucket=bucket, key=key.rstrip("/"))


class StorageMixin:
    """`ClusterConfig`'s bucket name and the URIs under it (from `cluster.name`, `region` and `storage`)."""

    def bucket_name(self, account: str) -> str:
        """Checkpoint bucket name; `account` may be a CloudFormation token at deploy time."""
        return self.storage.bucket_name or f"{self.cluster.name}-ckpt-{account}-{self.region}"

    def checkpoint_uri(self, bucket: str) -> str:
        """Ray Train storage path: under the prefix the bucket's lifecycle rule expires."""
        return f"s3://{bucket}/{self.storage.checkpoint_prefix.rstrip('/')}"

    def export_uri(self, bucket: str) -> str:
        """Where the final Hugging Face model goes: under the prefix that never expires."""
        return f"s3://{bucket}/{self.storage.export_prefix}{self.job.run_name}"
