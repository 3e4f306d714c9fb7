"""What Prometheus scrapes on the Ray pods, and the Grafana dashboards, as Kubernetes objects.

`pod_monitor_spec` is the one description of the Ray scrape: the PodMonitor the Prometheus operator
turns into the cluster's scrape configuration, and `scrape_config`, which turns the same spec into a
plain Prometheus `scrape_configs` entry (static targets) for the local test's Prometheus, so the
test scrapes Ray the way the cluster does (path, interval, relabelling, job label).

The PodMonitor selects exactly the pods the Ray cluster's NetworkPolicy guards (`policy.ray_pods`),
on the container port the Ray pods name `metrics` (`charts.ray`), and the NetworkPolicy admits the
stack's Prometheus on that port (`policy.scraper_peer`).
"""

from __future__ import annotations

import re

import cdk8s
from constructs import Construct

from charts import dashboards, policy, ray
from config.k8s import RAY_CLUSTER_LABEL, RAY_NODE_TYPE_LABEL
from config.model import ClusterConfig
from config.observability import (
    DASHBOARD_LABEL,
    MONITORING_NAMESPACE,
    RAY_METRICS_JOB,
    RAY_METRICS_PORT_NAME,
)

POD_MONITOR_API = "monitoring.coreos.com/v1"
METRICS_PATH = "/metrics"


def _meta_label(pod_label: str) -> str:
    """The service-discovery label of a pod label (`__meta_kubernetes_pod_label_<name, sanitised>`)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


# Pod labels copied onto every series: Ray's own dashboards filter on `ray_io_cluster` (their Cluster
# variable, ray.dashboard.modules.metrics.dashboards in Ray 2.58), the node type tells head from workers.
RELABELED_POD_LABELS = {RAY_CLUSTER_LABEL: "ray_io_cluster", RAY_NODE_TYPE_LABEL: "ray_node_type"}


def pod_monitor_name(owner: str) -> str:
    return f"{owner}-ray-metrics"


def pod_monitor_spec(config: ClusterConfig, owner: str) -> dict:
    """`PodMonitor.spec` for the Ray head and worker pods of `owner`'s Ray cluster."""
    relabelings = [{"action": "replace", "sourceLabels": [_meta_label(label)], "targetLabel": target}
                   for label, target in RELABELED_POD_LABELS.items()]
    relabelings += [
        {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"},
        # One job for every Ray pod of every cluster, so dashboards select Ray's series by job.
        {"action": "replace", "targetLabel": "job", "replacement": RAY_METRICS_JOB},
    ]
    return {
        "namespaceSelector": {"matchNames": [config.ray.namespace]},
        "selector": policy.ray_pods(owner),
        "podMetricsEndpoints": [{
            "port": RAY_METRICS_PORT_NAME,
            "path": METRICS_PATH,
            "interval": f"{config.observability.scrape_interval_s}s",
            "relabelings": relabelings,
        }],
    }


def _snake(key: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def scrape_config(spec: dict, *, targets: list[dict]) -> dict:
    """The Prometheus scrape configuration the operator derives from a PodMonitor `spec`, with static targets.

    `targets`: Prometheus static target groups (`{"targets": ["host:port"], "labels": {...}}`); their labels
    may carry the `__meta_kubernetes_pod_*` labels Kubernetes discovery would give, so the relabelling runs as
    in the cluster. Only what `pod_monitor_spec` uses is translated (port, path, interval, relabelings);
    anything else is refused rather than silently dropped.
    """
    (endpoint,) = spec["podMetricsEndpoints"]
    unknown = set(endpoint) - {"port", "path", "interval", "relabelings"}
    if unknown:
        raise ValueError(f"scrape_config does not translate {sorted(unknown)} of a PodMonitor endpoint")
    relabel = [{_snake(k): v for k, v in rule.items()} for rule in endpoint["relabelings"]]
    return {
        "job_name": RAY_METRICS_JOB,
        "scrape_interval": endpoint["interval"],
        "metrics_path": endpoint["path"],
        "static_configs": targets,
        "relabel_configs": relabel,
    }


class RayPodMonitor(Construct):
    """The PodMonitor of one Ray cluster's pods (applied once the stack's CRDs exist)."""

    def __init__(self, scope: Construct, id: str, *, config: ClusterConfig, owner: str) -> None:
        super().__init__(scope, id)
        self.pod_monitor = cdk8s.ApiObject(
            self, "PodMonitor", api_version=POD_MONITOR_API, kind="PodMonitor",
            metadata=cdk8s.ApiObjectMetadata(name=pod_monitor_name(owner), namespace=config.ray.namespace,
                                             labels=ray.labels(config)))
        self.pod_monitor.add_json_patch(cdk8s.JsonPatch.add("/spec", pod_monitor_spec(config, owner)))


def dashboard_configmap_name(file_name: str) -> str:
    return "dashboard-" + file_name.removesuffix(".json")


class DashboardsChart(cdk8s.Chart):
    """One ConfigMap per dashboard under charts/dashboards, labelled for Grafana's dashboard sidecar."""

    def __init__(self, scope: Construct, id: str, *, config: ClusterConfig) -> None:
        super().__init__(scope, id)
        self.config_maps = []
        for path in sorted(dashboards.DASHBOARD_DIR.glob("*.json")):
            config_map = cdk8s.ApiObject(
                self, path.stem, api_version="v1", kind="ConfigMap",
                metadata=cdk8s.ApiObjectMetadata(name=dashboard_configmap_name(path.name),
                                                 namespace=MONITORING_NAMESPACE,
                                                 labels={**ray.labels(config), DASHBOARD_LABEL: "1"}))
            config_map.add_json_patch(cdk8s.JsonPatch.add("/data", {path.name: path.read_text()}))
            self.config_maps.append(config_map)
