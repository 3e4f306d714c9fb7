"""Putting a synthesized variable file on the lab: its node groups as nodes, its dist/ manifests applied."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from config.k8s import ROLE_LABEL, WORKER_GROUP_LABEL
from harness.waiting import wait_for
from tests import k8s_lab

# The PodMonitor CRD comes with kube-prometheus-stack, which the cluster stack installs before the manifests are
# applied (stacks: observability); the lab has only KubeRay's CRDs.
PROMETHEUS_CHART = "kube-prometheus-stack-88.5.3"
PODMONITOR_CRD = "charts/crds/crds/crd-podmonitors.yaml"

BASE = "ray-base.k8s.yaml"
JOB = "ray-job.k8s.yaml"
CLUSTER = "ray-cluster.k8s.yaml"
DASHBOARDS = "dashboards.k8s.yaml"


def install_addon_crds(lab: k8s_lab.Lab) -> None:
    from tests.vendored import chart_dir

    crds = k8s_lab.load_manifests(chart_dir(PROMETHEUS_CHART) / PODMONITOR_CRD)
    lab.apply(crds)

    def served():
        try:
            lab.dynamic.resources.invalidate_cache() if hasattr(lab.dynamic.resources, "invalidate_cache") else None
            lab.dynamic.resources.get(api_version="monitoring.coreos.com/v1", kind="PodMonitor")
            return True
        except Exception:  # noqa: BLE001 - the discovery cache raises ResourceNotFoundError until it is served
            return False

    wait_for(served, 30, "the PodMonitor CRD to be served", interval_s=0.5)


def manifests(dist: Path, *files: str) -> list[dict]:
    return [obj for name in files if (dist / name).exists() for obj in k8s_lab.load_manifests(dist / name)]


def create_nodes(lab: k8s_lab.Lab, synth, prefix: str) -> dict[str, k8s_lab.NodeShape]:
    """Every node group at its maximum size, as nodes named <prefix>-<group>-<n>; {node name: shape}."""
    nodes = {}
    for shape in k8s_lab.node_shapes(synth.templates):
        for index in range(shape.count):
            name = f"{prefix}-{shape.labels.get(WORKER_GROUP_LABEL) or shape.labels.get(ROLE_LABEL)}-{index}"
            lab.create_node(name, shape, zone=synth.config.gpu_availability_zone)
            nodes[name] = shape
    return nodes


def delete_nodes(lab: k8s_lab.Lab, names) -> None:
    for name in names:
        lab.core.delete_node(name)


def namespace_pods(lab: k8s_lab.Lab, namespace: str, selector: str = "") -> list:
    return lab.core.list_namespaced_pod(namespace, label_selector=selector).items


def remove(lab: k8s_lab.Lab, objects: list[dict], namespace: str) -> None:
    """Delete what was applied (the namespace stays: its finalization would outlast the test) and wait until no
    pod is left in it."""
    lab.delete([o for o in objects if o["kind"] != "Namespace"])
    from kubernetes.client.exceptions import ApiException

    for job in lab.batch.list_namespaced_job(namespace).items:
        try:
            lab.batch.delete_namespaced_job(job.metadata.name, namespace, propagation_policy="Background")
        except ApiException as exc:  # the garbage collector may have taken it with its RayJob already
            if exc.status != 404:
                raise
    def left():
        # DaemonSet pods of what stays applied (ray-base's image pre-pull) are not the test's to wait for.
        return [p.metadata.name for p in namespace_pods(lab, namespace)
                if not any(o.kind == "DaemonSet" for o in p.metadata.owner_references or [])
                or any(o["kind"] == "DaemonSet" for o in objects)]

    wait_for(lambda: not left(), 120, f"every pod in {namespace} to be gone", detail=lambda: f": {left()}")


def rayjob(lab: k8s_lab.Lab, namespace: str, name: str) -> dict:
    return lab.custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", name)


def rayjob_status(lab: k8s_lab.Lab, namespace: str, name: str) -> dict:
    return rayjob(lab, namespace, name).get("status") or {}


def placement(lab: k8s_lab.Lab, config, namespace: str, cluster_selector: str) -> dict:
    """Where the Ray pods of one cluster landed: {"head": [node], group: Counter(node -> pods)}, and the pods that
    are not Running."""
    out = {"head": [], "not_running": []}
    for pod in namespace_pods(lab, namespace, cluster_selector):
        labels = pod.metadata.labels
        if pod.status.phase != "Running":
            out["not_running"].append(pod.metadata.name)
        if labels.get("ray.io/node-type") == "head":
            out["head"].append(pod.spec.node_name)
        else:
            out.setdefault(labels["ray.io/group"], Counter())[pod.spec.node_name] += 1
    return out


def planned(config, nodes: dict[str, k8s_lab.NodeShape], found: dict) -> list[str]:
    """What differs between `found` (placement()) and the plan: the head on a system node; each worker group's
    `pods(group)` pods on its own group's nodes, `pods_per_node(group)` on each; every pod Running."""
    problems = []
    system = {n for n, s in nodes.items() if s.labels.get(ROLE_LABEL) == "system"}
    if len(found["head"]) != 1 or found["head"][0] not in system:
        problems.append(f"head on {found['head']}, expected one on a system node {sorted(system)}")
    for group in config.cluster.worker_groups:
        own = {n for n, s in nodes.items() if s.labels.get(WORKER_GROUP_LABEL) == group.name}
        got = found.get(group.name, Counter())
        if sum(got.values()) != config.pods(group):
            problems.append(f"group {group.name}: {sum(got.values())} pods, planned {config.pods(group)}")
        if set(got) - own:
            problems.append(f"group {group.name}: pods on {sorted(set(got) - own)}, not its nodes {sorted(own)}")
        if any(count != config.pods_per_node(group) for count in got.values()):
            problems.append(f"group {group.name}: {dict(got)} pods per node, planned {config.pods_per_node(group)}")
    if found["not_running"]:
        problems.append(f"not Running: {found['not_running']}")
    return problems


def wait_placed(lab, config, nodes, namespace, selector, timeout_s=60) -> dict:
    last = {}

    def settled():
        last.update(placement(lab, config, namespace, selector))
        return not planned(config, nodes, last)

    try:
        wait_for(settled, timeout_s, "the Ray pods to be placed as planned", interval_s=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {planned(config, nodes, last)}") from None
    return last


def scheduling_events(lab: k8s_lab.Lab, namespace: str) -> list[str]:
    """The scheduler's own FailedScheduling messages in `namespace`."""
    events = lab.core.list_namespaced_event(namespace, field_selector="reason=FailedScheduling").items
    return [f"{e.involved_object.name}: {e.message}" for e in events]


class Timeline:
    """What happened when, relative to the scenario's start; printed as the test goes (`pytest -s` shows it)."""

    def __init__(self, name: str):
        self.name, self.t0, self.entries = name, time.monotonic(), []

    def __call__(self, what: str) -> float:
        at = time.monotonic() - self.t0
        self.entries.append((round(at, 1), what))
        print(f"[{self.name} +{at:6.1f}s] {what}", flush=True)
        return at
