"""The EC2 target: the same variable file driving a Ray cluster-launcher cluster (`ray up`) without Kubernetes.

`target: ec2` in the file (or `cdk synth -c target=ec2`) swaps the EKS cluster stack for a small EC2
stack (placement group, security group, instance profiles, token secret) and `python -m ops.launcher
render` writes the launcher YAML from that stack's outputs. The `ec2:` section holds what only this
target needs; everything else (worker groups, transport, image, bucket, job) is read from the same
fields the EKS path reads. Rules here are added to `ClusterConfig.cross_field_problems`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from config.base import limit
from config.catalog import load_catalog
from config.cluster_fields import GP3_MAX_GIB, INSTANCE_TYPE_PATTERN

Target = Literal["eks", "ec2"]

# The DLAMI whose SSM parameter names the current x86_64 AL2023 "Deep Learning Base OSS Nvidia Driver
# GPU AMI": NVIDIA driver, NVIDIA container toolkit, EFA installer and aws-ofi-nccl, SSM agent
# (DLAMI developer guide, "Finding the ID of a DLAMI": /aws/service/deeplearning/ami/$arch/$ami_type/
# latest/ami-id, and that AMI's release notes for the package list).
DLAMI_SSM_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"
# The CPU head's AMI: plain Amazon Linux 2023 (SSM agent, AWS CLI v2, rsync and openssh-clients included; no
# NVIDIA driver, which an m7i has no use for, and no docker, which the initialization commands install). AWS's
# public parameter for the current AL2023 x86_64 AMI ("Amazon Linux 2023 user guide: Get the latest AL2023 AMI
# ID using Systems Manager Parameter Store").
HEAD_AMI_SSM_PARAMETER = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
# AL2023 AMIs log in as ec2-user and boot from /dev/xvda.
SSH_USER = "ec2-user"
ROOT_DEVICE = "/dev/xvda"
# The Ray autoscaler tags every instance it launches with this key = cluster_name
# (ray/autoscaler/tags.py TAG_RAY_CLUSTER_NAME, ray 2.58.0; node_provider.py _create_node).
RAY_CLUSTER_TAG = "ray-cluster-name"
# The OS, the docker daemon and the Ray processes outside the object store keep this share.
_USABLE_MEMORY_FRACTION = 0.90
_SHM_FRACTION = 0.25
_SHM_CAP_GIB = 64
_OBJECT_STORE_SHM_FRACTION = 0.75
# The EC2 stack's CloudFormation outputs the launcher YAML is rendered from (stacks/ec2.py emits them,
# ops/launcher.py reads them), and the one it takes from the network stack (stacks/network.py).
STACK_OUTPUTS = ("HeadInstanceProfileArn", "WorkerInstanceProfileArn", "WorkerRoleArn", "SecurityGroupId",
                 "AvailabilityZone", "PlacementGroupName", "ImageId", "HeadImageId", "AuthTokenSecretArn", "BucketName",
                 "CheckpointUri")
NETWORK_OUTPUTS = ("GpuSubnetId",)


class Ec2Config(BaseModel):
    """What only the EC2 target needs (`target: ec2`); the worker groups, image and job come from the same file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    head_instance_type: str = Field(
        default="m7i.2xlarge", pattern=INSTANCE_TYPE_PATTERN,
        description="EC2 instance type of the Ray head (catalog; no GPU: the head only schedules, trains nothing).",
        json_schema_extra=limit("botocore ec2 InstanceType enum; config/instances.yaml"),
    )
    head_disk_gib: int = Field(default=100, ge=50, le=GP3_MAX_GIB, description="Head root volume, GiB (gp3, "
                               "encrypted; holds the multi-GB image).",
                               json_schema_extra=limit("cfn-lint AWS::EC2::LaunchTemplate Ebs.VolumeSize (gp3); 50: "
                                                       "the DLAMI and the image"))
    access: Literal["ssm", "ssh"] = Field(
        default="ssm",
        description="How `ray up` reaches the head: ssm (SSH tunnelled through SSM Session Manager, no port "
                    "open) or ssh (port 22 open to the VPC's CIDR only: run `ray up` from inside the VPC).",
    )
    idle_timeout_minutes: int = Field(
        default=10, ge=1, le=1440,
        description="Minutes a worker node may sit idle before Ray's autoscaler terminates it, minutes "
                    "(replaces the Cluster Autoscaler's scale-down on EKS).",
        json_schema_extra=limit("project bound: one day"),
    )


@dataclass(frozen=True, kw_only=True)
class NodeSizing:
    """What the Ray container on the EC2 head gets (workers get their EKS pod's sizes, `pod_resources`)."""

    shm_gib: int
    """`docker run --shm-size`, GiB."""
    object_store_mib: int
    """`ray start --object-store-memory`, MiB (inside /dev/shm)."""


def node_sizing(memory_gib: int) -> NodeSizing:
    """/dev/shm and object store for a head instance of `memory_gib` GiB: the EKS pod rule (a quarter of the
    usable memory, capped at 64 GiB; three quarters of it for Ray's object store) over the whole instance."""
    usable_gib = int(memory_gib * _USABLE_MEMORY_FRACTION)
    shm = max(1, min(_SHM_CAP_GIB, int(usable_gib * _SHM_FRACTION)))
    return NodeSizing(shm_gib=shm, object_store_mib=int(shm * 1024 * _OBJECT_STORE_SHM_FRACTION))


def efa_devices(config: Any, group: Any) -> int:
    """EFA devices a node of `group` (a WorkerGroup) gets on EC2: every interface the type has, with efa
    transport; else 0. (`config` is a ClusterConfig; untyped here, as config.model imports this module.)"""
    itype = load_catalog().instances[group.instance_type]
    return itype.efa_interfaces if config.nccl.transport == "efa" else 0


def ec2_problems(config: Any) -> list[tuple[str, str]]:
    """(field, message) for each EC2-target rule `config` (a ClusterConfig) breaks; the section itself is
    checked whatever the target, the rest only for `target: ec2`."""
    problems: list[tuple[str, str]] = []
    head = load_catalog().get(config.ec2.head_instance_type)
    if head is None:
        problems.append(("ec2.head_instance_type", f"unknown instance type '{config.ec2.head_instance_type}'; use "
                         "one listed in config/instances.yaml (a CPU type such as m7i.2xlarge)"))
    elif head.gpus:
        problems.append(("ec2.head_instance_type", f"{head.name} has {head.gpus} GPU(s), but the head trains "
                         "nothing (its Ray resources are CPU 0, GPU 0); pick a CPU type such as m7i.2xlarge"))
    if config.target != "ec2":
        return problems
    catalog = load_catalog()
    for index, group in enumerate(config.cluster.worker_groups):
        itype = catalog.get(group.instance_type)
        if itype is not None and itype.gpus and group.gpus_per_pod != itype.gpus:
            problems.append((f"cluster.worker_groups.{index}.gpus_per_pod", f"{group.gpus_per_pod}, but target: ec2 "
                             f"runs one Ray container per node holding all {itype.name}'s {itype.gpus} GPUs; set "
                             f"gpus_per_pod: {itype.gpus}"))
        if group.capacity == "capacity_block":
            problems.append((f"cluster.worker_groups.{index}.capacity", "capacity_block is not supported by "
                             "target: ec2 (the launcher YAML has no capacity-block market); use on_demand or spot, "
                             "or target: eks"))
    return problems

