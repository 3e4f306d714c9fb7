"""The Ray cluster, from the variable file: one function builds the spec that both the standalone
RayCluster and the RayJob use, so the two cannot drift.

Every number comes from `ClusterConfig`'s derived values (pods, pod resources, world size);
node selectors and tolerations come from `config.k8s`, the module the CDK stacks label and taint
node groups with.
"""

from __future__ import annotations

import json

import yaml

from charts import bundle
from charts.models import (
    Capabilities,
    Container,
    ContainerPort,
    EmptyDirVolumeSource,
    EnvVar,
    EnvVarSource,
    ExecAction,
    HeadGroupSpec,
    Lifecycle,
    LifecycleHandler,
    ObjectFieldSelector,
    PodSpec,
    PodTemplateSpec,
    RayClusterSpec,
    RayJobSpec,
    ResourceRequirements,
    SecurityContext,
    TemplateMetadata,
    Toleration,
    Volume,
    VolumeMount,
    WorkerGroupSpec,
)
from config.k8s import (
    EFA_RESOURCE,
    GPU_RESOURCE,
    GPU_TAINT,
    HUGEPAGES_RESOURCE,
    NODE_NAME_ENV,
    system_node_labels,
    worker_pod_node_selector,
)
from config.model import ClusterConfig, PodResources, WorkerGroup

PART_OF_LABEL = "app.kubernetes.io/part-of"
CODE_VOLUME = "code"
SHM_VOLUME = "dshm"
# NCCL treats a leading '^' as "exclude every interface whose name starts with one of these".
# lo and docker are never routable between pods; pod-id-link0 is the EKS Pod Identity agent's
# link-local interface, and NCCL bootstrapping on it hangs the job at the first collective.
NCCL_SOCKET_IFNAME = "^lo,docker,pod-id-link0"
# aws-ofi-nccl releases up to 1.11 register their network as "AWS Libfabric"; later ones call it
# "Libfabric" but still accept this spelling. Naming it makes NCCL abort if the plugin is missing
# instead of falling back to TCP sockets and training at a fraction of the speed.
OFI_NCCL_NET = "AWS Libfabric"
# NCCL loads libnccl-net-<name>.so for NCCL_NET_PLUGIN=<name>; aws-ofi-nccl installs libnccl-net-ofi.so.
OFI_NCCL_PLUGIN = "ofi"
# Seconds between the Ray Train controller's polls of the worker group (Ray 2.58's default: 2.0).
# Each poll is when reported metrics and checkpoints are taken in, a failed worker is noticed and
# the end of the run is seen; and each worker's report queue holds one result, so a worker's next
# `ray.train.report()` waits until the poll has taken the previous one. The controller reads it
# from the job's environment (Ray Train propagates it from the driver).
RAY_TRAIN_HEALTH_CHECK_INTERVAL_S = "1.0"
# The caching allocator otherwise carves fixed-size segments: FSDP's all-gather buffers and the
# chunked loss's logits vary in size from call to call, and fragmentation then fails allocations
# well below the GPU's memory. Expandable segments grow and shrink one mapping instead.
GPU_ALLOCATOR_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def cluster_name(config: ClusterConfig) -> str:
    """Name of the standalone RayCluster (the EKS cluster's name)."""
    return config.cluster.name


def job_name(config: ClusterConfig) -> str:
    """Name of the RayJob; KubeRay caps RayJob names at 47 characters (cluster.name is at most 41)."""
    return f"{config.cluster.name}-job"


def labels(config: ClusterConfig) -> dict[str, str]:
    """Labels on every object and pod the charts create."""
    return {PART_OF_LABEL: config.cluster.name, "app.kubernetes.io/managed-by": "cdk8s"}


def code_configmap_name(config: ClusterConfig) -> str:
    """Name of the ConfigMap carrying the code bundle."""
    return f"{config.cluster.name}-code"


def job_env(config: ClusterConfig) -> dict[str, str]:
    """Environment of the job: where the variable file is, where checkpoints go, Ray Train's tuning.

    `CHECKPOINT_BUCKET` is empty when `storage.bucket_name` is null: the default name contains
    the AWS account id, which the workload gets from STS at run time (the pods' Pod Identity
    credentials, in `AWS_REGION`) and passes to `config.bucket_name` of the mounted variable file.
    """
    return {
        "CLUSTER_CONFIG": bundle.CONFIG_IN_POD,
        "CHECKPOINT_BUCKET": config.storage.bucket_name or "",
        "AWS_REGION": config.region,
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": RAY_TRAIN_HEALTH_CHECK_INTERVAL_S,
    }


def runtime_env(config: ClusterConfig) -> dict:
    """The Ray runtime environment of the job: extra pip packages (if any) and the job env."""
    env: dict = {}
    if config.ray.extra_pip_packages:
        env["pip"] = list(config.ray.extra_pip_packages)
    env["env_vars"] = job_env(config)
    return env


def transport_env(config: ClusterConfig, group: WorkerGroup) -> dict[str, str]:
    """NCCL / libfabric environment for the group's pods, by transport and hardware."""
    env = {"NCCL_DEBUG": config.nccl.debug, "NCCL_SOCKET_IFNAME": NCCL_SOCKET_IFNAME}
    if config.nccl.transport == "socket":
        env["NCCL_NET"] = "Socket"
        return env
    env.update({"FI_PROVIDER": "efa", "NCCL_NET_PLUGIN": OFI_NCCL_PLUGIN, "NCCL_NET": OFI_NCCL_NET})
    # Only p4d/p5-class EFA can DMA into GPU memory; on g5/g6 libfabric aborts when asked to.
    if group.gpudirect_rdma and config.instance(group).gpudirect_rdma:
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    return env


def _env(values: dict[str, str]) -> list[EnvVar]:
    node_name = EnvVar(name=NODE_NAME_ENV, value_from=EnvVarSource(field_ref=ObjectFieldSelector(
        field_path="spec.nodeName")))
    return [EnvVar(name=name, value=value) for name, value in values.items()] + [node_name]


def _ray_start_params(resources: PodResources, **params: str) -> dict[str, str]:
    # Explicit, so the object store sits in the pod's /dev/shm with room to spare (see PodResources).
    return {**params, "object-store-memory": str(resources.object_store_bytes)}


def _shm_volume(resources: PodResources) -> Volume:
    # Docker's 64 MiB default /dev/shm breaks NCCL's intra-node transport and the data loader, and
    # makes Ray put its object store in /tmp on the root disk.
    return Volume(name=SHM_VOLUME, empty_dir=EmptyDirVolumeSource(medium="Memory",
                                                                  size_limit=f"{resources.shm_gib}Gi"))


def _shm_mount() -> VolumeMount:
    return VolumeMount(name=SHM_VOLUME, mount_path="/dev/shm")


def _code_env(config: ClusterConfig) -> dict[str, str]:
    # The mount is read-only: without this every import tries (and fails) to write __pycache__.
    return {"PYTHONPATH": bundle.MOUNT_PATH, "PYTHONDONTWRITEBYTECODE": "1", **job_env(config)}


def _code_volume(config: ClusterConfig, code: bundle.CodeBundle) -> Volume:
    return Volume(name=CODE_VOLUME, config_map=code.volume_source(code_configmap_name(config)))


def _code_mount() -> VolumeMount:
    return VolumeMount(name=CODE_VOLUME, mount_path=bundle.MOUNT_PATH, read_only=True)


def head_group(config: ClusterConfig, code: bundle.CodeBundle) -> HeadGroupSpec:
    """The head: on a system node, no GPU, dashboard and GCS behind a ClusterIP Service only."""
    head = config.head_resources
    amount = {"cpu": str(head.cpu), "memory": f"{head.memory_gib}Gi"}
    env = {**_code_env(config), "NVIDIA_VISIBLE_DEVICES": "void"}  # the DLC's NVML probe fails on a CPU node
    container = Container(
        name="ray-head",
        image=config.ray.image,
        image_pull_policy="IfNotPresent",
        working_dir=bundle.MOUNT_PATH,
        env=_env(env),
        ports=[
            ContainerPort(name="gcs-server", container_port=6379),
            ContainerPort(name="dashboard", container_port=8265),
            ContainerPort(name="client", container_port=10001),
        ],
        resources=ResourceRequirements(requests=amount, limits=dict(amount)),
        volume_mounts=[_code_mount(), _shm_mount()],
    )
    spec = PodSpec(
        service_account_name=config.ray.service_account,
        node_selector=system_node_labels(),
        containers=[container],
        volumes=[_code_volume(config, code), _shm_volume(head)],
    )
    return HeadGroupSpec(
        ray_start_params=_ray_start_params(head, **{"num-gpus": "0", "dashboard-host": "0.0.0.0"}),
        service_type="ClusterIP",
        template=PodTemplateSpec(metadata=TemplateMetadata(labels=labels(config)), spec=spec),
    )


def worker_group(config: ClusterConfig, group: WorkerGroup, code: bundle.CodeBundle) -> WorkerGroupSpec:
    """One worker group: a fixed number of pods, each holding its share of a node's GPUs and EFA."""
    res = config.pod_resources[group.name]
    amount = {"cpu": str(res.cpu), "memory": f"{res.memory_gib}Gi", GPU_RESOURCE: str(res.gpus)}
    if res.efa_devices:
        amount[EFA_RESOURCE] = str(res.efa_devices)
    if res.hugepages_2mi_mib:
        # libfabric's EFA provider allocates its bounce buffers from 2 MiB huge pages.
        amount[HUGEPAGES_RESOURCE] = f"{res.hugepages_2mi_mib}Mi"
    container = Container(
        name="ray-worker",
        image=config.ray.image,
        image_pull_policy="IfNotPresent",
        working_dir=bundle.MOUNT_PATH,
        env=_env({**_code_env(config), **transport_env(config, group), **GPU_ALLOCATOR_ENV}),
        resources=ResourceRequirements(requests=amount, limits=dict(amount)),
        volume_mounts=[_code_mount(), _shm_mount()],
        # EFA registers (pins) memory with the device; without IPC_LOCK the memlock limit stops it.
        security_context=SecurityContext(capabilities=Capabilities(add=["IPC_LOCK"])),
        # Leave the Ray cluster cleanly so the head does not wait out a heartbeat timeout.
        lifecycle=Lifecycle(pre_stop=LifecycleHandler(exec_=ExecAction(command=["/bin/sh", "-c", "ray stop"]))),
    )
    spec = PodSpec(
        service_account_name=config.ray.service_account,
        node_selector=worker_pod_node_selector(group),
        tolerations=[Toleration(**GPU_TAINT.toleration())],
        containers=[container],
        volumes=[_code_volume(config, code), _shm_volume(res)],
    )
    pods = config.pods(group)
    return WorkerGroupSpec(
        group_name=group.name,
        ray_start_params=_ray_start_params(res),
        replicas=pods,
        min_replicas=pods,
        max_replicas=pods,
        template=PodTemplateSpec(metadata=TemplateMetadata(labels=labels(config)), spec=spec),
    )


def ray_cluster_spec(config: ClusterConfig, code: bundle.CodeBundle) -> RayClusterSpec:
    """The cluster spec shared by the RayCluster and the RayJob."""
    return RayClusterSpec(
        ray_version=config.ray.ray_version,
        head_group_spec=head_group(config, code),
        worker_group_specs=[worker_group(config, g, code) for g in config.cluster.worker_groups],
    )


def ray_job_spec(config: ClusterConfig, code: bundle.CodeBundle) -> RayJobSpec:
    """The RayJob: `job.sh` from the bundle on a fresh cluster, retried (each retry resumes), then torn down."""
    job = config.job
    return RayJobSpec(
        entrypoint=f"bash {bundle.MOUNT_PATH}/{bundle.JOB_SCRIPT}",
        runtime_env_yaml=yaml.safe_dump(runtime_env(config), sort_keys=False),
        shutdown_after_job_finishes=True,
        ttl_seconds_after_finished=round(job.ttl_hours * 3600),
        active_deadline_seconds=round(job.timeout_hours * 3600),
        backoff_limit=job.retries,
        ray_cluster_spec=ray_cluster_spec(config, code),
    )


def runtime_env_json(config: ClusterConfig) -> str:
    """The runtime environment as the JSON `ray job submit --runtime-env-json` takes."""
    return json.dumps(runtime_env(config), separators=(",", ":"))
