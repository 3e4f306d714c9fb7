"""The Ray cluster, from the variable file: one function builds the spec that both the standalone
RayCluster and the RayJob use, so the two cannot drift.

Every number comes from `ClusterConfig`'s derived values (pods, pod resources, world size);
node selectors and tolerations come from `config.k8s`, the module the CDK stacks label and taint
node groups with.
"""

from __future__ import annotations

import json
import re

import yaml

from charts import bundle
from charts.checkov import checkov_skips
from charts.models import (
    AuthOptions,
    Capabilities,
    Container,
    ContainerPort,
    DeletionCondition,
    DeletionRule,
    DeletionStrategy,
    EmptyDirVolumeSource,
    EnvVar,
    EnvVarSource,
    ExecAction,
    HeadGroupSpec,
    Lifecycle,
    LifecycleHandler,
    ObjectFieldSelector,
    PodSecurityContext,
    PodSpec,
    PodTemplateSpec,
    RayClusterSpec,
    RayJobSpec,
    ResourceRequirements,
    SeccompProfile,
    SecurityContext,
    SubmitterConfig,
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
from config.loader import REPO_ROOT
from config.model import ClusterConfig, PodResources, WorkerGroup, requirement_name
from config.observability import RAY_METRICS_PORT, RAY_METRICS_PORT_NAME
from config.topology import LOGICAL_GPU_RESOURCE

PART_OF_LABEL = "app.kubernetes.io/part-of"
OWNER_LABEL = "ray-efa.io/ray-owner"
"""Pod-template label: the RayCluster or RayJob whose Ray cluster the pod belongs to (its NetworkPolicy
selects by it; a RayJob's RayCluster gets a generated name, so `ray.io/cluster` cannot be known here)."""
DASHBOARD_PORT = bundle.DASHBOARD_PORT
EFA_CAPABILITIES = ["IPC_LOCK"]
"""Capabilities a worker keeps after dropping ALL: EFA registers (pins) memory with the device, and
without IPC_LOCK the container's memlock limit stops it. NCCL's ranks share one container, so its
intra-node CUDA IPC needs no SYS_PTRACE."""
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
# PyTorch's NCCL flight recorder: a ring buffer of the last collectives each rank issued (with
# their Python stacks), dumped to a file per rank when a collective times out
# (job.collective_timeout_minutes), so a hang says which rank stopped where. 2,000 entries are a
# few MB of host memory per rank. The dump goes to the Ray log folder, which `ray logs` and the
# dashboard already reach: <prefix><global rank>.
FLIGHT_RECORDER_ENV = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_FR_DUMP_TEMP_FILE": "/tmp/ray/session_latest/logs/nccl_flight_recorder_rank_",
}
# Packages the job imports that the image is not known to ship, by the setting that needs them;
# installed from the runtime env at the version requirements.txt pins (what the tests ran). The
# TensorBoard writer (tensorboardX) is a dependency of ray[train], so every Ray Train image has it.
MLFLOW_CLIENT = "mlflow-skinny"
# LoRA's adapters (job.method: lora); not in the image (aws/deep-learning-containers docker/ray-train/pyproject.toml).
PEFT = "peft"
REQUIREMENTS_FILE = REPO_ROOT / "requirements.txt"
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


def pinned_requirement(name: str) -> str:
    """`name==version` as requirements.txt pins it (KeyError naming the file when it is not pinned there)."""
    for line in REQUIREMENTS_FILE.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.\[\],-]+)==([^\s#;]+).*", line.strip())
        if match and requirement_name(match.group(1)) == requirement_name(name):
            return f"{name}=={match.group(2)}"
    raise KeyError(f"{REQUIREMENTS_FILE}: {name} is not pinned (name==version)")


def job_pip(config: ClusterConfig) -> list[str]:
    """pip requirements of the runtime env: `ray.extra_pip_packages`, then what the job's settings need.

    The MLflow client only when `job.mlflow_tracking_uri` is set, PEFT only when `job.method` is lora (each
    unless already listed): the default job installs nothing, so it starts without a pip step.
    """
    pip = list(config.ray.extra_pip_packages)
    listed = {requirement_name(r) for r in pip}
    if config.job.mlflow_tracking_uri and requirement_name(MLFLOW_CLIENT) not in listed:
        pip.append(pinned_requirement(MLFLOW_CLIENT))
    if config.job.method == "lora" and requirement_name(PEFT) not in listed:
        pip.append(pinned_requirement(PEFT))
    return pip


def runtime_env(config: ClusterConfig) -> dict:
    """The Ray runtime environment of the job: pip packages (if any) and the job env."""
    env: dict = {}
    pip = job_pip(config)
    if pip:
        env["pip"] = pip
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


def _ray_start_params(pod: PodResources, **params: str) -> dict[str, str]:
    # Explicit, so the object store sits in the pod's /dev/shm with room to spare (see PodResources).
    return {**params, "object-store-memory": str(pod.object_store_bytes)}


def _logical_gpu_param(group: WorkerGroup) -> dict[str, str]:
    # A lab's logical GPUs (`logical_gpus`): one Ray custom resource per GPU, which the CPU training workers ask
    # for (config.topology.LOGICAL_GPU_RESOURCE). KubeRay 1.7.0 reads and rewrites `resources` as single-quoted
    # JSON (common/pod.go `getResourcesMap`, `addWellKnownAcceleratorResources`) and passes it to `ray start`
    # as `--resources='{...}'` (`convertParamMap`).
    if group.logical_gpus is None:
        return {}
    return {"resources": "'" + json.dumps({LOGICAL_GPU_RESOURCE: group.logical_gpus}) + "'"}


def _metrics_start_param() -> dict[str, str]:
    # KubeRay passes --metrics-export-port=8080 by default too; named here so the PodMonitor and the
    # NetworkPolicy (charts.monitoring, charts.policy) and the pods agree by construction.
    return {"metrics-export-port": str(RAY_METRICS_PORT)}


def _metrics_port() -> ContainerPort:
    """The Ray node's metrics agent: what Prometheus scrapes (`config.observability`)."""
    return ContainerPort(name=RAY_METRICS_PORT_NAME, container_port=RAY_METRICS_PORT)


def _shm_volume(resources: PodResources) -> Volume:
    # Docker's 64 MiB default /dev/shm breaks NCCL's intra-node transport and the data loader, and
    # makes Ray put its object store in /tmp on the root disk.
    return Volume(name=SHM_VOLUME, empty_dir=EmptyDirVolumeSource(medium="Memory",
                                                                  size_limit=f"{resources.shm_gib}Gi"))


def _shm_mount() -> VolumeMount:
    return VolumeMount(name=SHM_VOLUME, mount_path="/dev/shm")


def _code_env(config: ClusterConfig) -> dict[str, str]:
    # The mount is read-only: without this every import tries (and fails) to write __pycache__.
    return {"PYTHONPATH": bundle.MOUNT_PATH, "PYTHONDONTWRITEBYTECODE": "1", **job_env(config),
            **FLIGHT_RECORDER_ENV}


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
            ContainerPort(name="dashboard", container_port=DASHBOARD_PORT),
            ContainerPort(name="client", container_port=10001),
            _metrics_port(),
        ],
        resources=ResourceRequirements(requests=amount, limits=dict(amount)),
        volume_mounts=[_code_mount(), _shm_mount()],
        security_context=container_security_context(),
    )
    spec = PodSpec(
        service_account_name=config.ray.service_account,
        automount_service_account_token=False,  # Pod Identity projects its own token; Ray never calls the API
        node_selector=system_node_labels(),
        security_context=pod_security_context(),
        containers=[container],
        volumes=[_code_volume(config, code), _shm_volume(head)],
    )
    return HeadGroupSpec(
        ray_start_params=_ray_start_params(head, **{"num-gpus": "0", "dashboard-host": "0.0.0.0",
                                                    **_metrics_start_param()}),
        service_type="ClusterIP",
        template=PodTemplateSpec(metadata=TemplateMetadata(labels=labels(config)), spec=spec),
    )


NODE_LOST_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
"""The NoExecute taints the node lifecycle controller puts on a node that stops reporting (kubernetes
pkg/controller/nodelifecycle, `TaintNodesByCondition`)."""


def node_lost_tolerations(config: ClusterConfig) -> list[Toleration]:
    """A GPU worker leaves a lost node after `autoscaling.node_lost_seconds`, not the 300 s that Kubernetes'
    DefaultTolerationSeconds admission plugin adds to a pod that names no such toleration
    (plugin/pkg/admission/defaulttolerationseconds: `--default-not-ready-toleration-seconds` and
    `--default-unreachable-toleration-seconds`, 300). The rest of the job's GPU nodes wait idle for a replacement
    meanwhile; the watchdog then force-deletes the evicted pod that no kubelet confirms (`workloads.watchdog`
    `node_lost_rule`), so KubeRay creates its replacement."""
    seconds = config.autoscaling.node_lost_seconds
    return [Toleration(key=key, operator="Exists", effect="NoExecute", toleration_seconds=seconds)
            for key in NODE_LOST_TAINTS]


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
        ports=[_metrics_port()],
        resources=ResourceRequirements(requests=amount, limits=dict(amount)),
        volume_mounts=[_code_mount(), _shm_mount()],
        security_context=container_security_context(add=EFA_CAPABILITIES),
        # Leave the Ray cluster cleanly so the head does not wait out a heartbeat timeout.
        lifecycle=Lifecycle(pre_stop=LifecycleHandler(exec_=ExecAction(command=["/bin/sh", "-c", "ray stop"]))),
    )
    spec = PodSpec(
        service_account_name=config.ray.service_account,
        automount_service_account_token=False,
        node_selector=worker_pod_node_selector(group),
        security_context=pod_security_context(),
        tolerations=[Toleration(**GPU_TAINT.toleration()), *node_lost_tolerations(config)],
        containers=[container],
        volumes=[_code_volume(config, code), _shm_volume(res)],
    )
    pods = config.pods(group)
    return WorkerGroupSpec(
        group_name=group.name,
        ray_start_params=_ray_start_params(res, **{**_metrics_start_param(), **_logical_gpu_param(group)}),
        replicas=pods,
        min_replicas=pods,
        max_replicas=pods,
        template=PodTemplateSpec(metadata=TemplateMetadata(labels=labels(config)), spec=spec),
    )


def container_security_context(add: list[str] | None = None) -> SecurityContext:
    """A Ray container's security context: every capability dropped but `add`, no privilege escalation.

    Not `runAsNonRoot` or a read-only root filesystem: the DLC image runs Ray as root and writes
    /tmp/ray and the runtime env's pip installs into the image's own tree.
    """
    return SecurityContext(allow_privilege_escalation=False, seccomp_profile=SeccompProfile(type="RuntimeDefault"),
                           capabilities=Capabilities(drop=["ALL"], add=add or None))


def pod_security_context() -> PodSecurityContext:
    """Pod-level seccomp RuntimeDefault, so the containers KubeRay injects (wait-gcs-ready, a sidecar
    submitter) run under it too."""
    return PodSecurityContext(seccomp_profile=SeccompProfile(type="RuntimeDefault"))


# checkov findings on the Ray pods that this design needs, acknowledged on each pod template.
RAY_POD_CHECKOV_SKIPS = {
    # KubeRay 1.7.0 gives a Ray >= 2.53 container HTTP probes, GET :52365/api/healthz on the dashboard agent
    # (common/pod.go `initLivenessAndReadinessProbe`, `supportsUnifiedHealthCheck`; utils/constant.go
    # `RayNodeHealthPath`), no longer the wget exec probes of older Ray; seen on the real node (make cluster-real).
    "CKV_K8S_8": "KubeRay adds its own HTTP liveness probe (GET :52365/api/healthz) to every Ray container",
    "CKV_K8S_9": "KubeRay adds its own HTTP readiness probe (GET :52365/api/healthz) to every Ray container",
    "CKV_K8S_15": "IfNotPresent on purpose: a multi-GB image, pinned and pre-pulled on every GPU node",
    "CKV_K8S_22": "Ray writes its session dir under /tmp and the runtime env installs pip packages into the image",
    "CKV_K8S_23": "the DLC image runs Ray as root (its Python stack lives in root-owned paths); caps are dropped",
    "CKV_K8S_40": "the DLC image runs Ray as root (its Python stack lives in root-owned paths); caps are dropped",
}
CHECKOV_ADDED_CAPABILITY = ("CKV_K8S_25", "IPC_LOCK only: EFA pins memory with the device (memlock)")
CHECKOV_TAG = ("CKV_K8S_43", "pinned by tag in ray.image; pin a digest (repo@sha256:...) for production")


def finish_template(config: ClusterConfig, template: PodTemplateSpec, owner: str) -> PodTemplateSpec:
    """`template` with the owner label (see `OWNER_LABEL`) and its checkov acknowledgments added."""
    skips = dict(RAY_POD_CHECKOV_SKIPS)
    if any(c.security_context and c.security_context.capabilities and c.security_context.capabilities.add
           for c in template.spec.containers):
        skips.update([CHECKOV_ADDED_CAPABILITY])
    if not config.ray.image_by_digest:
        skips.update([CHECKOV_TAG])
    metadata = TemplateMetadata(labels={**template.metadata.labels, OWNER_LABEL: owner},
                                annotations={**(template.metadata.annotations or {}), **checkov_skips(skips)})
    return template.model_copy(update={"metadata": metadata})


def ray_cluster_spec(config: ClusterConfig, code: bundle.CodeBundle, *, owner: str) -> RayClusterSpec:
    """The cluster spec shared by the RayCluster and the RayJob; `owner` names the object it is in."""
    head = head_group(config, code)
    workers = [worker_group(config, g, code) for g in config.cluster.worker_groups]
    return RayClusterSpec(
        ray_version=config.ray.ray_version,
        auth_options=AuthOptions(mode=config.ray.auth),
        head_group_spec=head.model_copy(update={"template": finish_template(config, head.template, owner)}),
        worker_group_specs=[w.model_copy(update={"template": finish_template(config, w.template, owner)})
                            for w in workers],
    )


SUBMITTER_CONTAINER = "ray-job-submitter"
SUBMITTER_RESOURCES = {"cpu": "500m", "memory": "1Gi"}  # the Ray CLI only: submit, then stream a log
SUBMITTER_BACKOFF_LIMIT = 6
"""Submitter pod restarts (K8s Job backoffLimit) before the RayJob fails as SubmissionFailed.

follow.sh itself re-attaches to a dropped log stream; a pod restart is for the pod lost with its
node (a system node replaced) or an image pull that failed. The Job's back-off (10 s doubling,
kubernetes batch/v1 Job semantics) makes six restarts span about ten minutes."""


def submitter_template(config: ClusterConfig, code: bundle.CodeBundle) -> PodTemplateSpec:
    """The K8sJobMode submitter pod: `follow.sh` on the Ray image (pre-pulled on every node) on a system node.

    KubeRay 1.7.0 keeps our command (rayjob_controller.go `configureSubmitterContainer`: the default
    is used only when the container has none) and adds RAY_DASHBOARD_ADDRESS, RAY_JOB_SUBMISSION_ID
    and, with token auth, the token variables; it puts the template in a batch/v1 Job with
    `submitterConfig.backoffLimit` (`createNewK8sJob`). The pod's own activeDeadlineSeconds bounds it
    by `job.timeout_hours` even if the RayJob is gone.
    """
    container = Container(
        name=SUBMITTER_CONTAINER,
        image=config.ray.image,
        image_pull_policy="IfNotPresent",
        working_dir=bundle.MOUNT_PATH,
        env=_env({}),
        command=["bash", f"{bundle.MOUNT_PATH}/{bundle.FOLLOW_SCRIPT}"],
        resources=ResourceRequirements(requests=dict(SUBMITTER_RESOURCES), limits=dict(SUBMITTER_RESOURCES)),
        volume_mounts=[_code_mount()],
        security_context=container_security_context(),
    )
    spec = PodSpec(
        service_account_name=config.ray.service_account,
        automount_service_account_token=False,
        node_selector=system_node_labels(),
        security_context=pod_security_context(),
        containers=[container],
        volumes=[_code_volume(config, code)],
        restart_policy="Never",  # the Job makes a new pod on failure (its backoffLimit counts them)
        active_deadline_seconds=round(config.job.timeout_hours * 3600),
    )
    return PodTemplateSpec(metadata=TemplateMetadata(labels=labels(config)), spec=spec)


def deletion_rules(config: ClusterConfig) -> DeletionStrategy:
    """GPU workers go as soon as the job ends; the head (dashboard, logs) `job.ttl_hours` later.

    KubeRay 1.7.0 (rayjob_controller.go `handleDeletionRules`) runs, once the RayJob is Complete or
    Failed for good (a failure that will be retried goes to Retrying instead and never reaches the
    rules: `checkBackoffLimitAndUpdateStatusIfNeeded`), every rule whose condition matches, each
    `ttlSeconds` after `status.endTime`. DeleteWorkers suspends the worker groups (`suspendWorkerGroups`),
    so the GPU pods go and the cluster autoscaler removes their nodes after
    `autoscaling.scale_down_minutes`; DeleteCluster then deletes the RayCluster (head included) and
    leaves the submitter Job, whose pod log is the driver's output. The CRD allows conditions on
    `jobStatus` SUCCEEDED/FAILED and on `jobDeploymentStatus` Failed (ray.io_rayjobs.yaml, 1.7.0); the
    last covers failures where the Ray job never ran or never ended (PreRunningDeadlineExceeded,
    DeadlineExceeded, SubmissionFailed). validateDeletionRules requires DeleteWorkers' TTL <= DeleteCluster's.
    """
    ttl = round(config.job.ttl_hours * 3600)
    rules = []
    for condition in ({"job_status": "SUCCEEDED"}, {"job_status": "FAILED"}, {"job_deployment_status": "Failed"}):
        rules.append(DeletionRule(policy="DeleteWorkers", condition=DeletionCondition(**condition, ttl_seconds=0)))
        rules.append(DeletionRule(policy="DeleteCluster", condition=DeletionCondition(**condition, ttl_seconds=ttl)))
    return DeletionStrategy(deletion_rules=rules)


def ray_job_spec(config: ClusterConfig, code: bundle.CodeBundle) -> RayJobSpec:
    """The RayJob: `job.sh` from the bundle on a fresh cluster, retried (each retry resumes), then cleaned up.

    K8sJobMode with our own submitter (`follow.sh`, see `submitter_template`), not SidecarMode: in
    SidecarMode KubeRay 1.7.0 sets the head pod's restartPolicy to Never (rayjob_controller.go
    `constructRayClusterForRayJob`), so once the sidecar exits the head stays not-Ready, and a job
    that failed before the cluster was Ready waited in Initializing until activeDeadlineSeconds
    (kuberay#4945); and a dropped log stream failed a healthy job (kuberay#4285, #4921). Not HTTPMode:
    it has no submitter pod, so no driver log survives the cluster, and `workloads.verify` reads the
    preflight result from that log.
    Deadlines: `preRunningDeadlineSeconds` (`job.start_deadline_minutes`) fails an attempt whose
    cluster is not Ready in time (no GPU capacity, quota) with reason PreRunningDeadlineExceeded;
    `activeDeadlineSeconds` (`job.timeout_hours`) fails it with DeadlineExceeded, which KubeRay never
    retries. Both count from `status.startTime`, which KubeRay resets at every retry
    (`initRayJobStatusIfNeed`), so the driver also enforces `job.timeout_hours` across attempts
    (`workloads.fsdp_finetune.deadline`).
    """
    job = config.job
    return RayJobSpec(
        entrypoint=f"bash {bundle.MOUNT_PATH}/{bundle.JOB_SCRIPT}",
        runtime_env_yaml=yaml.safe_dump(runtime_env(config), sort_keys=False),
        submission_mode="K8sJobMode",
        submitter_pod_template=finish_template(config, submitter_template(config, code), job_name(config)),
        submitter_config=SubmitterConfig(backoff_limit=SUBMITTER_BACKOFF_LIMIT),
        deletion_strategy=deletion_rules(config),
        active_deadline_seconds=round(job.timeout_hours * 3600),
        pre_running_deadline_seconds=round(job.start_deadline_minutes * 60),
        backoff_limit=job.retries,
        ray_cluster_spec=ray_cluster_spec(config, code, owner=job_name(config)),
    )


def runtime_env_json(config: ClusterConfig) -> str:
    """The runtime environment as the JSON `ray job submit --runtime-env-json` takes."""
    return json.dumps(runtime_env(config), separators=(",", ":"))
