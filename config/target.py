"""Switching a loaded variable file to the other target (`cdk synth -c target=ec2`), validated again."""

from __future__ import annotations

from config.model import ClusterConfig


def with_target(config: ClusterConfig, target: str) -> ClusterConfig:
    """`config` with `target` replaced and checked again (model and cross-field rules) like a loaded file.

    Raises `ValueError` with one `field: problem` line each when the target is unknown or the file does
    not suit it (e.g. a capacity block under `target: ec2`).
    """
    if target not in ("eks", "ec2"):
        raise ValueError(f"target: '{target}' is not one of eks, ec2 (-c target=...)")
    if target == config.target:
        return config
    changed = ClusterConfig.model_validate({**config.model_dump(), "target": target})
    problems = changed.cross_field_problems()
    if problems:
        raise ValueError("\n".join(f"{p.path}: {p.message}" for p in problems))
    return changed
