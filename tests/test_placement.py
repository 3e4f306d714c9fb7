"""Every DaemonSet, Deployment and Ray pod can be placed where it must run, checked against the real charts.

For each shipped variable file (config/cluster.yaml and config/examples/*), and tests/stack_synth.py's "alt"
variant (the only one with the CloudWatch add-on on), the CDK app is synthesized, each
pinned chart (../shared/charts, verified by tests/vendored.py) is rendered by the helm of the kubectl Lambda's
layer (tests/helm.py) with exactly the values in the template's `Custom::AWSCDK-EKS-HelmChart` resources and the
node monitoring agent add-on's `ConfigurationValues`, and the Ray manifests come from the cdk8s app (what
`cdk8s synth` writes to dist/). Placement is then decided by Kubernetes' rules on the node groups the template
declares, with nodeadm's allocatable less the DaemonSets on each node (tests/placement.py).

Adding a chart: one line in tests/vendored.py CHARTS, and one line per DaemonSet/Deployment it renders in
PLACEMENT below (a rendered workload without a line fails `test_every_rendered_workload_has_a_placement_rule`).
The other managed add-ons (vpc-cni, kube-proxy, coredns, eks-pod-identity-agent, and amazon-cloudwatch-observability
when the file turns it on) ship no chart here: their pods come from tests/managed_addons.py, which restates them
from upstream sources for the pinned add-on versions, keyed `<namespace>/<name>`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache

import pytest

from charts.charts import build_app, inputs, manifests
from config import ClusterConfig, load_config
from config.k8s import EFA_RESOURCE, GPU_RESOURCE
from config.observability import EFA_SIDECAR_REQUESTS
from stacks.versions import NODE_MONITORING_AGENT_CHART
from tests.helm import template as helm_template
from tests.helpers import EXAMPLES
from tests.managed_addons import ADDON_WORKLOADS, READ_AT, REPLICAS
from tests.placement import (
    NodeGroup,
    Workload,
    daemonsets_on,
    free_for_pods,
    node_groups,
    placeable,
    pod_requests,
    quantity,
    shortfall,
    workloads,
)
from tests.stack_synth import synth, variant_file
from tests.vendored import CHARTS, ChartsUnavailable, chart_dir

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)

# config/cluster.yaml (the "default" variant) and every example. tests/stack_synth.py's "socket" variant is the
# example with a private-only endpoint, which changes nothing here.
SHIPPED = ["default", *sorted(p.stem for p in EXAMPLES.glob("*.yaml"))]
# No shipped file turns `cluster.cloudwatch_observability` on; tests/stack_synth.py's "alt" variant does.
FILES = [*SHIPPED, "alt"]

# Where each rendered workload must run: "all" node groups, every "gpu" group, "system" nodes only (and never a
# GPU node), or "none" (a DaemonSet for nodes this project never labels).
PLACEMENT = {
    "DaemonSet/nvidia-device-plugin": "gpu",
    # Only for nodes labelled nvidia.com/mps.capable=true (GPU Feature Discovery's MPS label; not used here).
    "DaemonSet/nvidia-device-plugin-mps-control-daemon": "none",
    "DaemonSet/aws-efa-k8s-device-plugin": "gpu",
    "DaemonSet/eks-node-monitoring-agent": "all",
    # DCGM for the agent's GPU checks: without it on a GPU node, AcceleratedHardwareReady turns False and node
    # auto-repair replaces the node (aws/containers-roadmap#2567).
    "DaemonSet/dcgm-server": "gpu",
    "Deployment/kuberay-operator": "system",
    "Deployment/cluster-autoscaler": "system",
    # The run's watchdog (charts/watchdog.py): a CPU-only poller; on a GPU node it would keep that node from
    # scaling down after the run, which is what it exists to prevent.
    "Deployment/watchdog": "system",
    "DaemonSet/image-prepull": "all",
    # The metrics stack (observability): node exporter on every node (it tolerates the GPU taint), dcgm-exporter on
    # the GPU nodes, the rest on the system nodes. Prometheus itself is a StatefulSet the operator makes from the
    # Prometheus object (nodeSelector: system), not a rendered workload.
    "DaemonSet/kube-prometheus-stack-prometheus-node-exporter": "all",
    "DaemonSet/dcgm-exporter": "gpu",
    "Deployment/kps-operator": "system",
    "Deployment/kps-grafana": "system",
    "Deployment/kube-prometheus-stack-kube-state-metrics": "system",
    # EKS managed add-ons without a chart here (tests/managed_addons.py). CoreDNS tolerates no GPU taint, so it must
    # find room on the system nodes before anything that resolves a name can start.
    "DaemonSet/kube-system/aws-node": "all",
    "DaemonSet/kube-system/kube-proxy": "all",
    "DaemonSet/kube-system/eks-pod-identity-agent": "all",
    "Deployment/kube-system/coredns": "system",
    "Deployment/amazon-cloudwatch/amazon-cloudwatch-observability-controller-manager": "system",
    "DaemonSet/amazon-cloudwatch/cloudwatch-agent": "all",
    "DaemonSet/amazon-cloudwatch/fluent-bit": "all",
    "DaemonSet/amazon-cloudwatch/dcgm-exporter": "gpu",
    # Trainium and Inferentia types only.
    "DaemonSet/amazon-cloudwatch/neuron-monitor": "none",
}
# Rendered only when the file asks for it.
PRESENT_WHEN = {
    "DaemonSet/aws-efa-k8s-device-plugin": lambda c: c.nccl.transport == "efa",
    "Deployment/cluster-autoscaler": lambda c: c.autoscaling.enabled,
    "DaemonSet/image-prepull": lambda c: c.ray.prepull_image,
    "DaemonSet/kube-prometheus-stack-prometheus-node-exporter": lambda c: c.observability.enabled,
    "DaemonSet/dcgm-exporter": lambda c: c.observability.enabled and c.observability.dcgm_exporter,
    "Deployment/kps-operator": lambda c: c.observability.enabled,
    "Deployment/kps-grafana": lambda c: c.observability.enabled,
    "Deployment/kube-prometheus-stack-kube-state-metrics": lambda c: c.observability.enabled,
    **{f"{w.kind}/{w.name}": lambda c: c.cluster.cloudwatch_observability
       for w in ADDON_WORKLOADS["amazon-cloudwatch-observability"]},
}
# Extended resources a device plugin advertises on the nodes its DaemonSet runs on.
ADVERTISED = {"DaemonSet/nvidia-device-plugin": GPU_RESOURCE, "DaemonSet/aws-efa-k8s-device-plugin": EFA_RESOURCE}


def chart_folder(name: str):
    try:
        return chart_dir(name)
    except ChartsUnavailable as exc:
        pytest.skip(str(exc))


@cache
def _render(folder_name: str, release: str, namespace: str, values_json: str, kube_version: str) -> tuple:
    objects = helm_template(chart_folder(folder_name), release=release, namespace=namespace,
                            values=json.loads(values_json), kube_version=kube_version)
    return tuple(workloads(objects, folder_name))


def releases(name: str) -> list[tuple[str, str, str, str]]:
    """(chart folder, release, namespace, values JSON) for every chart the cluster template installs: the Helm
    custom resources, and the node monitoring agent add-on's chart with its configuration values."""
    out = []
    for res in synth(name).templates["cluster"]["Resources"].values():
        props = res["Properties"] if res["Type"] in ("Custom::AWSCDK-EKS-HelmChart", "AWS::EKS::Addon") else None
        if props is None:
            continue
        if res["Type"] == "Custom::AWSCDK-EKS-HelmChart":
            out.append((f"{props['Chart']}-{props['Version']}", props["Release"], props["Namespace"],
                        props.get("Values") or "{}"))
        elif props["AddonName"] == "eks-node-monitoring-agent":
            out.append((f"eks-node-monitoring-agent-{NODE_MONITORING_AGENT_CHART}", "eks-node-monitoring-agent",
                        "kube-system", props.get("ConfigurationValues") or "{}"))
    return out


def addons(name: str) -> dict[str, dict]:
    """The template's managed add-ons: name -> properties."""
    return {res["Properties"]["AddonName"]: res["Properties"]
            for res in synth(name).templates["cluster"]["Resources"].values() if res["Type"] == "AWS::EKS::Addon"}


@cache
def config_of(name: str) -> ClusterConfig:
    return synth(name).config


@cache
def dist_objects(name: str) -> list[dict]:
    file = variant_file(name)
    charts = manifests(build_app(inputs(load_config(file), file)))
    return [obj for objs in charts.values() for obj in objs]


@cache
def all_workloads(name: str) -> list[Workload]:
    """Every DaemonSet and Deployment: the rendered charts', the chartless managed add-ons', then dist/'s."""
    kube_version = config_of(name).cluster.kubernetes_version
    rendered = [w for rel in releases(name) for w in _render(*rel, kube_version)]
    rendered += [w for addon in addons(name) for w in ADDON_WORKLOADS.get(addon, [])]
    # dist/'s objects are named after the cluster; the rule is per role (`ray-efa-image-prepull` -> `image-prepull`).
    prefix = f"{config_of(name).cluster.name}-"
    return rendered + [replace(w, name=w.name.removeprefix(prefix)) for w in workloads(dist_objects(name), "dist")]


@cache
def groups(name: str) -> list[NodeGroup]:
    return node_groups(synth(name).templates["cluster"])


def targets(name: str, where: str) -> list[NodeGroup]:
    return {"all": groups(name), "gpu": [g for g in groups(name) if g.is_gpu],
            "system": [g for g in groups(name) if not g.is_gpu], "none": []}[where]


def workload(name: str, key: str) -> Workload:
    found = [w for w in all_workloads(name) if w.key == key]
    if not found:
        pytest.fail(f"{key} is not rendered for {name}, though PRESENT_WHEN says the file installs it")
    (w,) = found
    return w


# KubeRay v1.7.0 appends this container to the head pod of a RayJob in SidecarMode
# (ray-operator/controllers/ray/rayjob_controller.go, "Inject a submitter container into the head Pod";
# its resources: ray-operator/controllers/ray/common/job.go `GetDefaultSubmitterContainer`).
SIDECAR_SUBMITTER = {"name": "ray-job-submitter", "resources": {
    "requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}


def ray_pods(name: str) -> dict[str, dict[str, dict]]:
    """By object (the RayCluster, the RayJob's own cluster): the head's and each worker group's pod spec as
    KubeRay creates them."""
    out = {}
    for obj in dist_objects(name):
        if obj["kind"] not in ("RayCluster", "RayJob"):
            continue
        spec = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"]["rayClusterSpec"]
        head = spec["headGroupSpec"]["template"]["spec"]
        if obj["kind"] == "RayJob" and obj["spec"].get("submissionMode") == "SidecarMode":
            head = {**head, "containers": [*head["containers"], SIDECAR_SUBMITTER]}
        out[obj["kind"]] = {"head": head, **{g["groupName"]: g["template"]["spec"] for g in spec["workerGroupSpecs"]}}
    return out


def fmt(need: dict) -> str:
    return ", ".join(f"{k} short by {float(v):g}" for k, v in sorted(need.items()))


CASES = [(f, k) for f in FILES for k in PLACEMENT]


@cache
def _file_config(name: str) -> ClusterConfig:
    """The variant's variable file, loaded (no synthesis) at collection."""
    return load_config(variant_file(name))


# The combinations that exist: a workload the file does not install is not generated for the placement tests
# (rather than generated and skipped); test_workload_is_rendered_as_the_file_asks checks PRESENT_WHEN on every
# combination, so a workload missing from a file that should install it still fails there.
PRESENT = [(f, k) for f, k in CASES if PRESENT_WHEN.get(k, lambda c: True)(_file_config(f))]


# ---- the charts are the pinned copies ----------------------------------------------------------

@pytest.mark.parametrize("name", FILES)
def test_every_chart_the_template_installs_is_a_pinned_copy(name):
    folders = [rel[0] for rel in releases(name)]
    assert folders and all(f in CHARTS for f in folders), [f for f in folders if f not in CHARTS]


@pytest.mark.parametrize("name", FILES)
def test_chartless_addon_pods_were_read_for_the_pinned_add_on_version(name):
    """Every managed add-on the template installs, but the node monitoring agent (whose chart is rendered), has its
    pods in tests/managed_addons.py, read for exactly the version the template pins."""
    pinned = {addon: props.get("AddonVersion") for addon, props in addons(name).items()
              if addon != "eks-node-monitoring-agent"}
    assert pinned == {addon: READ_AT.get(addon) for addon in pinned}


@pytest.mark.parametrize("name", FILES)
def test_every_rendered_workload_has_a_placement_rule(name):
    assert {w.key for w in all_workloads(name)} <= set(PLACEMENT), \
        sorted({w.key for w in all_workloads(name)} - set(PLACEMENT))


@pytest.mark.parametrize(("name", "key"), CASES)
def test_workload_is_rendered_as_the_file_asks(name, key):
    expected = PRESENT_WHEN.get(key, lambda c: True)(config_of(name))
    assert (key in {w.key for w in all_workloads(name)}) == expected


# ---- taints, tolerations, node selectors and affinity ------------------------------------------

@pytest.mark.parametrize(("name", "key"), PRESENT)
def test_workload_can_be_placed_on_every_node_group_it_must_run_on(name, key):
    w = workload(name, key)
    refused = [g.name for g in targets(name, PLACEMENT[key]) if not placeable(w.pod_spec, g)]
    assert not refused, f"{key} ({w.source}) cannot be placed on {refused}"


@pytest.mark.parametrize(("name", "key"), [c for c in PRESENT if PLACEMENT[c[1]] in ("system", "none")])
def test_system_workload_is_never_placed_on_a_gpu_node(name, key):
    w = workload(name, key)
    on_gpu = [g.name for g in groups(name) if g.is_gpu and placeable(w.pod_spec, g)]
    assert not on_gpu, f"{key} could be placed on GPU node group(s) {on_gpu}"


@pytest.mark.parametrize("name", FILES)
def test_ray_head_is_placed_on_system_nodes_only(name):
    for kind, pods in ray_pods(name).items():
        assert [g.is_gpu for g in groups(name) if placeable(pods["head"], g)] == [False], kind


@pytest.mark.parametrize("name", FILES)
def test_each_ray_worker_group_is_placed_on_its_own_node_group_only(name):
    for kind, pods in ray_pods(name).items():
        for group_name, spec in pods.items():
            if group_name != "head":
                assert [g.name for g in groups(name) if placeable(spec, g)] == [group_name], kind


# ---- requests against allocatable ---------------------------------------------------------------

@pytest.mark.parametrize("name", FILES)
def test_daemonsets_fit_the_allocatable_of_every_node(name):
    for group in groups(name):
        left = free_for_pods(group, all_workloads(name), ADVERTISED)
        assert all(v >= 0 for v in left.values()), (
            f"{group.name}: DaemonSets {[w.key for w in daemonsets_on(group, all_workloads(name))]} exceed "
            f"allocatable: {fmt({k: -v for k, v in left.items() if v < 0})}")


@pytest.mark.parametrize(("name", "key"), [c for c in PRESENT if PLACEMENT[c[1]] == "system"])
def test_system_deployment_fits_a_system_node_beside_its_daemonsets(name, key):
    w = workload(name, key)
    for group in targets(name, "system"):
        need = shortfall([pod_requests(w.pod_spec)], free_for_pods(group, all_workloads(name), ADVERTISED))
        assert not need, f"{key} on {group.name}: {fmt(need)}"


@pytest.mark.parametrize(("name", "key"), [(f, k) for f in FILES for k in REPLICAS if (f, k) in PRESENT])
def test_every_replica_of_an_addon_deployment_fits_one_system_node_beside_its_daemonsets(name, key):
    """CoreDNS's pod anti-affinity is only preferred, so both its replicas may share a system node."""
    w = workload(name, key)
    for group in targets(name, "system"):
        need = shortfall([pod_requests(w.pod_spec)] * REPLICAS[key],
                         free_for_pods(group, all_workloads(name), ADVERTISED))
        assert not need, f"{REPLICAS[key]} x {key} on {group.name}: {fmt(need)}"


@pytest.mark.parametrize("name", FILES)
def test_ray_head_fits_a_system_node_beside_its_daemonsets(name):
    """The RayJob's head includes KubeRay's submitter sidecar."""
    for kind, pods in ray_pods(name).items():
        for group in targets(name, "system"):
            need = shortfall([pod_requests(pods["head"])], free_for_pods(group, all_workloads(name), ADVERTISED))
            assert not need, f"{kind} head on {group.name} ({group.instance_type}): {fmt(need)}"


@pytest.mark.parametrize("name", FILES)
def test_ray_workers_of_a_node_fit_its_allocatable_beside_its_daemonsets(name):
    """`pods_per_node` worker pods on one node: CPU, memory, pod slots, and the GPUs, EFA devices and huge
    pages the device plugins and the node's user data make allocatable."""
    config = config_of(name)
    for kind, pods in ray_pods(name).items():
        for wg in config.cluster.worker_groups:
            (group,) = [g for g in groups(name) if g.name == wg.name]
            requests = [pod_requests(pods[wg.name])] * config.pods_per_node(wg)
            need = shortfall(requests, free_for_pods(group, all_workloads(name), ADVERTISED))
            assert not need, (f"{kind}: {config.pods_per_node(wg)} Ray worker pod(s) on {wg.name} "
                              f"({wg.instance_type}): {fmt(need)}")


def test_node_exporters_pod_requests_are_its_efa_sidecars():
    """The EFA counters sidecar's requests are in the DaemonSet's pod on every node (so in the fit checks above);
    node exporter's own container requests nothing (prometheus-node-exporter 4.56.1 values.yaml `resources: {}`)."""
    spec = workload("default", "DaemonSet/kube-prometheus-stack-prometheus-node-exporter").pod_spec
    cpu_m, mem_mib = EFA_SIDECAR_REQUESTS
    assert pod_requests(spec) == {"cpu": quantity(f"{cpu_m}m"), "memory": quantity(f"{mem_mib}Mi")}
