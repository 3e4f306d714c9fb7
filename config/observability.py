"""The `observability` section of the variable file: the in-cluster metrics stack, and the names it shares.

kube-prometheus-stack (Prometheus, Grafana, node exporter, kube-state-metrics) on the system nodes,
NVIDIA's dcgm-exporter on the GPU nodes, and a PodMonitor on the Ray pods (docs/observability.md says
why in-cluster rather than Amazon Managed Prometheus). The names below are used by the stacks (the
Helm values), the charts (the PodMonitor and the Ray pods' NetworkPolicy) and the local scrape test,
so the three cannot drift apart. This module imports nothing of the project: `config.model` imports it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from config.base import limit

MONITORING_NAMESPACE = "monitoring"
"""Namespace of kube-prometheus-stack and dcgm-exporter."""
STACK_RELEASE = "kube-prometheus-stack"
"""Helm release name of kube-prometheus-stack."""
STACK_FULLNAME = "kps"
"""The chart's `fullnameOverride`: object names start with it (short, so they stay under 63 characters)."""
PROMETHEUS_NAME = f"{STACK_FULLNAME}-prometheus"
"""Name of the Prometheus object the chart creates (`kube-prometheus-stack.prometheus.crname`)."""
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus", "operator.prometheus.io/name": PROMETHEUS_NAME}
"""Labels the Prometheus operator (v0.93) puts on the pods of Prometheus `PROMETHEUS_NAME`; the Ray pods'
NetworkPolicy admits the scraper by them (and by its namespace)."""
GRAFANA_SERVICE = f"{STACK_FULLNAME}-grafana"
"""Grafana's Service (port 80), for `kubectl port-forward`."""
DASHBOARD_LABEL = "grafana_dashboard"
"""ConfigMap label Grafana's dashboard sidecar watches (kube-prometheus-stack's `grafana.sidecar.dashboards.label`)."""
RAY_METRICS_PORT = 8080
"""Port of each Ray node's metrics agent (`ray start --metrics-export-port`; KubeRay's default too)."""
RAY_METRICS_PORT_NAME = "metrics"
"""Name of that container port on the Ray head and worker containers (the PodMonitor selects it by name)."""
RAY_METRICS_JOB = "ray"
"""Prometheus `job` label of the Ray pods' series (the PodMonitor's jobLabel target, and the local test's job)."""
DCGM_HOSTENGINE_PORT = 5555
"""Port of the node monitoring agent's `nv-hostengine` (its dcgm-server DaemonSet, hostPort 5555)."""
METRIC_PREFIX = "fsdp_"
"""Prefix of the training job's own metrics (`ray.util.metrics`); Ray's exporter adds `ray_` in front."""
RUN_NAME_LABEL = "run_name"
"""Label carrying `job.run_name` on every training series."""
RANK_LABEL = "rank"
"""Label carrying the Ray Train world rank on per-rank series (step time)."""
PLAN_PREDICTION_FILE = "/tmp/plan-prediction.json"
"""Where the RayJob's `job.sh` has `python -m workloads.plan` write its prediction, for the training driver on
the same head pod to export (`--prediction-out`)."""
PLAN_METRIC = "fsdp_plan_prediction"
"""Gauge of the plan's predictions (`python -m workloads.plan`), label `quantity` (tokens_per_s, mfu)."""
EFA_METRIC = "node_efa_hw_counter_total"
"""The series carrying EFA bytes: every hw_counter of every EFA port (labels device, port, counter, e.g.
counter="tx_bytes"), written by the node exporter's EFA sidecar (stacks/efa_counters.sh) through its textfile
collector; node exporter's own infiniband collector exports no EFA bytes (docs/observability.md)."""
EFA_TEXTFILE_DIR = "/run/efa-counters"
"""Node exporter's `--collector.textfile.directory` in its pod: a memory emptyDir the EFA sidecar writes to."""
EFA_HOST_SYS = "/host/sys"
"""Where the EFA sidecar sees the node's /sys (read-only), as node exporter sees it (the chart's `--path.sysfs`)."""
EFA_SIDECAR_REQUESTS = (10, 16)
"""CPU millicores and MiB the EFA sidecar requests on every node (a shell loop reading a few dozen sysfs files
once per scrape interval); inside the DaemonSet budget of config/resources.py."""

# Requests of the stack's pods on the system nodes (CPU millicores, MiB): Prometheus, Grafana (with its
# two sidecars), the operator, kube-state-metrics. Set in the Helm values from here, so `config check`
# can say what they take. Node exporter and dcgm-exporter run on every node, in the DaemonSet budget.
STACK_REQUESTS = {
    "prometheus": (500, 2048),
    "grafana": (200, 384),
    "operator": (100, 128),
    "kube-state-metrics": (50, 128),
}


class ObservabilityConfig(BaseModel):
    """Prometheus and Grafana in the cluster, scraping Ray, the GPUs (DCGM) and the nodes (EFA counters)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        default=True,
        description="Install kube-prometheus-stack on the system nodes, dcgm-exporter on the GPU nodes and a "
                    "PodMonitor on the Ray pods (false: none of them; the Ray pods' metrics port stays closed).",
    )
    retention_hours: int = Field(
        default=72, ge=1, le=24 * 30,
        json_schema_extra=limit("project bound: a month of samples on an emptyDir (Prometheus itself takes any "
                                "--storage.tsdb.retention.time duration)"),
        description="Hours Prometheus keeps samples, hours (it also drops the oldest past storage_gib).",
    )
    storage_gib: int = Field(
        default=20, ge=2, le=500,
        json_schema_extra=limit("project bound: at least Prometheus' 2 GiB WAL headroom, at most half of the system "
                                "node's gp3 root disk (rules.py checks disk_gib)"),
        description="Prometheus' data folder, GiB: an emptyDir on the system node's root disk (lost when the "
                    "pod moves); at most half of cluster.system_nodes.disk_gib.",
    )
    scrape_interval_s: int = Field(
        default=15, ge=1, le=300,
        json_schema_extra=limit("Prometheus scrape_interval: positive; at most 5 min, past which its 5-minute "
                                "staleness marks every series stale between scrapes"),
        description="Seconds between scrapes of the Ray pods, nodes and GPUs, seconds.",
    )
    dcgm_exporter: bool = Field(
        default=True,
        description="Run NVIDIA's dcgm-exporter on the GPU nodes (GPU utilisation and memory per GPU); it reads "
                    "the node monitoring agent's nv-hostengine instead of starting its own.",
    )

    @property
    def requests(self) -> tuple[int, int]:
        """CPU millicores and MiB the stack requests on the system nodes (0, 0 when disabled)."""
        if not self.enabled:
            return 0, 0
        return sum(c for c, _ in STACK_REQUESTS.values()), sum(m for _, m in STACK_REQUESTS.values())

    def problems(self, *, system_disk_gib: int) -> list[tuple[str, str]]:
        """(field, message) for settings the system nodes cannot hold."""
        if self.enabled and self.storage_gib * 2 > system_disk_gib:
            return [("storage_gib", f"{self.storage_gib} GiB is more than half of the system nodes' "
                     f"{system_disk_gib} GiB root disk (cluster.system_nodes.disk_gib), which the images and logs "
                     f"share; lower observability.storage_gib to at most {system_disk_gib // 2} or raise disk_gib")]
        return []

    def usd_per_hour(self, *, system_usd_per_hour: float, system_vcpus: int, system_memory_gib: float) -> float:
        """The system-node capacity the stack takes, as a share of one system node's price, USD per hour.

        Already inside the idle cost (the system nodes run anyway); shown so the stack's share is visible.
        Whichever of CPU and memory it takes more of sets the share.
        """
        cpu_m, mem_mib = self.requests
        share = max(cpu_m / (system_vcpus * 1000), mem_mib / (system_memory_gib * 1024))
        return share * system_usd_per_hour
