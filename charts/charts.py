"""The cdk8s charts (one manifest file each) and the reusable constructs they are made of.

- `ray-base`: Namespace, the Ray service account (bound to the checkpoint bucket by the stacks'
  Pod Identity association), the code ConfigMap and, optionally, the image pre-pull DaemonSet.
- `ray-cluster`: a standalone RayCluster to submit jobs to, and its NetworkPolicy.
- `ray-job`: a RayJob that creates the same cluster (same function), runs the job and tears down,
  and the NetworkPolicy of that cluster.
- `ray-watchdog` (with `job.watchdog`): the pod that bounds the failures KubeRay 1.7.0 leaves holding GPU nodes
  (`charts.watchdog`, `workloads.watchdog`).
- `dashboards` (with `observability.enabled`): the Grafana dashboards as ConfigMaps; the cluster
  and job charts then also carry their Ray pods' PodMonitor (`charts.monitoring`).

Apply `ray-base` first, then `ray-watchdog`, then either `ray-cluster` or `ray-job`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cdk8s
import cdk8s_plus_27 as kplus
from constructs import Construct

from charts import bundle, monitoring, policy, ray, watchdog
from charts.checkov import checkov_skips
from charts.models import RayCluster, RayJob
from config.cli import provenance
from config.k8s import GPU_TAINT
from config.loader import REPO_ROOT
from config.model import ClusterConfig

CONFIG_FILE_ANNOTATION = "ray-efa.io/config-file"
CONFIG_SHA256_ANNOTATION = "ray-efa.io/config-sha256"
BASE_CHART = "ray-base"
CLUSTER_CHART = "ray-cluster"
JOB_CHART = "ray-job"
DASHBOARDS_CHART = "dashboards"


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """What every chart is built from: the loaded variable file, its path and the code bundle."""

    config: ClusterConfig
    config_file: Path
    code: bundle.CodeBundle


def inputs(config: ClusterConfig, config_file: Path | str, *, repo_root: Path = REPO_ROOT) -> Inputs:
    """Read the code bundle for `config` (raises `ChartError` if it cannot be a ConfigMap)."""
    code = bundle.collect(Path(config_file), config=config, runtime_env_json=ray.runtime_env_json(config),
                          repo_root=repo_root)
    return Inputs(config=config, config_file=Path(config_file), code=code)


def _metadata(config: ClusterConfig, name: str, *, namespaced: bool = True,
              annotations: dict[str, str] | None = None) -> cdk8s.ApiObjectMetadata:
    return cdk8s.ApiObjectMetadata(name=name, namespace=config.ray.namespace if namespaced else None,
                                   labels=ray.labels(config), annotations=annotations)


def prepull_pod_labels(config: ClusterConfig) -> dict[str, str]:
    """Labels of the image pre-pull pods (their NetworkPolicy selects them by these)."""
    return {**ray.labels(config), "app.kubernetes.io/component": "image-prepull"}


class CodeConfigMap(Construct):
    """The ConfigMap carrying the project's code and variable file (see `charts.bundle`)."""

    def __init__(self, scope: Construct, id: str, *, config: ClusterConfig, code: bundle.CodeBundle) -> None:
        super().__init__(scope, id)
        self.config_map = kplus.ConfigMap(
            self, "ConfigMap", metadata=_metadata(config, ray.code_configmap_name(config)), data=code.data)


class ImagePrepull(Construct):
    """A DaemonSet that pulls the (many-GB) Ray image onto every node as soon as it joins.

    Every node: the GPU nodes run the workers, and the system nodes run the Ray head (and, with
    the RayJob's SidecarMode, its submitter), so a head scheduled there starts from a warm image too.
    No node selector; it tolerates the GPU taint, the only taint in the cluster.

    The init container pulls the image; the main container then keeps running from the same
    image, which stops the kubelet's image garbage collection from deleting it again.
    """

    def __init__(self, scope: Construct, id: str, *, config: ClusterConfig) -> None:
        super().__init__(scope, id)
        tiny = kplus.ContainerResources(
            cpu=kplus.CpuResources(request=kplus.Cpu.millis(10), limit=kplus.Cpu.millis(100)),
            memory=kplus.MemoryResources(request=cdk8s.Size.mebibytes(16), limit=cdk8s.Size.mebibytes(64)),
        )
        # The image's default user may be root, which runAsNonRoot refuses: run `true`/`sleep` as nobody.
        nobody = kplus.ContainerSecurityContextProps(user=65534, group=65534, ensure_non_root=True,
                                                     read_only_root_filesystem=True, allow_privilege_escalation=False)
        common = dict(image=config.ray.image, image_pull_policy=kplus.ImagePullPolicy.IF_NOT_PRESENT, resources=tiny,
                      security_context=nobody)
        name = f"{config.cluster.name}-image-prepull"
        self.daemon_set = kplus.DaemonSet(
            self, "DaemonSet",
            metadata=_metadata(config, name, annotations=checkov_skips(self.checkov_reasons(config))),
            pod_metadata=cdk8s.ApiObjectMetadata(labels=prepull_pod_labels(config)),
            init_containers=[kplus.ContainerProps(name="pull", command=["true"], **common)],
            containers=[kplus.ContainerProps(name="hold", command=["sleep", "infinity"], **common)],
            automount_service_account_token=False,
            # `sleep` ignores SIGTERM as PID 1; do not hold a node drain for 30 s.
            termination_grace_period=cdk8s.Duration.seconds(2),
        )
        self.daemon_set.scheduling.tolerate(kplus.Node.tainted(kplus.NodeTaintQuery.is_(
            GPU_TAINT.key, GPU_TAINT.value, effect=kplus.TaintEffect[GPU_TAINT.cfn_effect])))
        cdk8s.ApiObject.of(self.daemon_set).add_json_patch(
            cdk8s.JsonPatch.add("/spec/template/spec/securityContext/seccompProfile", {"type": "RuntimeDefault"}),
            # cdk8s-plus 27 has no name for "ALL" among its capabilities.
            *(cdk8s.JsonPatch.add(f"/spec/template/spec/{kind}/0/securityContext/capabilities", {"drop": ["ALL"]})
              for kind in ("initContainers", "containers")))
        # The pods serve nothing: a policy that selects them and admits no traffic.
        self.network_policy = cdk8s.ApiObject(
            self, "NetworkPolicy", api_version=policy.API_VERSION, kind="NetworkPolicy",
            metadata=_metadata(config, name))
        self.network_policy.add_json_patch(cdk8s.JsonPatch.add("/spec", policy.deny_ingress_spec(
            prepull_pod_labels(config))))

    @staticmethod
    def checkov_reasons(config: ClusterConfig) -> dict[str, str]:
        """checkov findings this DaemonSet's design needs, and why."""
        reasons = {
            "CKV_K8S_8": "runs `sleep infinity` to hold the image on the node; there is nothing to probe",
            "CKV_K8S_9": "runs `sleep infinity` to hold the image on the node; there is nothing to probe",
            "CKV_K8S_15": "IfNotPresent on purpose: it exists to keep the pinned image cached on the node",
        }
        if not config.ray.image_by_digest:
            reasons.update([ray.CHECKOV_TAG])
        return reasons


class RayBaseChart(cdk8s.Chart):
    """Namespace, service account, code ConfigMap and (optionally) the image pre-pull DaemonSet."""

    def __init__(self, scope: Construct, id: str, *, inputs: Inputs) -> None:
        super().__init__(scope, id)
        config = inputs.config
        self.ray_namespace = kplus.Namespace(self, "Namespace", metadata=_metadata(config, config.ray.namespace,
                                                                               namespaced=False))
        self.service_account = kplus.ServiceAccount(
            self, "ServiceAccount", metadata=_metadata(config, config.ray.service_account),
            # Ray pods never call the Kubernetes API; Pod Identity uses its own projected token.
            automount_token=False,
        )
        self.code = CodeConfigMap(self, "Code", config=config, code=inputs.code)
        for construct in (self.service_account, self.code.config_map):
            construct.node.add_dependency(self.ray_namespace)
        self.prepull = ImagePrepull(self, "ImagePrepull", config=config) if config.ray.prepull_image else None


class RayNetworkPolicy(Construct):
    """The NetworkPolicy of one Ray cluster (see `charts.policy`)."""

    def __init__(self, scope: Construct, id: str, *, config: ClusterConfig, owner: str,
                 rayjob: str | None = None) -> None:
        super().__init__(scope, id)
        self.policy = cdk8s.ApiObject(self, "NetworkPolicy", api_version=policy.API_VERSION, kind="NetworkPolicy",
                                      metadata=_metadata(config, policy.policy_name(owner)))
        self.policy.add_json_patch(cdk8s.JsonPatch.add("/spec", policy.network_policy_spec(
            owner, rayjob=rayjob, scraper=config.observability.enabled)))


class RayClusterChart(cdk8s.Chart):
    """A standalone RayCluster (submit jobs to it with `ray job submit`, see `submit.sh`) and its NetworkPolicy."""

    def __init__(self, scope: Construct, id: str, *, inputs: Inputs) -> None:
        super().__init__(scope, id)
        config = inputs.config
        name = ray.cluster_name(config)
        self.ray_cluster = RayCluster(self, "RayCluster", metadata=_metadata(config, name),
                                      spec=ray.ray_cluster_spec(config, inputs.code, owner=name))
        self.network_policy = RayNetworkPolicy(self, "Policy", config=config, owner=name)
        self.pod_monitor = (monitoring.RayPodMonitor(self, "Metrics", config=config, owner=name)
                            if config.observability.enabled else None)


class RayJobChart(cdk8s.Chart):
    """A RayJob: creates the same cluster as `RayClusterChart`, runs `job.sh`, retries, tears down.

    The NetworkPolicy of its cluster also admits the RayJob's submitter pod.
    """

    def __init__(self, scope: Construct, id: str, *, inputs: Inputs) -> None:
        super().__init__(scope, id)
        config = inputs.config
        name = ray.job_name(config)
        self.ray_job = RayJob(self, "RayJob", metadata=_metadata(config, name),
                              spec=ray.ray_job_spec(config, inputs.code))
        self.network_policy = RayNetworkPolicy(self, "Policy", config=config, owner=name, rayjob=name)
        self.pod_monitor = (monitoring.RayPodMonitor(self, "Metrics", config=config, owner=name)
                            if config.observability.enabled else None)


def build_app(inputs: Inputs, *, outdir: str | None = None) -> cdk8s.App:
    """The cdk8s app with its charts (nothing is written until `app.synth()`)."""
    app = cdk8s.App(outdir=outdir) if outdir else cdk8s.App()
    RayBaseChart(app, BASE_CHART, inputs=inputs)
    RayClusterChart(app, CLUSTER_CHART, inputs=inputs)
    RayJobChart(app, JOB_CHART, inputs=inputs)
    if inputs.config.job.watchdog:
        watchdog.WatchdogChart(app, watchdog.WATCHDOG_CHART, config=inputs.config, code=inputs.code)
    if inputs.config.observability.enabled:
        monitoring.DashboardsChart(app, DASHBOARDS_CHART, config=inputs.config)
    # Which variable file (and which bytes of it) made these objects; on the objects themselves, not their
    # pod templates, so `kubectl get -o yaml` shows it and an edit of the file restarts no pod.
    source = provenance(inputs.config_file)
    for chart in app.charts:
        for obj in (c for c in chart.node.find_all() if cdk8s.ApiObject.is_api_object(c)):
            obj.metadata.add_annotation(CONFIG_FILE_ANNOTATION, source["file"])
            obj.metadata.add_annotation(CONFIG_SHA256_ANNOTATION, source["sha256"])
    return app


def manifests(app: cdk8s.App) -> dict[str, list[dict]]:
    """Each chart's objects as plain data, by chart id (what `synth` would write)."""
    return {chart.node.id: list(chart.to_json()) for chart in app.charts}
