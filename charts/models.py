"""Typed builders for the manifest fields this project sets.

Small frozen pydantic models, snake_case in Python and camelCase in the manifest, covering only
what the charts write: the pod-template pieces of a Ray pod and the KubeRay `ray.io/v1`
RayCluster and RayJob specs. `extra="forbid"` makes a misspelt keyword fail where it is
written; the synthesized objects are then validated against KubeRay's CRD schemas (see
`charts.validation`), which catches anything the models allow but the API server would prune.

Why not `cdk8s import`: for Python it generates about 7 MB of bindings per CRD (RayJob repeats
all of RayCluster's types), slow to import under jsii, for the few dozen fields used here.
"""

from __future__ import annotations

from typing import Any, Literal

from cdk8s import ApiObject, ApiObjectMetadata, JsonPatch
from constructs import Construct
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

RAY_API_VERSION = "ray.io/v1"


class K8sModel(BaseModel):
    """Base of every builder: frozen, no unknown keywords, camelCase on output."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, validate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        """The manifest fragment, camelCase keys, unset (None) fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ---- core/v1 pod pieces -------------------------------------------------------------------


class ObjectFieldSelector(K8sModel):
    """A field of the pod itself (Downward API), e.g. `spec.nodeName`."""

    field_path: str


class EnvVarSource(K8sModel):
    """Where an environment variable's value comes from when it is not a literal."""

    field_ref: ObjectFieldSelector


class EnvVar(K8sModel):
    """A container environment variable: a literal `value` or one read at start from `value_from`."""

    name: str
    value: str | None = None
    value_from: EnvVarSource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if (self.value is None) == (self.value_from is None):
            raise ValueError(f"env {self.name}: set exactly one of value and value_from")
        return self


class ResourceRequirements(K8sModel):
    """Container requests and limits (quantities as Kubernetes strings)."""

    requests: dict[str, str]
    limits: dict[str, str]


class VolumeMount(K8sModel):
    """Where a volume appears in a container."""

    name: str
    mount_path: str
    read_only: bool | None = None


class KeyToPath(K8sModel):
    """One ConfigMap key projected to a relative path under the mount point."""

    key: str
    path: str


class ConfigMapVolumeSource(K8sModel):
    """A ConfigMap volume that projects only the listed keys."""

    name: str
    items: list[KeyToPath]
    default_mode: int | None = None


class EmptyDirVolumeSource(K8sModel):
    """An emptyDir; medium "Memory" makes it tmpfs, counted against the pod's memory limit."""

    medium: Literal["", "Memory"] | None = None
    size_limit: str | None = None


class Volume(K8sModel):
    """A pod volume: a ConfigMap or an emptyDir."""

    name: str
    config_map: ConfigMapVolumeSource | None = None
    empty_dir: EmptyDirVolumeSource | None = None


class Capabilities(K8sModel):
    """Linux capabilities dropped from and added to a container (drop is applied first)."""

    drop: list[str] | None = None
    add: list[str] | None = None


class SeccompProfile(K8sModel):
    """The seccomp filter a container runs under."""

    type: Literal["RuntimeDefault", "Localhost", "Unconfined"]


class SecurityContext(K8sModel):
    """Container security context."""

    allow_privilege_escalation: bool | None = None
    capabilities: Capabilities | None = None
    seccomp_profile: SeccompProfile | None = None


class PodSecurityContext(K8sModel):
    """Pod security context: applies to every container, those KubeRay injects included."""

    seccomp_profile: SeccompProfile | None = None


class ExecAction(K8sModel):
    """A command run inside the container."""

    command: list[str]


class LifecycleHandler(K8sModel):
    """A lifecycle hook that runs a command."""

    exec_: ExecAction = Field(alias="exec")


class Lifecycle(K8sModel):
    """Container lifecycle hooks."""

    pre_stop: LifecycleHandler


class ContainerPort(K8sModel):
    """A named container port."""

    name: str
    container_port: int


class Container(K8sModel):
    """A container of a Ray pod."""

    name: str
    image: str
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"]
    working_dir: str | None = None
    env: list[EnvVar]
    ports: list[ContainerPort] | None = None
    resources: ResourceRequirements
    volume_mounts: list[VolumeMount]
    security_context: SecurityContext | None = None
    lifecycle: Lifecycle | None = None
    command: list[str] | None = None
    args: list[str] | None = None


class Toleration(K8sModel):
    """A toleration matching one node taint exactly (`toleration_seconds`: how long a NoExecute taint is
    tolerated before the pod is evicted)."""

    key: str
    operator: Literal["Equal", "Exists"]
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
    toleration_seconds: int | None = None


class PodSpec(K8sModel):
    """The pod spec of a Ray head or worker."""

    service_account_name: str
    automount_service_account_token: bool | None = None
    node_selector: dict[str, str]
    security_context: PodSecurityContext | None = None
    tolerations: list[Toleration] | None = None
    containers: list[Container]
    volumes: list[Volume]
    restart_policy: Literal["Always", "OnFailure", "Never"] | None = None
    active_deadline_seconds: int | None = Field(default=None, gt=0)


class TemplateMetadata(K8sModel):
    """Labels (and annotations) of a pod template."""

    labels: dict[str, str]
    annotations: dict[str, str] | None = None


class PodTemplateSpec(K8sModel):
    """A pod template (what KubeRay turns into head and worker pods)."""

    metadata: TemplateMetadata
    spec: PodSpec


# ---- ray.io/v1 -----------------------------------------------------------------------------


class HeadGroupSpec(K8sModel):
    """The Ray head: its `ray start` parameters, its Service and its pod template."""

    ray_start_params: dict[str, str]
    service_type: Literal["ClusterIP"]
    enable_ingress: Literal[False] = False
    template: PodTemplateSpec


class WorkerGroupSpec(K8sModel):
    """One Ray worker group (a fixed number of identical pods)."""

    group_name: str
    ray_start_params: dict[str, str]
    replicas: int = Field(ge=0)
    min_replicas: int = Field(ge=0)
    max_replicas: int = Field(ge=0)
    num_of_hosts: int = Field(default=1, ge=1)
    template: PodTemplateSpec


class AuthOptions(K8sModel):
    """Ray token authentication; with `mode: token` and no `secretName` the operator generates a random
    token in a Secret named after the RayCluster (key `auth_token`) and injects it into every Ray container."""

    mode: Literal["token", "disabled"]


class RayClusterSpec(K8sModel):
    """`RayCluster.spec` (also `RayJob.spec.rayClusterSpec`)."""

    ray_version: str
    auth_options: AuthOptions | None = None
    enable_in_tree_autoscaling: Literal[False] = False
    head_group_spec: HeadGroupSpec
    worker_group_specs: list[WorkerGroupSpec]


class SubmitterConfig(K8sModel):
    """`RayJob.spec.submitterConfig`: the K8sJobMode submitter Job's own retries."""

    backoff_limit: int = Field(ge=0)


class DeletionCondition(K8sModel):
    """When a deletion rule fires: the Ray job's status or the RayJob's deployment status (exactly one, as
    the CRD's CEL rules demand), `ttl_seconds` after the job ended."""

    job_status: Literal["SUCCEEDED", "FAILED"] | None = None
    job_deployment_status: Literal["Failed"] | None = None
    ttl_seconds: int = Field(ge=0)

    @model_validator(mode="after")
    def _exactly_one(self) -> DeletionCondition:
        if (self.job_status is None) == (self.job_deployment_status is None):
            raise ValueError("a deletion condition names exactly one of job_status and job_deployment_status")
        return self


class DeletionRule(K8sModel):
    """One `deletionStrategy.deletionRules` entry."""

    policy: Literal["DeleteWorkers", "DeleteCluster", "DeleteSelf", "DeleteNone"]
    condition: DeletionCondition


class DeletionStrategy(K8sModel):
    """`RayJob.spec.deletionStrategy` in rules mode (KubeRay 1.5+; the legacy onSuccess/onFailure pair is not used)."""

    deletion_rules: list[DeletionRule] = Field(min_length=1)


class RayJobSpec(K8sModel):
    """`RayJob.spec`: the job, its retries, deadlines and clean-up, and the cluster it creates."""

    entrypoint: str
    runtime_env_yaml: str | None = Field(default=None, alias="runtimeEnvYAML")
    submission_mode: Literal["K8sJobMode", "SidecarMode", "HTTPMode"]
    submitter_pod_template: PodTemplateSpec | None = None
    submitter_config: SubmitterConfig | None = None
    # Rules mode of deletionStrategy is incompatible with shutdownAfterJobFinishes and the global
    # ttlSecondsAfterFinished (KubeRay 1.7.0 utils/validation.go validateDeletionConfiguration).
    shutdown_after_job_finishes: bool | None = None
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    deletion_strategy: DeletionStrategy | None = None
    active_deadline_seconds: int = Field(gt=0)
    pre_running_deadline_seconds: int | None = Field(default=None, gt=0)
    backoff_limit: int = Field(ge=0)
    ray_cluster_spec: RayClusterSpec

    @model_validator(mode="after")
    def _one_deletion_mechanism(self) -> RayJobSpec:
        if self.deletion_strategy is not None and (self.shutdown_after_job_finishes or self.ttl_seconds_after_finished):
            raise ValueError("deletionStrategy rules exclude shutdownAfterJobFinishes and ttlSecondsAfterFinished")
        return self


# ---- cdk8s API objects ----------------------------------------------------------------------


class RayCluster(ApiObject):
    """A `ray.io/v1` RayCluster built from a typed spec."""

    def __init__(self, scope: Construct, id: str, *, metadata: ApiObjectMetadata, spec: RayClusterSpec) -> None:
        super().__init__(scope, id, api_version=RAY_API_VERSION, kind="RayCluster", metadata=metadata)
        self.add_json_patch(JsonPatch.add("/spec", spec.to_json()))


class RayJob(ApiObject):
    """A `ray.io/v1` RayJob built from a typed spec."""

    def __init__(self, scope: Construct, id: str, *, metadata: ApiObjectMetadata, spec: RayJobSpec) -> None:
        super().__init__(scope, id, api_version=RAY_API_VERSION, kind="RayJob", metadata=metadata)
        self.add_json_patch(JsonPatch.add("/spec", spec.to_json()))
