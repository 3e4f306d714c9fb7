"""`ray-watchdog` (dist/ray-watchdog.k8s.yaml, with `job.watchdog`): the pod that bounds what KubeRay 1.7.0 cannot.

`python -m workloads.watchdog` (its docstring has the rules and the KubeRay lines) in one small Deployment on the
system nodes, in the Ray image the RayJob already uses (pre-pulled there; no new image), running the three files it
needs from the code ConfigMap of `ray-base`. Its service account may, in the Ray namespace only, read the RayJob,
the RayClusters, the pods and the submitter Jobs, and delete them; and, cluster-wide, get and
list nodes (the node-lost rule must tell a NotReady node from a Ready one). Nothing else: no create, no patch, no
secrets. Apply it after `ray-base` and before `ray-job`; it watches the RayJob by name, so it can stay applied across
runs.
"""

from __future__ import annotations

import cdk8s
from constructs import Construct

from charts import bundle, policy, ray
from charts.checkov import checkov_skips
from charts.errors import ChartError
from config.k8s import system_node_labels
from config.model import ClusterConfig

WATCHDOG_CHART = "ray-watchdog"
FILES = ("workloads/__init__.py", "workloads/stopping.py", "workloads/watchdog.py")
"""What the watchdog imports from the code bundle: stdlib-only modules, so the Ray image's Python runs them as is."""
RESOURCES = {"cpu": "10m", "memory": "64Mi"}
"""A stdlib loop that lists a handful of objects every 30 s: about 20 MiB resident (CPython 3.12)."""
RULES = [
    {"apiGroups": ["ray.io"], "resources": ["rayjobs", "rayclusters"], "verbs": ["get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "delete"]},
]
"""The Role: reads what the rules look at; deletes what they delete (workloads.stopping `Delete.resource`: the
submitter Job too, at once rather than on the garbage collector's schedule; the cluster tier's run as this Role
got 403 on it before `delete` was granted). `watch` is granted for a later informer; the loop lists."""
NODE_RULES = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]

CHECKOV_REASONS = {
    "CKV_K8S_8": "a polling loop with no port; it logs every pass, and the Deployment restarts it if it exits",
    "CKV_K8S_9": "a polling loop with no port and no clients: nothing to route to it, so nothing to be ready for",
    "CKV_K8S_15": "IfNotPresent on purpose: the multi-GB Ray image, pinned and pre-pulled on every node",
    "CKV_K8S_38": "it calls the Kubernetes API with this token (RBAC: the Role and node ClusterRole beside it)",
}


def name(config: ClusterConfig) -> str:
    return f"{config.cluster.name}-watchdog"


def pod_labels(config: ClusterConfig) -> dict[str, str]:
    return {**ray.labels(config), "app.kubernetes.io/component": "watchdog"}


def command(config: ClusterConfig) -> list[str]:
    """The container's command: the watchdog with the variable file's limits, in seconds."""
    job = config.job
    return ["python", "-m", "workloads.watchdog", "--namespace", config.ray.namespace, "--rayjob", ray.job_name(config),
            "--period", str(job.watchdog_period_seconds),
            "--submitter-start", f"{job.submitter_start_minutes * 60:g}",
            "--head-restarts", str(job.head_restart_limit),
            "--head-ready", f"{job.head_ready_minutes * 60:g}",
            "--node-lost", str(config.autoscaling.node_lost_seconds)]


def _metadata(config: ClusterConfig, object_name: str, *, namespaced: bool = True,
              annotations: dict[str, str] | None = None) -> dict:
    meta = {"name": object_name, "labels": ray.labels(config)}
    if namespaced:
        meta["namespace"] = config.ray.namespace
    if annotations:
        meta["annotations"] = annotations
    return meta


def checkov_reasons(config: ClusterConfig) -> dict[str, str]:
    """checkov findings the Deployment's design needs, and why (on the Deployment, where checkov reads them)."""
    skips = dict(CHECKOV_REASONS)
    if not config.ray.image_by_digest:
        skips.update([ray.CHECKOV_TAG])
    return skips


def deployment_spec(config: ClusterConfig, code: bundle.CodeBundle) -> dict:
    keys = {bundle.flatten(path) for path in FILES}
    missing = sorted(keys - set(code.data))
    if missing:
        raise ChartError(f"the code bundle lacks {missing}: the watchdog cannot run")
    items = [{"key": key, "path": code.paths[key]} for key in sorted(keys)]
    nobody = 65534
    container = {
        "name": "watchdog",
        "image": config.ray.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command(config),
        "workingDir": bundle.MOUNT_PATH,
        # The mount is read-only: no __pycache__; unbuffered, so each decision's line reaches the log at once.
        "env": [{"name": "PYTHONPATH", "value": bundle.MOUNT_PATH}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
                {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": {"requests": dict(RESOURCES), "limits": dict(RESOURCES)},
        "volumeMounts": [{"name": "code", "mountPath": bundle.MOUNT_PATH, "readOnly": True}],
        "securityContext": {"runAsNonRoot": True, "runAsUser": nobody, "runAsGroup": nobody,
                            "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    return {
        "replicas": 1,
        # Never two at once: both would delete the same objects (harmless, but two log lines per decision).
        "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": pod_labels(config)},
        "template": {
            "metadata": {"labels": pod_labels(config)},
            "spec": {
                "serviceAccountName": name(config),
                "automountServiceAccountToken": True,
                "nodeSelector": system_node_labels(),
                "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                "terminationGracePeriodSeconds": 5,
                "containers": [container],
                "volumes": [{"name": "code", "configMap": {"name": ray.code_configmap_name(config), "items": items}}],
            },
        },
    }


class WatchdogChart(cdk8s.Chart):
    """ServiceAccount, Role + RoleBinding, node-reading ClusterRole + binding, Deployment, NetworkPolicy."""

    def __init__(self, scope: Construct, id: str, *, config: ClusterConfig, code: bundle.CodeBundle) -> None:
        super().__init__(scope, id)
        own = name(config)
        subject = [{"kind": "ServiceAccount", "name": own, "namespace": config.ray.namespace}]
        rbac = "rbac.authorization.k8s.io"

        def obj(cid: str, api_version: str, kind: str, metadata: dict, **body) -> cdk8s.ApiObject:
            made = cdk8s.ApiObject(self, cid, api_version=api_version, kind=kind,
                                   metadata=cdk8s.ApiObjectMetadata(**metadata))
            for key, value in body.items():
                made.add_json_patch(cdk8s.JsonPatch.add(f"/{key}", value))
            return made

        self.service_account = obj("ServiceAccount", "v1", "ServiceAccount", _metadata(config, own))
        self.role = obj("Role", f"{rbac}/v1", "Role", _metadata(config, own), rules=RULES)
        self.role_binding = obj("RoleBinding", f"{rbac}/v1", "RoleBinding", _metadata(config, own),
                                roleRef={"apiGroup": rbac, "kind": "Role", "name": own}, subjects=subject)
        cluster_role = f"{own}-nodes"
        self.node_role = obj("NodeRole", f"{rbac}/v1", "ClusterRole",
                             _metadata(config, cluster_role, namespaced=False), rules=NODE_RULES)
        self.node_binding = obj("NodeRoleBinding", f"{rbac}/v1", "ClusterRoleBinding",
                                _metadata(config, cluster_role, namespaced=False),
                                roleRef={"apiGroup": rbac, "kind": "ClusterRole", "name": cluster_role},
                                subjects=subject)
        self.deployment = obj("Deployment", "apps/v1", "Deployment",
                              _metadata(config, own, annotations=checkov_skips(checkov_reasons(config))),
                              spec=deployment_spec(config, code))
        # It serves nothing, and its one peer is the API server: egress to TCP 443 only (the `kubernetes` Service's
        # port and, on EKS, its endpoints' port; their addresses are the control plane's ENIs, unknown at synth
        # time, so the policy cannot name them). No DNS: it dials KUBERNETES_SERVICE_HOST, an IP.
        spec = policy.deny_ingress_spec(pod_labels(config))
        spec = {**spec, "policyTypes": ["Ingress", "Egress"], "egress": [{"ports": [{"protocol": "TCP", "port": 443}]}]}
        self.network_policy = obj("NetworkPolicy", policy.API_VERSION, "NetworkPolicy", _metadata(config, own),
                                  spec=spec)
        for later in (self.role_binding, self.node_binding, self.deployment):
            later.node.add_dependency(self.service_account)
