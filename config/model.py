"""Typed model of the variable file (`config/cluster.yaml`).

Every field carries a description with its unit; the README's reference table is generated
from these descriptions. Field-level checks live on the fields; rules that relate several
fields live in `ClusterConfig.cross_field_problems`, so the loader can report them all at once.
Derived values (pods per node, world size, pod resources, /dev/shm, hugepages, EFA devices)
are computed once, on first use, from the model and the instance catalog.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from config.catalog import InstanceType, load_catalog

# Packages the DLC image ships and the job depends on. Installing another version from the
# runtime env replaces the image's build (the walkthrough silently downgraded transformers).
PROTECTED_PACKAGES = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "ray",
        "transformers",
        "nvidia-nccl-cu12",
        "nvidia-nccl-cu13",
        "nccl",
        "aws-ofi-nccl",
        "libfabric",
        "triton",
        "flash-attn",
    }
)

# Images whose Ray version is known. A rayproject/ray:X.Y.Z tag is parsed instead.
KNOWN_IMAGES: dict[str, str] = {
    "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1": "2.58.0",
}

# kubelet reserves on EKS AMIs (the bootstrap formula): CPU in millicores by core band,
# memory 255 MiB + 11 MiB per schedulable pod, plus the 100 MiB hard eviction threshold.
_EVICTION_MIB = 100
# DaemonSets on every node (aws-node, kube-proxy, pod-identity agent, device plugins,
# CloudWatch agent): budgeted generously so a worker pod never sits Pending.
_DAEMONSET_CPU_M = 1000
_DAEMONSET_MEM_MIB = 2048
# The kernel and firmware keep part of the nominal memory: kubelet capacity is MemTotal.
_USABLE_MEMORY_FRACTION = 0.95
# System pods that share the head's node (CoreDNS, KubeRay operator, metrics).
_SYSTEM_PODS_CPU_M = 1000
_SYSTEM_PODS_MEM_MIB = 2048
# libfabric's EFA provider registers its bounce buffers in 2 MiB huge pages; the AWS EFA
# examples give each pod 5 GiB of them.
EFA_HUGEPAGES_MIB_PER_POD = 5120
# /dev/shm: NCCL's intra-node buffers and the data loader live there; memory-backed, it
# counts against the pod's memory limit, so a quarter of it, capped.
_SHM_FRACTION = 0.25
_SHM_CAP_GIB = 64
# Ray's object store lives in /dev/shm. Left to itself Ray sizes it at 30% of the pod's memory,
# capped at 95% of /dev/shm, which would leave NCCL's intra-node buffers and the data loader's
# shared tensors almost nothing; and where the object store does not fit, Ray puts it in /tmp on
# the root disk. Set explicitly: three quarters of /dev/shm, the rest left to NCCL.
_OBJECT_STORE_SHM_FRACTION = 0.75
# S3 bucket names are 3 to 63 characters.
S3_BUCKET_NAME_MAX = 63
# The derived bucket name carries the 12-digit account id, known only at deploy and run time.
_ACCOUNT_ID_CHARS = 12

EKS_CONTROL_PLANE_USD_PER_HOUR = 0.10
NAT_GATEWAY_USD_PER_HOUR = 0.045

_AZ_RE = re.compile(r"^(?P<region>[a-z]{2}(-gov)?-[a-z]+-\d)[a-z]$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=False)


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing wrong with a variable file: where (dotted path) and what to do."""

    path: str
    message: str


@dataclass(frozen=True, kw_only=True)
class PodResources:
    """Resources one Ray pod requests (and limits to) on a node of a group."""

    cpu: int
    """Whole CPUs per pod."""
    memory_gib: int
    """Memory per pod, GiB (excludes huge pages)."""
    shm_gib: int
    """Size of the memory-backed /dev/shm, GiB (part of the memory above)."""
    object_store_mib: int
    """Ray object store, MiB (`ray start --object-store-memory`; inside /dev/shm, with room left for NCCL)."""
    hugepages_2mi_mib: int
    """2 MiB huge pages per pod, MiB (0 without EFA)."""
    efa_devices: int
    """`vpc.amazonaws.com/efa` devices per pod (0 for socket transport)."""
    gpus: int
    """`nvidia.com/gpu` per pod."""

    @property
    def object_store_bytes(self) -> int:
        """The object store in bytes, as `ray start --object-store-memory` takes it."""
        return self.object_store_mib * 1024**2


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
    nodes: int = Field(description="Desired node count, nodes; also the Ray pods' node count.")
    min_nodes: int | None = Field(default=None, description="Node group minimum, nodes (default: nodes).")
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

    @property
    def effective_min(self) -> int:
        """Node group minimum size, nodes."""
        return self.nodes if self.min_nodes is None else self.min_nodes

    @property
    def effective_max(self) -> int:
        """Node group maximum size, nodes."""
        return self.nodes if self.max_nodes is None else self.max_nodes


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


class HeadConfig(_Strict):
    """The Ray head pod (on a system node; no GPU)."""

    cpu: int = Field(default=4, ge=1, description="Head CPUs (request = limit).")
    memory_gib: int = Field(default=16, ge=2, description="Head memory, GiB (request = limit).")


class RayConfig(_Strict):
    """Ray, KubeRay and the container image."""

    image: str = Field(
        default="public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1",
        description="Container image for head and workers, pinned by tag (never built here).",
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
    prepull_image: bool = Field(default=True, description="Pre-pull the image on GPU nodes with a DaemonSet.")

    @field_validator("image")
    @classmethod
    def _pinned(cls, value: str) -> str:
        name, _, tag = value.rpartition(":")
        if "@sha256:" in value:
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
    noncurrent_days: int = Field(
        default=7, ge=1, description="Days before superseded object versions are deleted, days."
    )
    checkpoint_expiry_days: int = Field(
        default=30, ge=1, description="Days before checkpoint objects under the prefix expire, days."
    )

    @property
    def checkpoint_prefix(self) -> str:
        """Key prefix of Ray Train's run directories (checkpoints); only these expire, never the exported model."""
        return f"{self.prefix}/checkpoints/"

    @property
    def export_prefix(self) -> str:
        """Key prefix of the exported Hugging Face model (kept; no lifecycle expiry)."""
        return f"{self.prefix}/models/"


class JobConfig(_Strict):
    """The fine-tuning job."""

    model: str = Field(default="Qwen/Qwen2.5-1.5B", description="Hugging Face model id or local/S3 path.")
    dataset: str = Field(
        default="yahma/alpaca-cleaned",
        description="Dataset: hub id, local path, s3:// path, or a .jsonl/.parquet file.",
    )
    dataset_split: str = Field(default="train", description="Dataset split to train on.")
    instruction_field: str = Field(default="instruction", description="Dataset column with the prompt.")
    response_field: str = Field(default="output", description="Dataset column with the answer.")
    input_field: str | None = Field(
        default=None, description="Optional dataset column appended to the prompt (Alpaca's `input`; None: none)."
    )
    eval_fraction: float = Field(
        default=0.01, ge=0, lt=0.5,
        description="Fraction held out from training (scored before/after in --local mode; 0: none).",
    )
    seq_len: int = Field(default=2048, gt=0, description="Packed sequence length, tokens.")
    micro_batch_size: int = Field(default=4, gt=0, description="Sequences per GPU per forward pass.")
    global_batch_size: int = Field(
        default=64, gt=0, description="Sequences per optimizer step across all GPUs (sets gradient accumulation)."
    )
    learning_rate: float = Field(default=2e-5, gt=0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    warmup_steps: int = Field(default=20, ge=0, description="Linear warm-up, optimizer steps.")
    max_steps: int = Field(default=500, gt=0, description="Optimizer steps to train.")
    grad_clip: float = Field(default=1.0, gt=0, description="Gradient-norm clip.")
    mask_prompt: bool = Field(default=True, description="Exclude prompt tokens from the loss.")
    checkpoint_every: int = Field(default=100, gt=0, description="Checkpoint interval, optimizer steps.")
    keep_checkpoints: int = Field(default=2, gt=0, description="Checkpoints kept by Ray.")
    report_every: int = Field(default=10, gt=0, description="Metrics report interval, optimizer steps.")
    max_failures: int = Field(default=3, ge=-1, description="Worker-group restarts before giving up (-1: unlimited).")
    activation_checkpointing: bool = Field(default=True, description="Recompute activations in backward.")
    compile: bool = Field(default=False, description="torch.compile each decoder layer and the chunked loss.")
    sharding: Literal["auto", "full", "hybrid"] = Field(
        default="auto",
        description=("FSDP2 sharding: full (one group over all ranks), hybrid (shard within a node, replicate "
                     "across nodes: only one gradient all-reduce per step crosses the network) or auto (hybrid "
                     "when the job spans several nodes of more than one rank each, else full)."),
    )
    reduce_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description=("Gradient reduction dtype on GPU: float32 (exact sums) or bfloat16 (half the gradient "
                     "traffic, sums rounded to 8 mantissa bits); CPU runs always reduce in float32."),
    )
    attn_implementation: Literal["flash_attention_2", "sdpa", "eager"] = Field(
        default="sdpa", description="Attention kernel (flash_attention_2 is in the DLC image)."
    )
    seed: int = Field(default=42, description="Seed for data order and initialisation.")
    run_name: str = Field(
        default="qwen2.5-1.5b-sft", pattern=r"^[A-Za-z0-9_.-]+$", description="Stable run name; a rerun resumes it."
    )
    timeout_hours: float = Field(default=12, gt=0, description="RayJob activeDeadlineSeconds, hours.")
    retries: int = Field(default=2, ge=0, description="RayJob backoffLimit: resubmissions (each resumes).")
    ttl_hours: float = Field(default=1, ge=0, description="Hours a finished RayJob's cluster is kept.")

    def batch_problems(self, world_size: int) -> list[tuple[str, str]]:
        """(field, message) for a batch that does not split across `world_size` ranks, or warm-up that eats
        the run; the loader checks the cluster's world size, the workload rechecks the one it runs with."""
        problems = []
        per_step = self.micro_batch_size * world_size
        if self.global_batch_size % per_step:
            problems.append(("global_batch_size", f"{self.global_batch_size} is not a multiple of micro_batch_size x "
                             f"world size = {self.micro_batch_size} x {world_size} = {per_step}; "
                             f"use a multiple of {per_step}"))
        if self.warmup_steps >= self.max_steps:
            problems.append(("warmup_steps", f"{self.warmup_steps} warm-up steps leave none of "
                             f"max_steps={self.max_steps}; lower job.warmup_steps"))
        return problems

    def grad_accumulation(self, world_size: int) -> int:
        """Micro-batches per optimizer step on each of `world_size` workers."""
        return self.global_batch_size // (self.micro_batch_size * world_size)


class ClusterConfig(_Strict):
    """The whole variable file: infrastructure, manifests and job derive from it."""

    region: str = Field(default="us-east-2", pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d$",
                        description="AWS region (one listed under `regions` in config/instances.yaml).")
    gpu_availability_zone: str = Field(
        default="us-east-2b",
        description="The one AZ all GPU nodes run in (cluster placement group); one of the region's AZs.",
    )
    network: NetworkConfig = Field(default_factory=NetworkConfig, description="VPC settings.")
    cluster: ClusterSection = Field(description="EKS cluster and node groups.")
    nccl: NcclConfig = Field(default_factory=NcclConfig, description="NCCL transport.")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray, KubeRay and image.")
    storage: StorageConfig = Field(default_factory=StorageConfig, description="Checkpoint storage.")
    job: JobConfig = Field(default_factory=JobConfig, description="The fine-tuning job.")

    # ---- cross-field rules -------------------------------------------------------------

    def cross_field_problems(self) -> list[Problem]:
        """Every rule that relates several fields, all checked, each naming the field and the fix."""
        problems: list[Problem] = []
        catalog = load_catalog()
        add = lambda path, message: problems.append(Problem(path=path, message=message))  # noqa: E731

        region_azs = catalog.availability_zones(self.region)
        if region_azs is None:
            add("region", f"{self.region} is not in config/instances.yaml's regions list; use one of "
                f"{sorted(catalog.regions)} or add it there with its AZ letters "
                f"(aws ec2 describe-availability-zones --region {self.region})")
        else:
            if self.gpu_availability_zone not in region_azs:
                az = _AZ_RE.fullmatch(self.gpu_availability_zone)
                what = "does not exist in" if az and az.group("region") == self.region else "is not an AZ of"
                add("gpu_availability_zone", f"'{self.gpu_availability_zone}' {what} region {self.region}; "
                    f"use one of {region_azs}")
            if self.network.max_azs > len(region_azs):
                add("network.max_azs", f"{self.network.max_azs} AZs, but {self.region} has {len(region_azs)} "
                    f"({region_azs}); set network.max_azs to at most {len(region_azs)}")

        problems.extend(self._kubectl_layer_problems())

        if self.storage.bucket_name is None:
            derived = len(self.bucket_name("0" * _ACCOUNT_ID_CHARS))
            if derived > S3_BUCKET_NAME_MAX:
                longest = len(self.cluster.name) - (derived - S3_BUCKET_NAME_MAX)
                add("cluster.name", f"the derived bucket name '{self.cluster.name}-ckpt-<12-digit account>-"
                    f"{self.region}' is {derived} characters, over S3's {S3_BUCKET_NAME_MAX}; shorten cluster.name "
                    f"to at most {longest} characters or set storage.bucket_name")

        if self.cluster.endpoint_access == "public" and self.cluster.public_access_cidrs != ["0.0.0.0/0"]:
            # A public-only endpoint cannot be narrowed: the kubectl provider that installs the Helm
            # charts runs outside the VPC and would be locked out.
            add("cluster.public_access_cidrs", "a public-only endpoint cannot be restricted to CIDRs; use "
                "endpoint_access: public_and_private (the installer reaches the API privately)")

        system = self.cluster.system_nodes
        system_type = catalog.get(system.instance_type)
        if system_type is None:
            add("cluster.system_nodes.instance_type", _unknown_type(system.instance_type))
        if system.nodes < 1:
            add("cluster.system_nodes.nodes", "must be at least 1; the Ray head runs there")
        if system_type is not None:
            cpu_m, mem_mib = _allocatable(system_type)
            cpu_m -= _SYSTEM_PODS_CPU_M
            mem_mib -= _SYSTEM_PODS_MEM_MIB
            head = self.ray.head
            if head.cpu * 1000 > cpu_m or head.memory_gib * 1024 > mem_mib:
                add("ray.head", f"head ({head.cpu} CPU, {head.memory_gib} GiB) does not fit a "
                    f"{system.instance_type} after system pods ({cpu_m // 1000} CPU, {mem_mib // 1024} GiB free); "
                    "lower ray.head or pick a larger cluster.system_nodes.instance_type")

        seen: set[str] = set()
        for i, group in enumerate(self.cluster.worker_groups):
            base = f"cluster.worker_groups.{i}"
            if group.name in seen:
                add(f"{base}.name", f"duplicate worker-group name '{group.name}'; give each group its own name")
            seen.add(group.name)
            problems.extend(self._group_problems(base, group))

        image_version = _image_ray_version(self.ray.image)
        if image_version is not None and image_version != self.ray.ray_version:
            add("ray.ray_version", f"{self.ray.ray_version} does not match the image, which ships Ray "
                f"{image_version}; set ray.ray_version: \"{image_version}\" or change ray.image")

        for j, requirement in enumerate(self.ray.extra_pip_packages):
            name = _requirement_name(requirement)
            if name in PROTECTED_PACKAGES:
                add(f"ray.extra_pip_packages.{j}", f"'{requirement}' would replace the image's {name}; "
                    "remove it (the image's torch/ray/transformers/NCCL stack is tested together)")

        # The world size is derivable only once the groups themselves are valid.
        groups_valid = not problems
        if groups_valid and self.job.sharding == "hybrid" and self.ranks_per_node is None:
            per_group = ", ".join(f"{g.name}: {self.instance(g).gpus}" for g in self.cluster.worker_groups)
            add("job.sharding", f"hybrid needs the same number of GPUs on every worker node (a 2-D mesh of equal "
                f"shard groups), but the worker groups differ ({per_group} GPUs per node); use sharding: full, "
                "or auto (which shards fully here)")
        for field, message in self.job.batch_problems(self.world_size if groups_valid else 1):
            if groups_valid or field != "global_batch_size":
                add(f"job.{field}", message)
        return problems

    def _kubectl_layer_problems(self) -> list[Problem]:
        """The stacks' kubectl provider needs the layer for exactly this Kubernetes minor.

        Checked only where the CDK library is installed (the deploy toolchain: `python -m config
        check`, `cdk synth`, `cdk8s synth`); the Ray pods load the same file to train and deploy
        nothing, and their image has no CDK.
        """
        cdk = importlib.util.find_spec("aws_cdk")  # finds the package without importing it (and jsii)
        if cdk is None:
            return []
        layer = kubectl_layer_module(self.cluster.kubernetes_version).rpartition(".")[2]
        if any((Path(location) / layer / "__init__.py").is_file() for location in cdk.submodule_search_locations or []):
            return []
        package = kubectl_layer_package(self.cluster.kubernetes_version)
        return [Problem(path="cluster.kubernetes_version", message=(
            f"no kubectl layer for Kubernetes {self.cluster.kubernetes_version} is installed; pin {package} in "
            f"requirements.txt and run `make setup`, or use a version whose layer is installed"))]

    def _group_problems(self, base: str, group: WorkerGroup) -> list[Problem]:
        problems: list[Problem] = []
        add = lambda path, message: problems.append(Problem(path=path, message=message))  # noqa: E731
        if group.nodes < 1:
            add(f"{base}.nodes", "must be at least 1")
        if group.min_nodes is not None and group.min_nodes < 0:
            add(f"{base}.min_nodes", "must be 0 or more")
        if group.effective_max < max(group.nodes, 1) or group.effective_min > group.nodes:
            add(f"{base}.max_nodes", "need min_nodes <= nodes <= max_nodes")
        if group.capacity == "capacity_block" and not group.capacity_reservation_id:
            add(f"{base}.capacity_reservation_id", "capacity_block needs the reservation id (cr-...)")
        if group.capacity_reservation_id and group.capacity != "capacity_block":
            add(f"{base}.capacity_reservation_id", "only used with capacity: capacity_block; remove it")
        itype = load_catalog().get(group.instance_type)
        if itype is None:
            add(f"{base}.instance_type", _unknown_type(group.instance_type))
            return problems
        if itype.gpus == 0:
            add(f"{base}.instance_type", f"{itype.name} has no GPU; pick a GPU type such as g6.12xlarge")
            return problems
        if group.gpus_per_pod < 1 or group.gpus_per_pod > itype.gpus:
            add(f"{base}.gpus_per_pod", f"{group.gpus_per_pod} is outside 1..{itype.gpus} "
                f"({itype.name} has {itype.gpus} GPUs); use a divisor of {itype.gpus}")
        elif itype.gpus % group.gpus_per_pod:
            add(f"{base}.gpus_per_pod", f"{group.gpus_per_pod} does not divide {itype.name}'s {itype.gpus} GPUs; "
                f"use one of {[d for d in range(1, itype.gpus + 1) if itype.gpus % d == 0]}")
        elif self.nccl.transport == "efa" and itype.has_efa:
            pods = itype.gpus // group.gpus_per_pod
            if itype.efa_interfaces % pods:
                add(f"{base}.gpus_per_pod", f"{pods} pods per {itype.name} cannot share its {itype.efa_interfaces} "
                    f"EFA interface(s) evenly; use gpus_per_pod: {itype.gpus}")
        if self.nccl.transport == "efa" and not itype.has_efa:
            add("nccl.transport", f"efa, but {base}.instance_type {itype.name} has no EFA (EFA needs e.g. "
                "g6.8xlarge or larger); use transport: socket or an EFA instance type")
        if group.gpudirect_rdma and not itype.gpudirect_rdma:
            add(f"{base}.gpudirect_rdma", f"{itype.name} has no GPUDirect RDMA (libfabric aborts with "
                "FI_EFA_USE_DEVICE_RDMA=1); set it to false")
        if group.gpudirect_rdma and self.nccl.transport != "efa":
            add(f"{base}.gpudirect_rdma", "GPUDirect RDMA needs nccl.transport: efa")
        return problems

    # ---- derived values (computed once) ---------------------------------------------------

    def instance(self, group: WorkerGroup) -> InstanceType:
        """Catalog entry for a worker group (valid after loading)."""
        return load_catalog().instances[group.instance_type]

    @cached_property
    def system_instance(self) -> InstanceType:
        """Catalog entry of the system node group."""
        return load_catalog().instances[self.cluster.system_nodes.instance_type]

    def pods_per_node(self, group: WorkerGroup) -> int:
        """Ray worker pods on each node of the group."""
        return self.instance(group).gpus // group.gpus_per_pod

    def pods(self, group: WorkerGroup) -> int:
        """Ray worker pods (replicas) in the group."""
        return group.nodes * self.pods_per_node(group)

    @cached_property
    def pod_resources(self) -> dict[str, PodResources]:
        """Per-pod resources for each worker group, by group name."""
        return {g.name: self._pod_resources(g) for g in self.cluster.worker_groups}

    def _pod_resources(self, group: WorkerGroup) -> PodResources:
        itype = self.instance(group)
        pods = self.pods_per_node(group)
        efa = self.nccl.transport == "efa"
        hugepages = EFA_HUGEPAGES_MIB_PER_POD if efa else 0
        cpu_m, mem_mib = _allocatable(itype)
        cpu = (cpu_m - _DAEMONSET_CPU_M) // pods // 1000
        mem_gib = (mem_mib - _DAEMONSET_MEM_MIB - hugepages * pods) // pods // 1024
        shm_gib = _shm_gib(mem_gib)
        return PodResources(
            cpu=cpu,
            memory_gib=mem_gib,
            shm_gib=shm_gib,
            object_store_mib=_object_store_mib(shm_gib),
            hugepages_2mi_mib=hugepages,
            efa_devices=itype.efa_interfaces // pods if efa else 0,
            gpus=group.gpus_per_pod,
        )

    @cached_property
    def head_resources(self) -> PodResources:
        """The Ray head pod: `ray.head`'s CPU and memory, a /dev/shm and object store sized like a worker's."""
        head = self.ray.head
        shm_gib = _shm_gib(head.memory_gib)
        return PodResources(cpu=head.cpu, memory_gib=head.memory_gib, shm_gib=shm_gib,
                            object_store_mib=_object_store_mib(shm_gib), hugepages_2mi_mib=0, efa_devices=0, gpus=0)

    @cached_property
    def availability_zones(self) -> list[str]:
        """VPC AZs: the GPU AZ first, then the region's other AZs in catalog order, `network.max_azs` in all."""
        others = [az for az in load_catalog().availability_zones(self.region) if az != self.gpu_availability_zone]
        return [self.gpu_availability_zone] + others[: self.network.max_azs - 1]

    @cached_property
    def world_size(self) -> int:
        """Ray Train workers, one per GPU, across all worker groups."""
        return sum(self.pods(g) * g.gpus_per_pod for g in self.cluster.worker_groups)

    @cached_property
    def ranks_per_node(self) -> int | None:
        """Ray Train workers (GPUs) on each worker node; None when the worker groups differ."""
        counts = {self.pods_per_node(g) * g.gpus_per_pod for g in self.cluster.worker_groups}
        return counts.pop() if len(counts) == 1 else None

    @cached_property
    def cpus_per_worker(self) -> int:
        """CPUs each Ray Train worker asks for (the smallest group's share, one CPU left for Ray)."""
        return max(1, min((self.pod_resources[g.name].cpu - 1) // g.gpus_per_pod for g in self.cluster.worker_groups))

    @cached_property
    def grad_accumulation(self) -> int:
        """Micro-batches per optimizer step on each worker."""
        return self.job.grad_accumulation(self.world_size)

    @cached_property
    def gpu_peak_tflops(self) -> float:
        """Dense bf16 peak per GPU of the first worker group, TFLOP/s (for MFU)."""
        return self.instance(self.cluster.worker_groups[0]).gpu_bf16_tflops

    def nvidia_nodes_hugepages(self, group: WorkerGroup) -> int:
        """2 MiB huge pages each node of the group must reserve (vm.nr_hugepages)."""
        return self.pod_resources[group.name].hugepages_2mi_mib * self.pods_per_node(group) // 2

    def bucket_name(self, account: str) -> str:
        """Checkpoint bucket name; `account` may be a CloudFormation token at deploy time."""
        return self.storage.bucket_name or f"{self.cluster.name}-ckpt-{account}-{self.region}"

    def checkpoint_uri(self, bucket: str) -> str:
        """Ray Train storage path: under the prefix the bucket's lifecycle rule expires."""
        return f"s3://{bucket}/{self.storage.checkpoint_prefix.rstrip('/')}"

    def export_uri(self, bucket: str) -> str:
        """Where the final Hugging Face model goes: under the prefix that never expires."""
        return f"s3://{bucket}/{self.storage.export_prefix}{self.job.run_name}"

    @cached_property
    def cost_per_hour(self) -> float:
        """On-demand cost of everything running, USD per hour (nodes, control plane, NAT)."""
        nodes = sum(self.instance(g).usd_per_hour * g.nodes for g in self.cluster.worker_groups)
        nodes += self.system_instance.usd_per_hour * self.cluster.system_nodes.nodes
        return nodes + EKS_CONTROL_PLANE_USD_PER_HOUR + NAT_GATEWAY_USD_PER_HOUR * self.network.nat_gateways


def _allocatable(itype: InstanceType) -> tuple[int, int]:
    """Node allocatable (millicores, MiB) after kubelet reserves, as the EKS bootstrap computes it."""
    cores = itype.vcpus
    reserved_m = 60 + (10 if cores > 1 else 0) + 5 * min(max(cores - 2, 0), 2) + 2.5 * max(cores - 4, 0)
    max_pods = 110 if cores < 30 else 250
    capacity_mib = int(itype.memory_gib * 1024 * _USABLE_MEMORY_FRACTION)
    mem_mib = capacity_mib - (255 + 11 * max_pods) - _EVICTION_MIB
    return int(cores * 1000 - reserved_m), mem_mib


def _shm_gib(memory_gib: int) -> int:
    """A pod's memory-backed /dev/shm, GiB: a quarter of its memory, capped, at least 1."""
    return max(1, min(_SHM_CAP_GIB, int(memory_gib * _SHM_FRACTION)))


def _object_store_mib(shm_gib: int) -> int:
    """Ray's object store inside a /dev/shm of `shm_gib` GiB, MiB."""
    return int(shm_gib * 1024 * _OBJECT_STORE_SHM_FRACTION)


def kubectl_layer_module(kubernetes_version: str) -> str:
    """The Python module of the CDK kubectl layer for exactly this Kubernetes minor version."""
    return f"aws_cdk.lambda_layer_kubectl_v{kubernetes_version.split('.')[1]}"


def kubectl_layer_package(kubernetes_version: str) -> str:
    """The pip distribution that provides `kubectl_layer_module(kubernetes_version)`."""
    return f"aws-cdk.lambda-layer-kubectl-v{kubernetes_version.split('.')[1]}"


def _unknown_type(name: str) -> str:
    return f"unknown instance type '{name}'; use one listed in config/instances.yaml"


def _image_ray_version(image: str) -> str | None:
    if image in KNOWN_IMAGES:
        return KNOWN_IMAGES[image]
    match = re.fullmatch(r"(docker\.io/)?rayproject/ray(-ml)?:(\d+\.\d+\.\d+).*", image)
    return match.group(3) if match else None


def _requirement_name(requirement: str) -> str:
    name = re.split(r"[\s<>=!~;\[@]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()
