"""Inline checkov acknowledgments on the manifests (`checkov.io/skipN` annotations)."""

from __future__ import annotations

SKIP_ANNOTATION = "checkov.io/skip{n}"


def checkov_skips(reasons: dict[str, str]) -> dict[str, str]:
    """Annotations acknowledging checkov checks (`CKV_K8S_43` -> why) on the object that carries them."""
    return {SKIP_ANNOTATION.format(n=i): f"{check}={reason}"
            for i, (check, reason) in enumerate(sorted(reasons.items()), start=1)}
