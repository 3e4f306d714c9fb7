"""The variable file's infrastructure sections: VPC, EKS cluster, node groups, autoscaling, NCCL transport.

Every field states its constraint and its unit; the README's reference table is generated from these
descriptions (`config/reference.py`).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, field_validator

from config.base import _Strict


class NetworkConfig(_Strict):
    """The VPC."""

    vpc_cidr: str = Field(default="10.0.0.0/16", description="VPC IPv4 CIDR block.")
    max_azs: int = Field(
        default=2, ge=2, le=6,
        description="Availability zones the VPC spans (EKS needs at least 2; at most the region's AZ count).",
    )
    nat_gateways: int = Field(
        default=1, ge=1, le=6, description="NAT gateways (one keeps cost down; one per AZ for HA)."
    )

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        try:
            ipaddress.IPv4Network(value)
        except ValueError as exc:
            raise ValueError(f"not an IPv4 CIDR block ({exc}); write e.g. 10.0.0.0/16") from exc
        return value


class SystemNodes(_Strict):
    """The CPU node group that runs the Ray head and system pods."""

    instance_type: str = Field(default="m7i.2xlarge", description="EC2 instance type (catalog).")
    nodes: int = Field(default=2, description="Node count (min = desired = max), nodes.")
    disk_gib: int = Field(default=100, ge=20, description="Root volume size, GiB (gp3, encrypted).")


class WorkerGroup(_Strict):
    """One GPU node group and its matching Ray worker group."""

    name: str = Field(
        description="Group name (lowercase letters, digits, '-'); names the node group and Ray group.",
        pattern=r"^[a-z][a-z0-9-]{0,30}$",
    )
    instance_type: str = Field(description="EC2 GPU instance type (catalog).")
    nodes: int = Field(description="Nodes a job runs on (the Ray worker pods' node count), nodes; also the node "
                       "group maximum unless max_nodes is set.")
    min_nodes: int | None = Field(default=None, description="Node group minimum, nodes (default: 0 with autoscaling "
                                  "enabled, so the group is empty while idle; else nodes).")
    max_nodes: int | None = Field(default=None, description="Node group maximum, nodes (default: nodes).")
    gpus_per_pod: int = Field(description="GPUs per Ray worker pod; must divide the instance's GPUs.")
    capacity: Literal["on_demand", "spot", "capacity_block"] = Field(
        default="on_demand", description="Capacity type: on_demand, spot or capacity_block."
    )
    capacity_reservation_id: str | None = Field(
        default=None, description="EC2 capacity reservation id (cr-...), required for capacity_block."
    )
    gpudirect_rdma: bool = Field(
        default=False,
        description="Ask libfabric for GPUDirect RDMA (FI_EFA_USE_DEVICE_RDMA=1); only p4d/p5 have it.",
    )
    disk_gib: int = Field(
        default=300, ge=100, description="Root volume, GiB (the DLC image is many GB; NVMe takes it where present)."
    )


class AutoscalingConfig(_Strict):
    """Cluster Autoscaler for the GPU node groups (scale from and to zero)."""

    enabled: bool = Field(
        default=True,
        description="Run the Cluster Autoscaler: GPU groups start at min_nodes (0 by default) and grow when Ray "
                    "worker pods are Pending (false: fixed groups of `nodes`).",
    )
    scale_down_minutes: int = Field(
        default=10, ge=1, le=1440,
        description="Minutes a GPU node must be unneeded (no Ray pod) before the autoscaler removes it, minutes.",
    )


class ClusterSection(_Strict):
    """The EKS cluster."""

    name: str = Field(
        default="ray-efa", pattern=r"^[a-z][a-z0-9-]{1,40}$", description="EKS cluster name and resource prefix."
    )
    kubernetes_version: str = Field(default="1.34", description="EKS Kubernetes version (1.34 or later).")
    endpoint_access: Literal["public", "private", "public_and_private"] = Field(
        default="public_and_private", description="API server endpoint access."
    )
    public_access_cidrs: list[str] = Field(
        default_factory=lambda: ["0.0.0.0/0"],
        description="CIDRs allowed to reach a public endpoint (restrict to your office/VPN).",
    )
    admin_role_arn: str | None = Field(
        default=None, description="IAM role ARN granted cluster admin through an access entry (None: none)."
    )
    cloudwatch_observability: bool = Field(
        default=False, description="Install the amazon-cloudwatch-observability add-on (GPU and EFA metrics)."
    )
    system_nodes: SystemNodes = Field(default_factory=SystemNodes, description="System node group.")
    worker_groups: list[WorkerGroup] = Field(min_length=1, description="GPU worker groups.")

    @field_validator("kubernetes_version")
    @classmethod
    def _version(cls, value: str) -> str:
        match = re.fullmatch(r"1\.(\d+)", value)
        if not match or int(match.group(1)) < 34:
            raise ValueError("use a current EKS version, 1.34 or later, written like \"1.34\"")
        return value

    @field_validator("admin_role_arn")
    @classmethod
    def _arn(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+", value):
            raise ValueError("not an IAM role ARN; write arn:aws:iam::123456789012:role/NAME")
        return value


class NcclConfig(_Strict):
    """How NCCL moves data between nodes."""

    transport: Literal["efa", "socket"] = Field(
        default="efa", description="Inter-node transport: efa (libfabric + aws-ofi-nccl) or socket (TCP)."
    )
    debug: Literal["VERSION", "WARN", "INFO", "TRACE"] = Field(
        default="INFO", description="NCCL_DEBUG level (INFO shows which network NCCL picked)."
    )
