"""Rules that relate several fields of the variable file, all checked so the loader reports them at once."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from config.base import Problem
from config.catalog import load_catalog
from config.cluster_fields import WorkerGroup
from config.ec2 import ec2_problems
from config.hints import did_you_mean
from config.hub import token_problems
from config.resources import _SYSTEM_PODS_CPU_M, _SYSTEM_PODS_MEM_MIB, _allocatable
from config.s3 import _ACCOUNT_ID_CHARS, S3_BUCKET_NAME_MAX
from config.subnets import PUBLIC_MASK, carve
from config.topology import with_logical_gpus
from config.versions import (
    RAY_TOKEN_AUTH_MIN,
    _image_ray_version,
    _version_tuple,
    kubectl_layer_module,
    kubectl_layer_package,
    pinned_autoscaler_minors,
)

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

_AZ_RE = re.compile(r"^(?P<region>[a-z]{2}(-gov)?-[a-z]+-\d)[a-z]$")


class RulesMixin:
    """`ClusterConfig.cross_field_problems` and its parts (needs the topology and the storage names)."""

    def cross_field_problems(self) -> list[Problem]:
        """Every rule that relates several fields, all checked, each naming the field and the fix."""
        problems: list[Problem] = []
        catalog = load_catalog()
        add = lambda path, message: problems.append(Problem(path=path, message=message))  # noqa: E731
        problems.extend(Problem(path=path, message=message) for path, message in ec2_problems(self))

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

        problems.extend(self._network_problems(region_azs))
        problems.extend(self._kubectl_layer_problems())
        problems.extend(Problem(path=f"observability.{field}", message=message) for field, message in
                        self.observability.problems(system_disk_gib=self.cluster.system_nodes.disk_gib))
        problems.extend(self._autoscaler_problems())

        if self.storage.bucket_name is None:
            derived = len(self.bucket_name("0" * _ACCOUNT_ID_CHARS))
            if derived > S3_BUCKET_NAME_MAX:
                longest = len(self.cluster.name) - (derived - S3_BUCKET_NAME_MAX)
                add("cluster.name", f"the derived bucket name '{self.cluster.name}-ckpt-<12-digit account>-"
                    f"{self.region}' is {derived} characters, over S3's {S3_BUCKET_NAME_MAX}; shorten cluster.name "
                    f"to at most {longest} characters or set storage.bucket_name")

        problems.extend(self._endpoint_problems())

        system = self.cluster.system_nodes
        system_type = catalog.get(system.instance_type)
        if system_type is None:
            add("cluster.system_nodes.instance_type", _unknown_type(system.instance_type, gpu=False))
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
        elif self.ray.auth == "token" and _version_tuple(self.ray.ray_version) < RAY_TOKEN_AUTH_MIN:
            add("ray.auth", f"token authentication needs Ray {'.'.join(map(str, RAY_TOKEN_AUTH_MIN))} or later "
                f"(ray.ray_version is {self.ray.ray_version}); use a newer image or set ray.auth: disabled")

        for j, requirement in enumerate(self.ray.extra_pip_packages):
            name = requirement_name(requirement)
            if name in PROTECTED_PACKAGES:
                add(f"ray.extra_pip_packages.{j}", f"'{requirement}' would replace the image's {name}; "
                    "remove it (the image's torch/ray/transformers/NCCL stack is tested together)")

        if round(self.job.timeout_hours * 3600) < 1:
            # charts/ray.py rounds it to whole seconds; KubeRay takes 0 as "no deadline" and refuses a negative.
            add("job.timeout_hours", f"{self.job.timeout_hours} hours rounds to 0 seconds of RayJob "
                "activeDeadlineSeconds; give at least 1/3600 hour (one second)")

        if self.job.watchdog and self.job.head_ready_minutes >= self.job.start_deadline_minutes:
            # The watchdog's head rule must act before KubeRay fails the attempt as PreRunningDeadlineExceeded and
            # retries it on a new cluster (workloads/watchdog.py `head_rule`). Without the watchdog (and on the EC2
            # target, which has none) nothing reads head_ready_minutes.
            add("job.head_ready_minutes", f"{self.job.head_ready_minutes:g} minutes is not below "
                f"job.start_deadline_minutes ({self.job.start_deadline_minutes:g}): KubeRay would fail and retry the "
                "attempt before the watchdog stops a head that never becomes Ready; lower job.head_ready_minutes or "
                "raise job.start_deadline_minutes")

        problems.extend(token_problems(self.job))

        # The world size is derivable only once the groups themselves are valid.
        groups_valid = not problems
        if groups_valid and self.job.sharding == "hybrid" and self.ranks_per_node is None:
            per_group = ", ".join(f"{g.name}: {self.instance(g).gpus}" for g in self.cluster.worker_groups)
            add("job.sharding", f"hybrid needs the same number of GPUs on every worker node (a 2-D mesh of equal "
                f"shard groups), but the worker groups differ ({per_group} GPUs per node); use sharding: full, "
                "or auto (which shards fully here)")
        crowded = [g for g in self.cluster.worker_groups if groups_valid and self.pods_per_node(g) > 1]
        if crowded and self.job.sharding == "hybrid" and sum(g.nodes for g in self.cluster.worker_groups) > 1:
            group = crowded[0]
            add("job.sharding", f"hybrid needs one pod per node, but {group.name} puts {self.pods_per_node(group)} "
                f"pods on each {group.instance_type}: Ray numbers workers pod by pod, so a shard group can span "
                f"nodes and the start-up placement check stops the job; set gpus_per_pod: "
                f"{self.instance(group).gpus} (one pod per node), or job.sharding: full or auto")
        for field, message in self.job.batch_problems(self.world_size if groups_valid else 1):
            if groups_valid or field != "global_batch_size":
                add(f"job.{field}", message)
        return problems

    def _network_problems(self, region_azs: list[str] | None) -> list[Problem]:
        """NAT gateways against AZs, and the subnets CDK carves from the VPC block (config/subnets.py)."""
        problems = []
        net = self.network
        if net.nat_gateways > net.max_azs:
            # aws-cdk-lib 2.275.0 aws-ec2/lib/vpc.js determineNatGatewayCount: min(natGateways, AZ count), silently.
            problems.append(Problem(path="network.nat_gateways", message=(
                f"{net.nat_gateways} NAT gateways over {net.max_azs} AZs: CDK makes at most one per AZ; set "
                f"network.nat_gateways to at most {net.max_azs} (network.max_azs)")))
        azs = min(net.max_azs, len(region_azs)) if region_azs else net.max_azs
        plan = carve(net.vpc_cidr, azs)
        if plan.problem:
            problems.append(Problem(path="network.vpc_cidr", message=(
                f"{net.vpc_cidr} is too small for {azs} AZs: a /{PUBLIC_MASK} public and a private subnet per AZ "
                f"{plan.problem}; use a larger block such as 10.0.0.0/16 or fewer network.max_azs")))
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

    def _endpoint_problems(self) -> list[Problem]:
        """Closed by default: the API endpoint is private unless the file names who may reach it, and the whole
        internet only with `endpoint_open_to_internet` (docs/security.md)."""
        section, path = self.cluster, "cluster.public_access_cidrs"
        cidrs = section.public_access_cidrs
        anywhere = [c for c in cidrs if c.endswith("/0")]
        if section.endpoint_access == "private":
            if cidrs:
                return [Problem(path=path, message=(
                    "endpoint_access is private, so no CIDR can reach the API from outside the VPC; remove them, or "
                    "set endpoint_access: public_and_private to let them in"))]
            return []
        if not cidrs:
            return [Problem(path=path, message=(
                f"endpoint_access: {section.endpoint_access} with no CIDRs; name who may reach the Kubernetes API, "
                "e.g. public_access_cidrs: [203.0.113.7/32] (your address: curl -s https://checkip.amazonaws.com), "
                "or set endpoint_access: private"))]
        if section.endpoint_access == "public" and cidrs != ["0.0.0.0/0"]:
            # A public-only endpoint cannot be narrowed: the kubectl provider that installs the Helm
            # charts runs outside the VPC and would be locked out.
            return [Problem(path=path, message=(
                "a public-only endpoint cannot be restricted to CIDRs; use endpoint_access: public_and_private "
                "(the installer reaches the API privately)"))]
        if anywhere and not section.endpoint_open_to_internet:
            return [Problem(path=path, message=(
                f"{anywhere[0]} opens the Kubernetes API endpoint to the whole internet; list your own CIDRs "
                "(e.g. 203.0.113.7/32), or set cluster.endpoint_open_to_internet: true to accept that"))]
        return []

    def _autoscaler_problems(self) -> list[Problem]:
        """The Cluster Autoscaler chart is pinned per Kubernetes minor in config/versions.py (the stacks install
        it from there); refuse a minor with no pin here instead of failing synthesis. Like the kubectl layer rule,
        checked only where the CDK is installed (the deploy toolchain), not in the Ray pods."""
        if importlib.util.find_spec("aws_cdk") is None:
            return []
        pinned = pinned_autoscaler_minors()
        version = self.cluster.kubernetes_version
        if not self.autoscaling.enabled or version in pinned:
            return []
        return [Problem(path="cluster.kubernetes_version", message=(
            f"no Cluster Autoscaler chart is pinned for Kubernetes {version} (pinned: {', '.join(pinned)}); add its "
            "chart to CLUSTER_AUTOSCALER_CHARTS in config/versions.py or set autoscaling.enabled: false"))]

    def _group_problems(self, base: str, group: WorkerGroup) -> list[Problem]:
        problems: list[Problem] = []
        add = lambda path, message: problems.append(Problem(path=path, message=message))  # noqa: E731
        if self.group_max(group) < max(group.nodes, 1) or self.group_min(group) > group.nodes:
            add(f"{base}.max_nodes", "need min_nodes <= nodes <= max_nodes")
        if group.capacity == "capacity_block" and not group.capacity_reservation_id:
            add(f"{base}.capacity_reservation_id", "capacity_block needs the reservation id (cr-...)")
        if group.capacity_reservation_id and group.capacity != "capacity_block":
            add(f"{base}.capacity_reservation_id", "only used with capacity: capacity_block; remove it")
        itype = load_catalog().get(group.instance_type)
        if itype is None:
            add(f"{base}.instance_type", _unknown_type(group.instance_type, gpu=True))
            return problems
        if group.logical_gpus is not None:
            if itype.gpus:
                add(f"{base}.logical_gpus", f"{itype.name} has {itype.gpus} real GPU(s); logical GPUs stand in for "
                    "GPUs only on a CPU instance type in a lab or test cluster (the workload then trains on CPU "
                    "with gloo); remove logical_gpus")
                return problems
            itype = with_logical_gpus(itype, group.logical_gpus)
        if itype.gpus == 0:
            add(f"{base}.instance_type", f"{itype.name} has no GPU; pick a GPU type such as g6.12xlarge (a lab on "
                "CPU nodes: logical_gpus)")
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


def _unknown_type(name: str, *, gpu: bool) -> str:
    instances = load_catalog().instances
    known = sorted(n for n, t in instances.items() if (t.gpus > 0) == gpu)
    return (f"unknown instance type '{name}'{did_you_mean(name, known)}; config/instances.yaml lists "
            f"{'GPU' if gpu else 'system'} types {', '.join(known)}")


def requirement_name(requirement: str) -> str:
    """The normalised distribution name of a pip requirement (`Foo_Bar[x]==1` -> `foo-bar`)."""
    name = re.split(r"[\s<>=!~;\[@]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()
