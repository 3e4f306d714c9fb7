"""Switching a loaded variable file to the other target (`cdk synth -c target=ec2`), validated again, and the
EC2 target's cost (the EKS one is `ClusterConfig.idle_cost_per_hour` / `cost_per_hour`)."""

from __future__ import annotations

from config.catalog import load_catalog
from config.model import NAT_GATEWAY_USD_PER_HOUR, ClusterConfig


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


# `make synth` (and so `make demo`) synthesizes the file's own target (synth-cdk, synth-k8s) and the EC2 target
# from the same file (synth-ec2, `-c target=ec2`; app.py calls `with_target`). For an EKS file the EC2 target's
# rules refuse (a capacity block, gpus_per_pod short of a whole node), synth-ec2 is skipped with a note
# (`python -m config suits ec2`), and `python -m config check` prints the same note: a file check passes always
# synthesizes, and check and synth name the same rules.


def target_problems(config: ClusterConfig, target: str) -> list[str]:
    """`field: problem` lines for each rule `config` breaks under `target` (none: it synthesizes for it)."""
    try:
        with_target(config, target)
    except ValueError as exc:
        return str(exc).splitlines()
    return []


def ec2_cost_per_hour(config: ClusterConfig) -> tuple[float, float]:
    """On-demand (idle, running) cost of the EC2 target for `config`, USD per hour.

    Idle: the head instance, the NAT gateway(s) and each worker group's minimum (`min_workers`: 0 under
    autoscaling by default); running: plus each group up to `nodes`. No control plane, no system nodes.
    EBS volumes, data transfer and the Secrets Manager secret (USD 0.40 a month) are left out, as on EKS.
    """
    catalog = load_catalog()
    idle = catalog.instances[config.ec2.head_instance_type].usd_per_hour
    idle += NAT_GATEWAY_USD_PER_HOUR * config.network.nat_gateways
    running = idle
    for group in config.cluster.worker_groups:
        price = catalog.instances[group.instance_type].usd_per_hour
        idle += price * config.group_min(group)
        running += price * max(group.nodes, config.group_min(group))
    return idle, running
