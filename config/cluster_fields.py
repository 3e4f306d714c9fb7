"""The variable file's infrastructure sections: VPC, EKS cluster, node groups, autoscaling, NCCL transport.

Every field states its constraint and its unit; the README's reference table is generated from these
descriptions (`config/reference.py`).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from config.base import _Strict, limit

# EKS's default quota of nodes per managed node group (Amazon EKS service quotas, "Nodes per managed
# node group"); botocore's eks model bounds the scaling sizes below only (`Capacity` min 1, `ZeroCapacity`
# min 0, both 32-bit `integer` shapes).
EKS_NODES_PER_NODEGROUP_MAX = 450
# EKS's default quota of managed node groups per cluster (Amazon EKS service quotas).
EKS_NODEGROUPS_PER_CLUSTER_MAX = 30
# gp3 volume sizes, GiB: cfn-lint's AWS::EC2::LaunchTemplate schema, Ebs.VolumeSize ("gp3: 1 - 65,536 GiB").
GP3_MAX_GIB = 65536
# VPC and subnet masks: EC2 allows IPv4 VPC blocks from /16 to /28, and CDK's `ec2.Vpc` refuses any other
# (aws-cdk-lib 2.275.0 aws-ec2/lib/network-util.js, InvalidCidrRangeError: "VPCs must be between /16 and
# /28 and the minimum subnet size is /28").
VPC_MASK_MIN, VPC_MASK_MAX = 16, 28
# EKS's limit on public endpoint CIDR blocks per cluster (Amazon EKS service quotas).
EKS_PUBLIC_ACCESS_CIDRS_MAX = 40
# EC2 instance type names as botocore's ec2 `InstanceType` enum writes them (family.size).
INSTANCE_TYPE_PATTERN = r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$"
# EC2 capacity reservation ids (Capacity Blocks too): `cr-` and 17 hex digits.
CAPACITY_RESERVATION_PATTERN = r"^cr-[0-9a-f]{17}$"


def ipv4_network(value: str) -> ipaddress.IPv4Network:
    """A strict IPv4 CIDR (no host bits set), as EC2 and EKS take it; ValueError naming the fix otherwise."""
    if not isinstance(value, str):
        raise ValueError("write a CIDR as a string, e.g. 10.0.0.0/16")
    try:
        return ipaddress.IPv4Network(value)
    except ValueError as exc:
        raise ValueError(f"not an IPv4 CIDR block ({exc}); write e.g. 10.0.0.0/16") from exc


class NetworkConfig(_Strict):
    """The VPC."""

    vpc_cidr: str = Field(
        default="10.0.0.0/16",
        description="VPC IPv4 CIDR block, /16 to /28, no host bits; must hold the subnets CDK carves from it "
                    "(a /24 public subnet per AZ, the rest split among the private subnets).",
        json_schema_extra=limit("EC2 CreateVpc and aws-cdk-lib 2.275.0 network-util.js (/16../28)"),
    )
    max_azs: int = Field(
        default=2, ge=2, le=6,
        description="Availability zones the VPC spans (EKS needs at least 2; at most the region's AZ count).",
        json_schema_extra=limit("EKS CreateCluster: subnets in at least 2 AZs; 6: most AZs of a region"),
    )
    nat_gateways: int = Field(
        default=1, ge=1, le=6,
        description="NAT gateways (one keeps cost down; one per AZ for HA); at most network.max_azs.",
        json_schema_extra=limit("aws-cdk-lib 2.275.0 vpc.js determineNatGatewayCount caps it at the AZ count"),
    )

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        network = ipv4_network(value)
        if not VPC_MASK_MIN <= network.prefixlen <= VPC_MASK_MAX:
            raise ValueError(f"a VPC block must be /{VPC_MASK_MIN} to /{VPC_MASK_MAX} (EC2); got /{network.prefixlen}")
        if network.is_multicast or network.is_loopback or network.is_link_local or network.is_reserved \
                or network.is_unspecified:
            raise ValueError(f"{value} is a reserved range EC2 refuses for a VPC; use a private block such as "
                             "10.0.0.0/16")
        return value


class SystemNodes(_Strict):
    """The CPU node group that runs the Ray head and system pods."""

    instance_type: str = Field(
        default="m7i.2xlarge", pattern=INSTANCE_TYPE_PATTERN,
        description="EC2 instance type, one listed in config/instances.yaml.",
        json_schema_extra=limit("botocore ec2 InstanceType enum; config/instances.yaml"),
    )
    nodes: int = Field(
        default=2, ge=1, le=EKS_NODES_PER_NODEGROUP_MAX, description="Node count (min = desired = max), nodes.",
        json_schema_extra=limit("botocore eks Capacity (min 1); EKS quota, nodes per managed node group"),
    )
    disk_gib: int = Field(
        default=100, ge=20, le=GP3_MAX_GIB, description="Root volume size, GiB (gp3, encrypted).",
        json_schema_extra=limit("cfn-lint AWS::EC2::LaunchTemplate Ebs.VolumeSize (gp3); 20: the EKS AMI's own size"),
    )


class WorkerGroup(_Strict):
    """One GPU node group and its matching Ray worker group."""

    name: str = Field(
        description="Group name (lowercase letters, digits, '-'); names the node group and Ray group.",
        pattern=r"^[a-z]([a-z0-9-]{0,29}[a-z0-9])?$",
        json_schema_extra=limit("Kubernetes DNS-1123 label (Ray group name, node labels); 31 keeps node group names "
                                "short"),
    )
    instance_type: str = Field(
        pattern=INSTANCE_TYPE_PATTERN, description="EC2 GPU instance type, one listed in config/instances.yaml.",
        json_schema_extra=limit("botocore ec2 InstanceType enum; config/instances.yaml"),
    )
    nodes: int = Field(ge=1, le=EKS_NODES_PER_NODEGROUP_MAX,
                       description="Nodes a job runs on (the Ray worker pods' node count), nodes; also the node "
                       "group maximum unless max_nodes is set.",
                       json_schema_extra=limit("botocore eks Capacity (min 1); EKS quota, nodes per managed node "
                                               "group"))
    min_nodes: int | None = Field(default=None, ge=0, le=EKS_NODES_PER_NODEGROUP_MAX,
                                  description="Node group minimum, nodes (default: 0 with autoscaling "
                                  "enabled, so the group is empty while idle; else nodes).",
                                  json_schema_extra=limit("botocore eks ZeroCapacity (min 0); EKS quota"))
    max_nodes: int | None = Field(default=None, ge=1, le=EKS_NODES_PER_NODEGROUP_MAX,
                                  description="Node group maximum, nodes (default: nodes).",
                                  json_schema_extra=limit("botocore eks Capacity (min 1); EKS quota"))
    gpus_per_pod: int = Field(ge=1, le=16, description="GPUs per Ray worker pod; must divide the instance's GPUs.",
                              json_schema_extra=limit("the instance's GPU count (config/instances.yaml)"))
    logical_gpus: int | None = Field(
        default=None, ge=1, le=16,
        description="Lab only: GPUs that Ray counts on each node of a CPU instance type, none of them real. The "
        "pods request this many nvidia.com/gpu (a node that advertises them as an extended resource), Ray gets "
        "num-gpus, and the workload trains on CPU with gloo where it would use CUDA and NCCL. Null (default): the "
        "instance's real GPUs. Refused on a GPU instance type.",
        json_schema_extra=limit("lab and test clusters only (docs/cluster-tier.md); a GPU instance type has real "
                                "GPUs"),
    )
    capacity: Literal["on_demand", "spot", "capacity_block"] = Field(
        default="on_demand", description="Capacity type: on_demand, spot or capacity_block."
    )
    capacity_reservation_id: str | None = Field(
        default=None, pattern=CAPACITY_RESERVATION_PATTERN,
        description="EC2 capacity reservation id (cr- and 17 hex digits), required for capacity_block.",
        json_schema_extra=limit("EC2 resource id format (cr-xxxxxxxxxxxxxxxxx)"),
    )
    gpudirect_rdma: bool = Field(
        default=False,
        description="Ask libfabric for GPUDirect RDMA (FI_EFA_USE_DEVICE_RDMA=1); only p4d/p5 have it.",
    )
    disk_gib: int = Field(
        default=300, ge=100, le=GP3_MAX_GIB,
        description="Root volume, GiB (the DLC image is many GB; NVMe takes it where present).",
        json_schema_extra=limit("cfn-lint AWS::EC2::LaunchTemplate Ebs.VolumeSize (gp3); 100: the DLC image"),
    )
    deployed: bool = Field(
        default=False,
        description="true once this group's node group exists (set it after the first successful deploy): with "
                    "the autoscaler the template then leaves ScalingConfig.DesiredSize out, so a later deploy "
                    "(a max_nodes or min_nodes change among them) keeps the size the Cluster Autoscaler set; "
                    "false writes DesiredSize = the group minimum, which creating a node group needs "
                    "(docs/lifecycle.md). `python -m config check --online` compares it with the node groups EKS "
                    "has and refuses a mismatch either way.",
        json_schema_extra=limit("EKS API NodegroupScalingConfig: all or none of the sizes at creation; "
                                "CloudFormation takes no action when DesiredSize is removed"),
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
        json_schema_extra=limit("project bound: one day"),
    )
    node_lost_seconds: int = Field(
        default=60, ge=0, le=3600,
        description="Seconds a Ray worker pod stays bound to a NotReady or unreachable node before it is evicted "
        "(its tolerationSeconds; Kubernetes' DefaultTolerationSeconds admission plugin gives 300), and how long "
        "the watchdog then lets it stay Terminating before it force-deletes it so KubeRay replaces it, seconds.",
        json_schema_extra=limit("pod tolerationSeconds (int64); project bound: one hour"),
    )


class ClusterSection(_Strict):
    """The EKS cluster."""

    name: str = Field(
        default="ray-efa", pattern=r"^[a-z][a-z0-9-]{1,40}$",
        description="EKS cluster name and resource prefix, 2-41 characters (the derived bucket name must fit S3's 63).",
        json_schema_extra=limit("cfn-lint AWS::EKS::Cluster.Name (1-100, ^[0-9A-Za-z][A-Za-z0-9-_]*), narrowed "
                                "for S3 and Kubernetes names"),
    )
    kubernetes_version: str = Field(
        default="1.34", pattern=r"^1\.\d\d$", description="EKS Kubernetes version (1.34 or later).",
        json_schema_extra=limit("cfn-lint AWS::EKS::Cluster.Version (1\\.\\d\\d); pinned kubectl layers"),
    )
    endpoint_access: Literal["public", "private", "public_and_private"] = Field(
        default="private",
        description="Kubernetes API endpoint: private (only from inside the VPC; the default), public_and_private "
                    "(also from public_access_cidrs) or public (from the internet: needs endpoint_open_to_internet).",
    )
    public_access_cidrs: list[str] = Field(
        default_factory=list, max_length=EKS_PUBLIC_ACCESS_CIDRS_MAX,
        description="IPv4 CIDRs allowed to reach a public endpoint (your office, VPN or own address/32), no host "
                    "bits; required with a public endpoint, empty with a private one. 0.0.0.0/0 needs "
                    "endpoint_open_to_internet.",
        json_schema_extra=limit("EKS quota: 40 public access CIDRs per cluster; Python ipaddress (strict)"),
    )
    endpoint_open_to_internet: bool = Field(
        default=False,
        description="true to allow 0.0.0.0/0 in public_access_cidrs (or endpoint_access: public): anyone on the "
                    "internet can then reach the Kubernetes API endpoint (still behind IAM authentication).",
    )
    admin_role_arn: str | None = Field(
        default=None, max_length=2048,
        description="IAM role ARN granted cluster admin through an access entry (None: none).",
        json_schema_extra=limit("IAM role ARN: arn:aws:iam::<12-digit account>:role/NAME (botocore iam arnType, "
                                "max 2048)"),
    )
    cloudwatch_observability: bool = Field(
        default=False, description="Install the amazon-cloudwatch-observability add-on (GPU and EFA metrics)."
    )
    node_ami_release_version: str | None = Field(
        default=None, pattern=r"^1\.\d+\.\d+-\d{8}$",
        description="EKS-optimized AL2023 AMI release version of every node group (ReleaseVersion, e.g. "
                    "1.34.1-20260724; the amazon-eks-ami release notes list them). None: the newest at the group's "
                    "creation, never changed by a later deploy. Changing it replaces every node of every group "
                    "(a running job ends).",
        json_schema_extra=limit("AWS::EKS::Nodegroup ReleaseVersion (an AMI release for the group's Kubernetes "
                                "version)"),
    )
    system_nodes: SystemNodes = Field(default_factory=SystemNodes, description="System node group.")
    worker_groups: list[WorkerGroup] = Field(
        min_length=1, max_length=EKS_NODEGROUPS_PER_CLUSTER_MAX, description="GPU worker groups.",
        json_schema_extra=limit("EKS quota: managed node groups per cluster"),
    )

    @field_validator("public_access_cidrs")
    @classmethod
    def _public_cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            ipv4_network(cidr)
        return value

    @field_validator("kubernetes_version")
    @classmethod
    def _version(cls, value: str) -> str:
        match = re.fullmatch(r"1\.(\d+)", value)
        if not match or int(match.group(1)) < 34:
            raise ValueError("use a current EKS version, 1.34 or later, written like \"1.34\"")
        return value

    @model_validator(mode="after")
    def _release_matches_version(self) -> ClusterSection:
        release = self.node_ami_release_version
        if release is not None and not release.startswith(f"{self.kubernetes_version}."):
            raise ValueError(f"node_ami_release_version {release} is not a release for Kubernetes "
                             f"{self.kubernetes_version}; write {self.kubernetes_version}.<patch>-<YYYYMMDD> or null")
        return self

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
