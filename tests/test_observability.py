"""The metrics stack (issue 23): the section of the variable file, the pinned charts as helm renders them,
the Ray scrape against the synthesized pods and NetworkPolicy, the dashboards, and a real Prometheus
scraping a real local Ray Train run, against which every overview panel's query is evaluated.

The local scrape uses Debian's Prometheus (`make setup` installs it); without it those tests skip and say
how to install it. The scrape configuration it runs is `charts.monitoring.scrape_config` of the same
PodMonitor spec the cluster gets.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml

from charts import build_app, dashboards, inputs, manifests, monitoring, policy, validation
from config import load_config
from config.k8s import GPU_PRESENT_LABEL, GPU_TAINT, RAY_CLUSTER_LABEL, system_node_labels
from config.observability import (
    DASHBOARD_LABEL,
    EFA_HOST_SYS,
    EFA_TEXTFILE_DIR,
    GRAFANA_SERVICE,
    MONITORING_NAMESPACE,
    PROMETHEUS_NAME,
    PROMETHEUS_POD_LABELS,
    RANK_LABEL,
    RAY_METRICS_JOB,
    RAY_METRICS_PORT,
    RUN_NAME_LABEL,
)
from harness.loopback import PrometheusServer, prometheus_missing
from harness.waiting import wait_for
from stacks.observability import (
    EFA_SCRIPT,
    EFA_SIDECAR,
    STACK_NODE_EXPORTER_ARGS,
    dcgm_exporter_values,
    kube_prometheus_stack_values,
)
from stacks.versions import DCGM_EXPORTER, KUBE_PROMETHEUS_STACK
from tests.helm import template as helm_template
from tests.helpers import REPO, write_variant
from tests.test_config import check, paths_of, refused
from tests.test_security_charts import OPERATOR, STRANGER, _pod, admitted, ray_pods, selects
from tests.vendored import ChartsUnavailable, chart_dir

DEFAULT = REPO / "config" / "cluster.yaml"


# ---- helpers: helm from the kubectl layer, the pinned charts, the synthesized manifests -------------------


def chart_folder(pin) -> Path:
    try:
        return chart_dir(f"{pin.chart}-{pin.version}")
    except ChartsUnavailable as exc:
        pytest.skip(str(exc))


def render(pin, values: dict) -> list[dict]:
    """`helm template` of the pinned chart copy with `values`, as the stacks install it (release, namespace), by
    the kubectl layer's helm (tests/helm.py)."""
    return helm_template(chart_folder(pin), release=pin.release, namespace=pin.namespace, values=values,
                         kube_version="1.34.0")


def workloads_of(objects: list[dict]) -> dict[str, dict]:
    """Pod specs of the DaemonSets and Deployments (and the operator-made Prometheus), by kind/name."""
    found = {}
    for obj in objects:
        if obj["kind"] in ("DaemonSet", "Deployment"):
            found[f"{obj['kind']}/{obj['metadata']['name']}"] = obj["spec"]["template"]["spec"]
        elif obj["kind"] == "Prometheus":
            found[f"Prometheus/{obj['metadata']['name']}"] = obj["spec"]
    return found


@pytest.fixture(scope="module")
def config():
    return load_config(DEFAULT)


@pytest.fixture(scope="module")
def stack_objects(config) -> list[dict]:
    return render(KUBE_PROMETHEUS_STACK, kube_prometheus_stack_values(config))


@pytest.fixture(scope="module")
def objects(config) -> list[dict]:
    return [o for objs in manifests(build_app(inputs(config, DEFAULT))).values() for o in objs]


def _kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


# ---- 1. the variable file --------------------------------------------------------------------------


def test_on_by_default_and_config_check_shows_what_it_runs_and_costs():
    code, out, err = check(DEFAULT)
    assert code == 0, err
    line = next(line for line in out.splitlines() if "metrics stack" in line)
    assert "kube-prometheus-stack on the system nodes" in line and "dcgm-exporter on each GPU node" in line
    assert "node exporter with its EFA counters sidecar on every node (10m CPU, 16 MiB each" in line
    assert re.search(r"\$\d+\.\d\d/hour of their price", line), line


def test_config_check_says_when_the_stack_is_off(tmp_path):
    code, out, _ = check(write_variant(tmp_path, {"observability": {"enabled": False}}))
    assert code == 0
    assert "metrics stack off (observability.enabled: false)" in out


def test_prometheus_storage_over_half_the_system_disk_is_refused(tmp_path):
    lines = refused(tmp_path, {"observability": {"storage_gib": 60}})
    assert paths_of(lines) == ["observability.storage_gib"]
    assert "at most 50" in lines[0] and "cluster.system_nodes.disk_gib" in lines[0]


# ---- 2. the pinned charts, rendered by helm -----------------------------------------------------------


def test_stack_runs_on_the_system_nodes_and_node_exporter_on_every_node(stack_objects):
    found = workloads_of(stack_objects)
    exporter = found.pop(f"DaemonSet/{KUBE_PROMETHEUS_STACK.release}-prometheus-node-exporter")
    assert GPU_TAINT.toleration() in exporter["tolerations"]
    assert exporter["nodeSelector"] == {"kubernetes.io/os": "linux"}  # every Linux node, GPU nodes included
    assert set(found) == {f"Deployment/{GRAFANA_SERVICE}", f"Deployment/{KUBE_PROMETHEUS_STACK.release}-kube-state-"
                          "metrics", "Deployment/kps-operator", f"Prometheus/{PROMETHEUS_NAME}"}
    for name, spec in found.items():
        assert spec["nodeSelector"] == system_node_labels(), name
        assert not spec.get("tolerations"), name


# The EFA counters sidecar in node exporter's pod (docs/observability.md, "EFA"; tests/test_efa_counters.py runs
# its script against a real node exporter and Prometheus).


def _node_exporter(stack_objects) -> tuple[dict, dict, dict]:
    """(pod spec, node exporter's container, the EFA sidecar) of the rendered DaemonSet."""
    spec = workloads_of(stack_objects)[f"DaemonSet/{KUBE_PROMETHEUS_STACK.release}-prometheus-node-exporter"]
    containers = {c["name"]: c for c in spec["containers"]}
    return spec, containers["node-exporter"], containers[EFA_SIDECAR]


def _by_name(items: list[dict]) -> dict[str, dict]:
    return {i["name"]: i for i in items}


def test_node_exporter_reads_the_sidecars_folder_read_only(stack_objects):
    spec, exporter, _ = _node_exporter(stack_objects)
    assert f"--collector.textfile.directory={EFA_TEXTFILE_DIR}" in exporter["args"]
    assert _by_name(exporter["volumeMounts"])["efa-textfile"] == {"name": "efa-textfile",
                                                                   "mountPath": EFA_TEXTFILE_DIR, "readOnly": True}
    assert _by_name(spec["volumes"])["efa-textfile"] == {"name": "efa-textfile", "emptyDir": {"medium": "Memory"}}


def test_node_exporter_keeps_the_stacks_own_arguments(stack_objects):
    """Helm replaces a list value: the stack's extraArgs (its values.yaml) are repeated beside the textfile one."""
    values = yaml.safe_load((chart_folder(KUBE_PROMETHEUS_STACK) / "values.yaml").read_text())
    assert STACK_NODE_EXPORTER_ARGS == values["prometheus-node-exporter"]["extraArgs"]
    _, exporter, _ = _node_exporter(stack_objects)
    assert set(STACK_NODE_EXPORTER_ARGS) <= set(exporter["args"])


def test_efa_sidecar_runs_the_repositorys_script_every_scrape_interval(stack_objects, config):
    _, _, sidecar = _node_exporter(stack_objects)
    assert sidecar["command"] == ["/bin/sh", "-c", EFA_SCRIPT.read_text(), EFA_SIDECAR]
    assert {e["name"]: e["value"] for e in sidecar["env"]} == {
        "EFA_SYSFS": EFA_HOST_SYS, "EFA_TEXTFILE_DIR": EFA_TEXTFILE_DIR,
        "EFA_INTERVAL_S": str(config.observability.scrape_interval_s)}


def test_efa_sidecar_image_is_the_charts_node_exporter_with_a_shell(stack_objects):
    """The chart runs node exporter's distroless image (no /bin/sh); the sidecar its busybox image, same version."""
    subchart = chart_folder(KUBE_PROMETHEUS_STACK) / "charts" / "prometheus-node-exporter"
    version = yaml.safe_load((subchart / "Chart.yaml").read_text())["appVersion"]
    image = yaml.safe_load((subchart / "values.yaml").read_text())["image"]
    _, exporter, sidecar = _node_exporter(stack_objects)
    assert sidecar["image"] == f"{image['registry']}/{image['repository']}:v{version}"
    assert exporter["image"] == f"{sidecar['image']}-distroless"


def test_efa_sidecar_reads_the_nodes_sys_read_only_as_a_non_root_user(stack_objects):
    spec, _, sidecar = _node_exporter(stack_objects)
    (mount,) = [m for m in sidecar["volumeMounts"] if m["mountPath"] == EFA_HOST_SYS]
    assert mount["readOnly"] is True
    assert _by_name(spec["volumes"])[mount["name"]]["hostPath"] == {"path": "/sys"}
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_no_alertmanager_and_no_windows_exporter(stack_objects):
    kinds = {(o["kind"], o["metadata"]["name"]) for o in stack_objects}
    assert not [k for k in kinds if k[0] == "Alertmanager" or "windows" in k[1]]


def test_networkpolicy_peer_is_what_the_chart_selects_prometheus_pods_by(stack_objects):
    """The chart's own Prometheus Service selects the operator's pods by these labels (operator v0.93.1 labels
    a Prometheus's pods app.kubernetes.io/name=prometheus, operator.prometheus.io/name=<name>)."""
    service = _kind(stack_objects, "Service")[PROMETHEUS_NAME]
    assert service["metadata"]["namespace"] == MONITORING_NAMESPACE
    assert service["spec"]["selector"] == PROMETHEUS_POD_LABELS


def test_prometheus_picks_up_podmonitors_outside_the_release(stack_objects):
    spec = _kind(stack_objects, "Prometheus")[PROMETHEUS_NAME]["spec"]
    assert spec["podMonitorSelector"] == {} and spec["podMonitorNamespaceSelector"] == {}
    assert spec["storage"]["emptyDir"]["sizeLimit"] == "20Gi" and spec["retention"] == "72h"


def test_grafana_sidecar_loads_the_dashboard_configmaps(stack_objects, objects):
    grafana = _kind(stack_objects, "Deployment")[GRAFANA_SERVICE]["spec"]["template"]["spec"]
    sidecar = next(c for c in grafana["containers"] if c["name"] == "grafana-sc-dashboard")
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert (env["LABEL"], env["LABEL_VALUE"], env["NAMESPACE"]) == (DASHBOARD_LABEL, "1", MONITORING_NAMESPACE)
    maps = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["namespace"] == MONITORING_NAMESPACE]
    assert sorted(k for m in maps for k in m["data"]) == ["overview.json", "ray-default.json", "ray-train.json"]
    for config_map in maps:
        assert config_map["metadata"]["labels"][DASHBOARD_LABEL] == "1"
        assert len(json.dumps(config_map)) < 1024**2  # a ConfigMap holds at most 1 MiB


def _bound_rules(objects: list[dict], service_account: str) -> list[tuple[str, str, dict]]:
    """(binding kind, namespace, rule) of every RBAC rule bound to `service_account` in the rendered objects."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects
             if o["kind"] in ("Role", "ClusterRole")}
    found = []
    for binding in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == service_account
                   for s in binding.get("subjects", [])):
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        role = roles[(ref["kind"], namespace, ref["name"])]
        found += [(binding["kind"], binding["metadata"].get("namespace"), rule) for rule in role.get("rules", [])]
    return found


def test_grafana_reads_secrets_only_in_its_own_namespace(stack_objects):
    rules = _bound_rules(stack_objects, GRAFANA_SERVICE)
    secrets = [(kind, ns) for kind, ns, rule in rules if "secrets" in rule.get("resources", [])]
    assert secrets == [("RoleBinding", MONITORING_NAMESPACE)]
    assert not [o["metadata"]["name"] for o in stack_objects if o["kind"] == "ClusterRole" and "grafana" in
                o["metadata"]["name"]]


def test_kube_state_metrics_reads_no_secret(stack_objects):
    (role,) = [o for o in stack_objects if o["kind"] == "ClusterRole" and "kube-state-metrics" in o["metadata"]["name"]]
    assert not [r for r in role["rules"] if "secrets" in r.get("resources", [])]
    assert role["rules"]  # it still reads the other objects


def test_every_grafana_datasource_points_at_a_service_the_chart_creates(stack_objects):
    services = {(o["metadata"]["name"], o["metadata"].get("namespace")) for o in stack_objects
                if o["kind"] == "Service"}
    sources = [d for o in stack_objects if o["kind"] == "ConfigMap" and "datasource" in o["metadata"]["name"]
               for text in o["data"].values() for d in yaml.safe_load(text).get("datasources", [])]
    assert [d["type"] for d in sources] == ["prometheus"]
    for source in sources:
        host = source["url"].split("//", 1)[1].split(":", 1)[0].split("/", 1)[0]
        name, _, namespace = host.partition(".")
        assert (name, namespace) in services, source


def test_dcgm_exporter_drops_every_capability(config):
    (spec,) = workloads_of(render(DCGM_EXPORTER, dcgm_exporter_values(config))).values()
    (container,) = spec["containers"]
    context = container["securityContext"]
    # An empty `add` replaces the chart's [SYS_ADMIN] (Helm merges maps but replaces lists).
    assert context["capabilities"] == {"add": [], "drop": ["ALL"]} and context["allowPrivilegeEscalation"] is False
    assert not spec.get("hostPID") and not context.get("privileged")


def test_dcgm_exporter_only_on_gpu_nodes_reading_the_agents_hostengine(config):
    (spec,) = workloads_of(render(DCGM_EXPORTER, dcgm_exporter_values(config))).values()
    assert spec["nodeSelector"] == {GPU_PRESENT_LABEL: "true"}
    assert GPU_TAINT.toleration() in spec["tolerations"]
    (container,) = spec["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["HOST_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    # Declared after HOST_IP, so the kubelet expands $(HOST_IP): the node's nv-hostengine (dcgm-server, hostPort 5555).
    names = [e["name"] for e in container["env"]]
    assert names.index("HOST_IP") < names.index("DCGM_REMOTE_HOSTENGINE_INFO")
    assert env["DCGM_REMOTE_HOSTENGINE_INFO"]["value"] == "$(HOST_IP):5555"


def test_default_stack_synthesizes_both_charts_pinned():
    from tests.stack_synth import synth
    from tests.test_stacks import helm_chart

    synth("default")
    for pin in (KUBE_PROMETHEUS_STACK, DCGM_EXPORTER):
        props = helm_chart("default", pin.chart)
        assert (props["Version"], props["Repository"], props["Namespace"]) == (pin.version, pin.repository,
                                                                               MONITORING_NAMESPACE)


# ---- 3. the Ray scrape: PodMonitor, pods in dist/, NetworkPolicy --------------------------------------------


def test_podmonitor_is_valid_against_the_charts_crd(objects):
    crd = yaml.safe_load((chart_folder(KUBE_PROMETHEUS_STACK) / "charts/crds/crds/crd-podmonitors.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    import jsonschema

    validator = jsonschema.Draft7Validator(validation.strict(version["schema"]["openAPIV3Schema"]))
    monitors = _kind(objects, "PodMonitor")
    assert set(monitors) == {"ray-efa-ray-metrics", "ray-efa-job-ray-metrics"}
    for monitor in monitors.values():
        assert not list(validator.iter_errors(monitor)), monitor["metadata"]["name"]


def _monitored(objects: list[dict]) -> list[tuple[dict, dict, dict]]:
    """(PodMonitor or None, pod as KubeRay labels it, its ray container) for every head and worker of both Ray
    clusters."""
    found = []
    specs = {o["metadata"]["name"]: o["spec"] if o["kind"] == "RayCluster" else o["spec"]["rayClusterSpec"]
             for o in objects if o["kind"] in ("RayCluster", "RayJob")}
    monitors = _kind(objects, "PodMonitor")
    for owner, spec in specs.items():
        templates = {"head": spec["headGroupSpec"]["template"]}
        templates.update({g["groupName"]: g["template"] for g in spec["workerGroupSpecs"]})
        for group, pod in ray_pods(spec, f"{owner}-generated").items():
            found.append((monitors.get(monitoring.pod_monitor_name(owner)), pod,
                          templates[group]["spec"]["containers"][0]))
    return found


def test_podmonitor_selects_every_ray_pod_on_its_named_metrics_port(objects, config):
    for monitor, pod, container in _monitored(objects):
        spec = monitor["spec"]
        assert pod["namespace"] in spec["namespaceSelector"]["matchNames"]
        assert selects(spec["selector"], pod["labels"])
        (endpoint,) = spec["podMetricsEndpoints"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports[endpoint["port"]] == RAY_METRICS_PORT


def test_ray_start_exports_metrics_on_the_declared_port(objects):
    for obj in objects:
        if obj["kind"] in ("RayCluster", "RayJob"):
            spec = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"]["rayClusterSpec"]
            for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
                assert group["rayStartParams"]["metrics-export-port"] == str(RAY_METRICS_PORT)


def test_podmonitor_selects_no_pod_of_the_other_ray_cluster(objects):
    pairs = _monitored(objects)
    for monitor, _, _ in pairs:
        owner = monitor["metadata"]["name"].removesuffix("-ray-metrics")
        for _, pod, _ in pairs:
            mine = pod["labels"][RAY_CLUSTER_LABEL].startswith(f"{owner}-generated")
            assert selects(monitor["spec"]["selector"], pod["labels"]) == mine


PROMETHEUS_POD = _pod({**PROMETHEUS_POD_LABELS, "app.kubernetes.io/managed-by": "prometheus-operator",
                       "prometheus": PROMETHEUS_NAME}, namespace=MONITORING_NAMESPACE)


def test_networkpolicy_admits_the_scraper_on_the_metrics_port_only(objects):
    policies = list(_kind(objects, "NetworkPolicy").values())
    for _, pod, _ in _monitored(objects):
        assert admitted(policies, pod, PROMETHEUS_POD, RAY_METRICS_PORT)
        assert not admitted(policies, pod, PROMETHEUS_POD, 6379)  # not the GCS
        for stranger in (STRANGER, OPERATOR, _pod(PROMETHEUS_POD_LABELS)):  # same labels, another namespace
            assert not admitted(policies, pod, stranger, RAY_METRICS_PORT), stranger


def test_stack_off_means_no_podmonitor_no_dashboards_no_scraper_rule(tmp_path):
    file = write_variant(tmp_path, {"observability": {"enabled": False}})
    config = load_config(file)
    objs = [o for chart in manifests(build_app(inputs(config, file))).values() for o in chart]
    assert not [o for o in objs if o["kind"] == "PodMonitor" or o["metadata"].get("namespace") == MONITORING_NAMESPACE]
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    for _, pod, _ in _monitored(objs):
        assert not admitted(policies, pod, PROMETHEUS_POD, RAY_METRICS_PORT)
    assert policy.scraper_peer() not in [peer for p in policies for rule in p["spec"]["ingress"]
                                         for peer in rule["from"]]


# ---- 4. dashboards as code --------------------------------------------------------------------------------


def test_committed_dashboards_are_what_the_code_and_installed_ray_generate():
    for name, dashboard in dashboards.dashboards().items():
        assert (dashboards.DASHBOARD_DIR / name).read_text() == dashboards.render(dashboard), (
            f"{name} is stale: run `python -m charts.dashboards`")


def test_ray_dashboards_filter_on_the_labels_the_podmonitor_sets():
    text = (dashboards.DASHBOARD_DIR / "ray-default.json").read_text()
    assert "ray_io_cluster" in text and "ray_io_cluster" in monitoring.RELABELED_POD_LABELS.values()


def _grafana(expr: str, run_name: str, rate_interval: str = "1m") -> str:
    """A panel's query as Grafana sends it for run `run_name` (the run selector and the rate window filled in)."""
    return expr.replace("$run_name", run_name).replace("$__rate_interval", rate_interval)


def test_every_overview_query_parses_with_promtool(tmp_path):
    """Syntax of every query, the GPU and EFA ones included (they have no local data): promtool loads them as
    recording rules."""
    if prometheus_missing():
        pytest.skip(prometheus_missing())
    rules = [{"record": f"panel:check_{i}_{j}", "expr": _grafana(t.expr, "x")}
             for i, panel in enumerate(dashboards.OVERVIEW_PANELS) for j, t in enumerate(panel.targets)]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "overview", "rules": rules}]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_gpu_and_efa_panels_name_the_metrics_they_need():
    needs = {t.needs for p in dashboards.OVERVIEW_PANELS for t in p.targets if t.source != "ray"}
    assert needs == {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "node_efa_hw_counter_total", "ray_fsdp_mfu"}
    for panel in dashboards.OVERVIEW_PANELS:
        for target in panel.targets:
            assert target.needs in target.expr, target


# ---- 5. a real Prometheus scraping a real local Ray Train run ----------------------------------------------

RUN = "obs-scrape"
PREDICTION = {"tokens_per_s": 1234.5, "mfu": 0.42}
# A few seconds of training with a checkpoint and a held-out score, reported every two steps.
JOB = dict(seq_len=32, micro_batch_size=2, global_batch_size=4, max_steps=4, warmup_steps=1, checkpoint_every=2,
           report_every=1, eval_every=2, learning_rate=3e-3, keep_checkpoints=1)
OVERVIEW_PNG = "OVERVIEW_PNG"
"""Environment variable: where the scrape test also draws the overview from its Prometheus (docs' picture:
`OVERVIEW_PNG=docs/observability-overview.png pytest tests/test_observability.py`)."""


# What a GPU node's exporters serve, for the overview's GPU and EFA panels: DCGM series as dcgm-exporter writes them
# (the counters of its default-counters.csv the panels use: DCGM_FI_DEV_GPU_UTIL %, DCGM_FI_DEV_FB_USED MiB; one series
# per GPU with `gpu` and `Hostname` labels, the ones the panels group by), and the EFA counters as
# stacks/efa_counters.sh writes them, produced by running the script itself on the fake sysfs tree of
# tests/test_efa_counters.py. Only a GPU node can show that the real exporters write these labels
# (docs/observability.md, "To check on a GPU").
GPU_NODE = "ip-10-0-0-7.us-east-2.compute.internal"


class _GpuNodeExporters(BaseHTTPRequestHandler):
    """Serves the DCGM series and the EFA script's file; each request is one scrape, the counters grow by 1 MB."""

    def do_GET(self):  # noqa: N802 (http.server's naming)
        body = self.server.exposition().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _gpu_node_exposition(sysfs: Path, hw: Path, out: Path, scrapes: list[int]) -> str:
    from tests.test_efa_counters import FIRST, run_script, set_counters

    scrapes.append(1)
    grown = {**FIRST, "tx_bytes": FIRST["tx_bytes"] + len(scrapes) * 1_000_000,
             "rx_bytes": FIRST["rx_bytes"] + len(scrapes) * 500_000}
    set_counters(hw, grown)
    result = run_script(sysfs, out, "--once")
    assert result.returncode == 0, result.stderr
    dcgm = []
    for name, value in (("DCGM_FI_DEV_GPU_UTIL", 97), ("DCGM_FI_DEV_FB_USED", 18_432)):
        dcgm.append(f"# TYPE {name} gauge")
        dcgm += [f'{name}{{gpu="{g}",UUID="GPU-{g}",device="nvidia{g}",modelName="NVIDIA L4",Hostname="{GPU_NODE}"}} '
                 f"{value}" for g in range(4)]
    return "\n".join(dcgm) + "\n" + (out / "efa.prom").read_text()


@pytest.fixture(scope="module")
def gpu_node(tmp_path_factory):
    """The loopback "GPU node" (its exporters' series), as a scrape config for the test's Prometheus."""
    from harness.loopback import ThreadedHTTPServer
    from tests.test_efa_counters import EFA_DEVICE, FIRST, _rdma_device

    root = tmp_path_factory.mktemp("gpu-node")
    sysfs, out = root / "sys", root / "textfile"
    out.mkdir()
    hw = _rdma_device(sysfs, EFA_DEVICE, "0000:00:06.0", "efa", FIRST)
    served = ThreadedHTTPServer(_GpuNodeExporters)
    scrapes: list[int] = []
    served.server.exposition = lambda: _gpu_node_exposition(sysfs, hw, out, scrapes)
    try:
        yield {"job_name": "gpu-node", "static_configs": [{"targets": [f"127.0.0.1:{served.port}"]}]}
    finally:
        served.close()


@pytest.fixture(scope="module")
def scraped_run(tmp_path_factory, config, gpu_node):
    """Start Ray, then Prometheus scraping Ray's metrics agent, then a Ray Train run; yield (server, start, end)."""
    if prometheus_missing():
        pytest.skip(prometheus_missing())
    ray = pytest.importorskip("ray")
    from workloads.fsdp_finetune.run_plan import local_plan
    from workloads.fsdp_finetune.trainer import run_training
    from workloads.local_ray import start_local_ray

    if ray.is_initialized():
        ray.shutdown()
    # Ray's agents report every 10 s by default; the run lasts seconds. Read at ray.init by every Ray process.
    saved = {k: os.environ.get(k) for k in ("RAY_metrics_report_interval_ms",)}
    os.environ["RAY_metrics_report_interval_ms"] = "500"
    start_local_ray()
    try:
        (node,) = [n for n in ray.nodes() if n["Alive"]]
        owner = "ray-efa-job"
        # The labels Kubernetes discovery would give the head pod, so the PodMonitor's relabelling runs as there.
        meta = {"__meta_kubernetes_pod_label_ray_io_cluster": f"{owner}-generated",
                "__meta_kubernetes_pod_label_ray_io_node_type": "head", "__meta_kubernetes_pod_node_name": "local"}
        scrape = monitoring.scrape_config(
            monitoring.pod_monitor_spec(config.model_copy(update={"observability": config.observability.model_copy(
                update={"scrape_interval_s": 1})}), owner),
            targets=[{"targets": [f"127.0.0.1:{node['MetricsExportPort']}"], "labels": meta}])
        with PrometheusServer([scrape, gpu_node]) as server:
            wait_for(lambda: any(t["health"] == "up" for t in server.active_targets()), 60, "Ray's metrics agent up")
            root = tmp_path_factory.mktemp("scrape")
            plan, _ = local_plan(root / "run", assets_dir=root / "assets", run_name=RUN, **JOB)
            plan.plan_prediction = PREDICTION
            # The local scrape's interval: the workers keep the final report's values up until a scrape has seen
            # them (prometheus.TrainingGauges.close), as they do for the cluster's Prometheus.
            plan.scrape_interval_s = 1
            start = time.time()
            result = run_training(plan)
            assert result.error is None
            # Scraped before the workers ended; the wait (bounded) only confirms it.
            wait_for(lambda: _final_loss(plan) in _scraped_losses(server, start, time.time()), 30,
                  "the final report's loss")
            # A range query evaluates at start + k * step <= end: one step past now covers the last sample.
            end = time.time() + 1.0
            if os.environ.get(OVERVIEW_PNG):
                dashboards.plot_overview(server.query_range, run_name=RUN, start=start, end=end,
                                         path=Path(os.environ[OVERVIEW_PNG]))
            yield server, start, end, plan
    finally:
        ray.shutdown()
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def _final_loss(plan) -> float:
    from workloads.fsdp_finetune.metrics import read_metrics

    return round([r for r in read_metrics(plan.metrics_path) if "loss" in r][-1]["loss"], 6)


def _scraped_losses(server, start: float, end: float) -> set[float]:
    series = server.query_range(f'ray_fsdp_loss{{{RUN_NAME_LABEL}="{RUN}"}}', start=start, end=end)
    return {round(float(v), 6) for one in series for _, v in one["values"]}


def _ray_targets():
    return [(p.title, t) for p in dashboards.OVERVIEW_PANELS for t in p.targets if t.source == "ray"]


@pytest.mark.slow
@pytest.mark.parametrize("title,target", _ray_targets(), ids=[f"{t.needs}" for _, t in _ray_targets()])
def test_overview_query_returns_series_of_the_run(scraped_run, title, target):
    server, start, end, _ = scraped_run
    series = server.query_range(_grafana(target.expr, RUN), start=start, end=end)
    assert series, f"{title}: {target.expr} returned nothing"
    for one in series:
        assert one["metric"][RUN_NAME_LABEL] == RUN, one["metric"]


@pytest.mark.parametrize("panel", dashboards.OVERVIEW_PANELS, ids=[p.title for p in dashboards.OVERVIEW_PANELS])
def test_every_overview_panel_returns_data(scraped_run, panel):
    """The Ray run, the DCGM series and the EFA script's counters through the same Prometheus: each panel of the
    overview (the project's dashboard in dist/dashboards.k8s.yaml) shows something. MFU's measured line needs a GPU
    (Ray Train reports it only there); its plan line is the data here."""
    server, start, end, _ = scraped_run
    answered = {t.expr: bool(server.query_range(_grafana(t.expr, RUN), start=start, end=end)) for t in panel.targets}
    assert any(answered.values()), f"{panel.title}: no target returned data: {answered}"
    if not panel.title.startswith("MFU"):
        assert all(answered.values()), f"{panel.title}: {answered}"


def test_the_final_reports_loss_is_scraped(scraped_run):
    """The last figures of a run that ends seconds after its last report still reach Prometheus."""
    server, start, end, plan = scraped_run
    assert _final_loss(plan) in _scraped_losses(server, start, end)


def test_series_carry_the_podmonitors_job_and_cluster_labels(scraped_run):
    server, start, end, _ = scraped_run
    (series,) = server.query_range(f'ray_fsdp_loss{{{RUN_NAME_LABEL}="{RUN}"}}', start=start, end=end)
    assert series["metric"]["job"] == RAY_METRICS_JOB
    assert series["metric"]["ray_io_cluster"] == "ray-efa-job-generated"
    assert series["metric"]["ray_node_type"] == "head"


def test_step_time_has_one_series_per_rank(scraped_run):
    server, start, end, _ = scraped_run
    series = server.query_range(f'ray_fsdp_rank_step_time_seconds{{{RUN_NAME_LABEL}="{RUN}"}}', start=start, end=end)
    assert sorted(s["metric"][RANK_LABEL] for s in series) == ["0", "1"]


def test_prometheus_has_the_values_of_metrics_jsonl(scraped_run):
    """The same figures go to Prometheus and metrics.jsonl: every scraped loss is a reported one; the plan's
    prediction as given."""
    from workloads.fsdp_finetune.metrics import read_metrics

    server, start, end, plan = scraped_run
    rows = read_metrics(plan.metrics_path)
    assert "data_wait_s" in rows[-1] and "checkpoint_s" in rows[-1]
    reported = {round(r["loss"], 6) for r in rows if "loss" in r}
    (loss,) = server.query_range(f'ray_fsdp_loss{{{RUN_NAME_LABEL}="{RUN}"}}', start=start, end=end)
    scraped = {round(float(v), 6) for _, v in loss["values"]}
    assert scraped <= reported and len(scraped) >= 2, (scraped, reported)
    (predicted,) = server.query_range(f'ray_fsdp_plan_prediction{{quantity="tokens_per_s",{RUN_NAME_LABEL}="{RUN}"}}',
                                      start=start, end=end)
    assert float(predicted["values"][-1][1]) == PREDICTION["tokens_per_s"]
    # Drawn beside the measured figure for the whole run, not only when it was set at the start.
    assert float(predicted["values"][-1][0]) >= float(loss["values"][-1][0]) - 1.0  # within a scrape


def test_the_local_target_is_scraped_with_the_podmonitors_job_path_and_interval(scraped_run):
    """The local scrape config came from the PodMonitor spec: same job, path, relabelling (interval: the file's)."""
    server, *_ = scraped_run
    # One Ray target; the loopback "GPU node" (DCGM and EFA series for the dashboard's panels) is scraped beside it.
    (target,) = [t for t in server.active_targets() if t["labels"]["job"] == RAY_METRICS_JOB]
    assert target["labels"]["node"] == "local"
    assert target["scrapeUrl"].endswith(monitoring.METRICS_PATH) and target["scrapeInterval"] == "1s"


def test_final_values_are_held_one_export_and_one_scrape_past_the_last_report():
    from workloads.fsdp_finetune.prometheus import REFRESH_S, hold_seconds

    assert hold_seconds(15, 10.0) == 15 + 10.0 + REFRESH_S  # the cluster's defaults: 26 s after the last report
    assert hold_seconds(None, 10.0) == 0.0  # nothing scrapes a local run's metrics: no wait


def test_the_cluster_plan_holds_for_the_files_scrape_interval(config, tmp_path):
    from workloads.fsdp_finetune.run_plan import cluster_plan

    assert cluster_plan(config, bucket="b").scrape_interval_s == config.observability.scrape_interval_s
    off = load_config(write_variant(tmp_path, {"observability": {"enabled": False}}))
    assert cluster_plan(off, bucket="b").scrape_interval_s is None


@pytest.mark.parametrize("rank", [0, 1])
def test_gauges_stop_refreshing_on_close_on_every_rank(rank):
    pytest.importorskip("ray")
    from workloads.fsdp_finetune.prometheus import TrainingGauges

    gauges = TrainingGauges("close-test", rank=rank, plan_prediction=PREDICTION)
    assert gauges._thread.is_alive()
    gauges.close()
    assert not gauges._thread.is_alive()
    assert bool(gauges.run) == (rank == 0)


@pytest.mark.slow
def test_an_ec2_run_does_not_hold_its_last_metrics(config):
    """Only the EKS target has the metrics stack: on EC2 nothing scrapes, so the end of a run waits for nothing."""
    from config.target import with_target
    from workloads.fsdp_finetune.run_plan import cluster_plan

    assert config.observability.enabled
    assert cluster_plan(with_target(config, "ec2"), bucket="b").scrape_interval_s is None


def test_the_deploy_steps_apply_the_dashboards():
    """docs/deploying.md's deploy block applies dist/dashboards.k8s.yaml after `cdk deploy` (the stack's Grafana
    loads the ConfigMaps in it); README's steps point there."""
    text = (REPO / "docs" / "deploying.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    lines = [line.split("#")[0].strip() for line in block.splitlines()]
    deploy = lines.index("npx cdk deploy --all")
    assert lines.index("kubectl apply --server-side -f dist/dashboards.k8s.yaml") > deploy
