"""Typed model of the variable file (`config/cluster.yaml`): `ClusterConfig`, composed of the parts below.

Every field carries a description with its unit; the README's reference table is generated
from these descriptions. Field-level checks live on the fields (`cluster_fields`, `ray_fields`,
`job_fields`); rules that relate several fields live in `rules` (`ClusterConfig.cross_field_problems`),
so the loader can report them all at once. Derived values (pods per node, world size, pod resources,
/dev/shm, hugepages, EFA devices, costs) are computed once, on first use, from the model and the
instance catalog (`topology`, `resources`, `prices`, `s3`). Version rules are in `versions`.
Every name below stays importable from `config.model`.
"""

from __future__ import annotations

from pydantic import Field

from config.base import Problem, _Strict, limit
from config.cluster_fields import (
    AutoscalingConfig,
    ClusterSection,
    NcclConfig,
    NetworkConfig,
    SystemNodes,
    WorkerGroup,
)
from config.ec2 import Ec2Config, Target
from config.job_fields import JobConfig
from config.observability import ObservabilityConfig
from config.prices import EKS_CONTROL_PLANE_USD_PER_HOUR, NAT_GATEWAY_USD_PER_HOUR, CostsMixin
from config.ray_fields import HeadConfig, RayConfig, StorageConfig
from config.resources import EFA_HUGEPAGES_MIB_PER_POD, PodResources, ResourcesMixin
from config.rules import PROTECTED_PACKAGES, RulesMixin, requirement_name
from config.s3 import S3_BUCKET_NAME_MAX, S3Location, StorageMixin, parse_s3_uri
from config.topology import TopologyMixin
from config.versions import KNOWN_IMAGES, RAY_TOKEN_AUTH_MIN, kubectl_layer_module, kubectl_layer_package

__all__ = [
    "EFA_HUGEPAGES_MIB_PER_POD",
    "EKS_CONTROL_PLANE_USD_PER_HOUR",
    "KNOWN_IMAGES",
    "NAT_GATEWAY_USD_PER_HOUR",
    "PROTECTED_PACKAGES",
    "RAY_TOKEN_AUTH_MIN",
    "S3_BUCKET_NAME_MAX",
    "AutoscalingConfig",
    "ClusterConfig",
    "ClusterSection",
    "HeadConfig",
    "JobConfig",
    "NcclConfig",
    "NetworkConfig",
    "PodResources",
    "Problem",
    "RayConfig",
    "S3Location",
    "StorageConfig",
    "SystemNodes",
    "WorkerGroup",
    "kubectl_layer_module",
    "kubectl_layer_package",
    "parse_s3_uri",
    "requirement_name",
]


class ClusterConfig(RulesMixin, TopologyMixin, ResourcesMixin, StorageMixin, CostsMixin, _Strict):
    """The whole variable file: infrastructure, manifests and job derive from it."""

    region: str = Field(default="us-east-2", pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d$",
                        description="AWS region (one listed under `regions` in config/instances.yaml).",
                        json_schema_extra=limit("AWS region names; config/instances.yaml regions (rule)"))
    gpu_availability_zone: str = Field(
        default="us-east-2b", pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$",
        description="The one AZ all GPU nodes run in (cluster placement group); one of the region's AZs.",
        json_schema_extra=limit("AWS AZ names (region + letter); the region's AZs in config/instances.yaml (rule)"),
    )
    network: NetworkConfig = Field(default_factory=NetworkConfig, description="VPC settings.")
    cluster: ClusterSection = Field(description="EKS cluster and node groups.")
    autoscaling: AutoscalingConfig = Field(default_factory=AutoscalingConfig,
                                           description="Cluster Autoscaler for the GPU node groups.")
    nccl: NcclConfig = Field(default_factory=NcclConfig, description="NCCL transport.")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray, KubeRay and image.")
    storage: StorageConfig = Field(default_factory=StorageConfig, description="Checkpoint storage.")
    job: JobConfig = Field(default_factory=JobConfig, description="The fine-tuning job.")
    target: Target = Field(default="eks", description="Where Ray runs: eks (KubeRay on the EKS cluster) or ec2 "
                           "(Ray's cluster launcher on plain EC2, no Kubernetes; docs/ec2.md).")
    ec2: Ec2Config = Field(default_factory=Ec2Config, description="The EC2 target's head, access and idle timeout.")
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig,
                                               description="Metrics stack: Prometheus, Grafana, DCGM, dashboards.")
