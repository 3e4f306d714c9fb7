"""The metrics stack (`observability` in the variable file): kube-prometheus-stack and dcgm-exporter as Helm charts.

The values are plain functions of the variable file, so the tests render the pinned charts with them
(../shared/charts, the real helm) and check where every DaemonSet and Deployment lands. The Ray pods'
PodMonitor and the Grafana dashboards are in the cdk8s manifests (`charts.monitoring`), next to the pods.
docs/observability.md: why in-cluster, how to open Grafana.
"""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from config import ClusterConfig
from config.k8s import GPU_PRESENT_LABEL, GPU_TAINT, system_node_labels
from config.observability import (
    DASHBOARD_LABEL,
    DCGM_HOSTENGINE_PORT,
    EFA_HOST_SYS,
    EFA_SIDECAR_REQUESTS,
    EFA_TEXTFILE_DIR,
    GRAFANA_SERVICE,
    MONITORING_NAMESPACE,
    PROMETHEUS_NAME,
    STACK_FULLNAME,
    STACK_REQUESTS,
)
from stacks.helm_addons import pinned_chart
from stacks.versions import DCGM_EXPORTER, KUBE_PROMETHEUS_STACK, NODE_EXPORTER_SHELL_IMAGE

HOST_IP_ENV = "HOST_IP"
EFA_SCRIPT = Path(__file__).resolve().parent / "efa_counters.sh"
"""The EFA sidecar's script, run as is by the sidecar (inline in its command) and by the tests."""
EFA_SIDECAR = "efa-counters"
# kube-prometheus-stack 88.5.3 values.yaml sets these two `prometheus-node-exporter.extraArgs`; Helm replaces a
# list rather than merging it, so setting extraArgs (for the textfile directory) must repeat them (a test compares
# them with the pinned chart's values.yaml).
STACK_NODE_EXPORTER_ARGS = [
    "--collector.filesystem.mount-points-exclude=^/(dev|proc|sys|run/containerd/.+|var/lib/docker/.+|"
    "var/lib/kubelet/.+)($|/)",
    "--collector.filesystem.fs-types-exclude=^(autofs|binfmt_misc|bpf|cgroup2?|configfs|debugfs|devpts|devtmpfs|"
    "fusectl|hugetlbfs|iso9660|mqueue|nsfs|overlay|proc|procfs|pstore|rpc_pipefs|securityfs|selinuxfs|squashfs|"
    "sysfs|tracefs|erofs)$",
]


def _requests(name: str) -> dict:
    cpu_m, mem_mib = STACK_REQUESTS[name]
    return {"requests": {"cpu": f"{cpu_m}m", "memory": f"{mem_mib}Mi"}, "limits": {"memory": f"{mem_mib * 2}Mi"}}


def kube_prometheus_stack_values(config: ClusterConfig) -> dict:
    """kube-prometheus-stack's values: everything on the system nodes but the node exporter, which runs on
    every node (its chart default tolerates every NoSchedule taint, the GPU taint among them; set explicitly)."""
    section = config.observability
    system = system_node_labels()
    interval = f"{section.scrape_interval_s}s"
    return {
        "fullnameOverride": STACK_FULLNAME,
        # No receivers are configured, so an Alertmanager would only hold alerts nobody reads.
        "alertmanager": {"enabled": False},
        "windowsMonitoring": {"enabled": False},
        "prometheusOperator": {
            "nodeSelector": system,
            "resources": _requests("operator"),
            "admissionWebhooks": {"patch": {"nodeSelector": system}},
        },
        "prometheus": {"prometheusSpec": {
            # The Prometheus object's name (`kube-prometheus-stack.prometheus.crname` is fullname-prometheus);
            # the Ray pods' NetworkPolicy admits its pods by it.
            "nodeSelector": system,
            "resources": _requests("prometheus"),
            "scrapeInterval": interval,
            "retention": f"{section.retention_hours}h",
            # Below the emptyDir's limit, so Prometheus drops old blocks before the kubelet evicts the pod.
            "retentionSize": f"{int(section.storage_gib * 0.8)}GB",
            # No EBS CSI driver in this cluster: the data lives on the node's root disk.
            "storageSpec": {"emptyDir": {"sizeLimit": f"{section.storage_gib}Gi"}},
            # Select every PodMonitor and ServiceMonitor, not only those labelled with this release: the
            # Ray pods' PodMonitor is applied with the cdk8s manifests.
            "podMonitorSelectorNilUsesHelmValues": False,
            "serviceMonitorSelectorNilUsesHelmValues": False,
        }},
        "grafana": {
            # Its Service name, for `kubectl port-forward` (the subchart would name it after the release).
            "fullnameOverride": GRAFANA_SERVICE,
            "nodeSelector": system,
            "resources": _requests("grafana"),
            # Namespaced RBAC: a Role and RoleBinding in the monitoring namespace instead of the chart's default
            # ClusterRole, which lets Grafana's sidecars get, watch and list ConfigMaps and Secrets in every
            # namespace (grafana chart 12.11.1 templates/clusterrole.yaml, `rbac.namespaced: false`), the Ray
            # token Secrets among them. The sidecars then read only their own namespace, where the dashboards'
            # ConfigMaps are (charts/dashboards.py) and the chart's own datasource ConfigMap is.
            "rbac": {"namespaced": True},
            "sidecar": {
                # The dashboards sidecar loads every ConfigMap labelled grafana_dashboard=1 in its namespace.
                "dashboards": {"enabled": True, "label": DASHBOARD_LABEL, "labelValue": "1",
                               "searchNamespace": MONITORING_NAMESPACE},
                # No Alertmanager runs (above): without this the chart still adds an Alertmanager datasource
                # pointing at a Service that does not exist (templates/grafana/configmaps-datasources.yaml,
                # `grafana.sidecar.datasources.alertmanager.enabled`, default true).
                "datasources": {"alertmanager": {"enabled": False}},
            },
        },
        # Without its secrets collector: kube-state-metrics would otherwise list and watch every Secret in the
        # cluster (its ClusterRole, kube-state-metrics chart 8.4.0 templates/role.yaml, one rule per collector) to
        # export kube_secret_* series no dashboard here uses (`collectorsExclude`, values.yaml).
        "kube-state-metrics": {"nodeSelector": system, "resources": _requests("kube-state-metrics"),
                               "collectorsExclude": ["secrets"]},
        "prometheus-node-exporter": {
            "tolerations": [GPU_TAINT.toleration(), {"key": "CriticalAddonsOnly", "operator": "Exists"}],
            "prometheus": {"monitor": {"interval": interval}},
            **efa_sidecar_values(section.scrape_interval_s),
        },
    }


def efa_sidecar_values(interval_s: int) -> dict:
    """prometheus-node-exporter 4.56.1 values (its values.yaml documents each) for the EFA counters sidecar.

    Node exporter's infiniband collector exports no EFA bytes (docs/observability.md, "EFA"), so a sidecar in the
    same pod runs stacks/efa_counters.sh: every `interval_s` it writes the EFA ports' hw_counters into a .prom file
    that node exporter's textfile collector serves with the node's other series (same target, same labels).
    `sidecars` fill in the main container's securityContext (read-only root, the pod's user 65534) but not its
    image, which is set: the chart's image is distroless, without a shell. `sidecarVolumeMount` is a memory
    emptyDir, mounted read-only into node exporter; `sidecarHostVolumeMounts` the node's /sys, read-only, into the
    sidecar (templates/daemonset.yaml and _helpers.tpl `prometheus-node-exporter.sidecarVolumeMounts`).
    """
    cpu_m, mem_mib = EFA_SIDECAR_REQUESTS
    return {
        "extraArgs": [*STACK_NODE_EXPORTER_ARGS, f"--collector.textfile.directory={EFA_TEXTFILE_DIR}"],
        "sidecars": [{
            "name": EFA_SIDECAR,
            "image": NODE_EXPORTER_SHELL_IMAGE,
            # `sh -c SCRIPT NAME`: NAME is the script's $0 in its messages.
            "command": ["/bin/sh", "-c", EFA_SCRIPT.read_text(), EFA_SIDECAR],
            "env": [{"name": "EFA_SYSFS", "value": EFA_HOST_SYS},
                    {"name": "EFA_TEXTFILE_DIR", "value": EFA_TEXTFILE_DIR},
                    {"name": "EFA_INTERVAL_S", "value": str(interval_s)}],
            "resources": {"requests": {"cpu": f"{cpu_m}m", "memory": f"{mem_mib}Mi"},
                          "limits": {"memory": f"{mem_mib * 2}Mi"}},
        }],
        "sidecarVolumeMount": [{"name": "efa-textfile", "mountPath": EFA_TEXTFILE_DIR, "readOnly": False}],
        "sidecarHostVolumeMounts": [{"name": "efa-host-sys", "hostPath": "/sys", "mountPath": EFA_HOST_SYS,
                                     "readOnly": True}],
    }


def dcgm_exporter_values(config: ClusterConfig) -> dict:
    """dcgm-exporter's values: on the GPU nodes only, reading the node monitoring agent's nv-hostengine.

    The chart's default tolerations cover only the control-plane taint and it has no nodeSelector, so
    both are set. Coexisting with the eks-node-monitoring-agent add-on: its dcgm-server DaemonSet runs
    `nv-hostengine -n -b ALL` with hostPort 5555 (eks-node-monitoring-agent chart 1.7.0,
    templates/dcgm-daemonset.yaml). dcgm-exporter connects to a running host engine instead of embedding
    its own when given `-r HOST:PORT` / DCGM_REMOTE_HOSTENGINE_INFO (NVIDIA/dcgm-exporter pkg/cmd/app.go,
    flag `remote-hostengine-info`; chart 4.8.2 values.yaml: "Use -r <HOST>:<PORT> to connect to an already
    running hostengine"): one host engine per node, so the two never hold the GPUs' profiling counters
    against each other. The pod reaches the hostPort on its node's IP (Downward API status.hostIP).
    """
    return {
        "nodeSelector": {GPU_PRESENT_LABEL: "true"},
        "tolerations": [GPU_TAINT.toleration()],
        "arguments": ["-f", "/etc/dcgm-exporter/default-counters.csv"],
        "extraEnv": [
            {"name": HOST_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "DCGM_REMOTE_HOSTENGINE_INFO", "value": f"$({HOST_IP_ENV}):{DCGM_HOSTENGINE_PORT}"},
        ],
        # The chart's ServiceMonitor; kube-prometheus-stack's Prometheus selects every ServiceMonitor.
        "serviceMonitor": {"enabled": True, "interval": f"{config.observability.scrape_interval_s}s"},
        # Least privilege beside a remote host engine. The chart's default adds SYS_ADMIN "for profiling metrics
        # (DCGM_FI_PROF_*)" (values.yaml `securityContext`): the process that reads the GPUs' profiling counters
        # needs it, and here that is the node monitoring agent's nv-hostengine, not this exporter, which only asks
        # it over TCP (-r). So every capability is dropped. It stays user 0: it maps GPUs to pods through the
        # kubelet's pod-resources socket (the chart's hostPath /var/lib/kubelet/pod-resources), a root-owned Unix
        # socket that only root may connect to. Whether the DCGM_FI_PROF_* series still arrive this way, and with
        # pod labels, only a GPU node can show: docs/observability.md, "To check on a GPU"; for the fields,
        # `python bench/gpu_throughput.py --dcgm` (a capability-less client against a host engine).
        "securityContext": {"runAsNonRoot": False, "runAsUser": 0, "capabilities": {"add": [], "drop": ["ALL"]},
                            "allowPrivilegeEscalation": False},
    }


class MetricsStack(Construct):
    """kube-prometheus-stack (Prometheus, Grafana, node exporter, kube-state-metrics) and dcgm-exporter."""

    def __init__(self, scope: Construct, id: str, *, cluster: eks.ICluster, config: ClusterConfig, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        self.values = kube_prometheus_stack_values(config)
        stack = Construct(self, "KubePrometheusStack")
        self.chart = pinned_chart(stack, cluster, KUBE_PROMETHEUS_STACK, self.values)
        self.charts = [self.chart]
        self.dcgm_chart = None
        if config.observability.dcgm_exporter:
            dcgm = Construct(self, "DcgmExporter")
            self.dcgm_values = dcgm_exporter_values(config)
            self.dcgm_chart = pinned_chart(dcgm, cluster, DCGM_EXPORTER, self.dcgm_values)
            # Its ServiceMonitor is a CRD the stack's chart installs.
            self.dcgm_chart.node.add_dependency(self.chart)
            self.charts.append(self.dcgm_chart)
        cdk.CfnOutput(self, "GrafanaCommand", value=f"kubectl -n {KUBE_PROMETHEUS_STACK.namespace} port-forward "
                      f"svc/{GRAFANA_SERVICE} 3000:80",
                      description=f"Opens Grafana on http://localhost:3000 (Prometheus: {PROMETHEUS_NAME}).")
