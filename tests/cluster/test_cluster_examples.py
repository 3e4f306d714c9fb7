"""Every example variable file's real dist/ on the real API server and scheduler, placed as the plan says."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest
import yaml

from harness.waiting import wait_for
from tests.cluster import deploy
from tests.cluster.conftest import CLUSTER_MARKS, CONFIGS, REPO, synthesized

pytestmark = CLUSTER_MARKS


@pytest.fixture(scope="module")
def crds(lab):
    deploy.install_addon_crds(lab)
    return lab


def _namespaces(objects: list[dict]) -> list[str]:
    """Namespaces the manifests use that they do not create: the Helm releases' (`monitoring` for the
    dashboards), which the cluster stack creates (create_namespace=True)."""
    own = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    return sorted({o["metadata"]["namespace"] for o in objects if o["metadata"].get("namespace")} - own)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_example_dry_runs_applies_and_places(crds, name):
    lab = crds
    synth = synthesized(name)
    config, ns = synth.config, synth.config.ray.namespace
    files = [deploy.BASE, deploy.DASHBOARDS, deploy.CLUSTER, deploy.JOB]
    everything = deploy.manifests(synth.dist, *files)
    for namespace in _namespaces(everything) + [o["metadata"]["name"] for o in everything if o["kind"] == "Namespace"]:
        lab.ensure_namespace(namespace)
    # The API server's dry run of every object: schema (the CRDs' too), defaulting and admission; nothing stored.
    lab.apply(everything, dry_run=True)

    nodes = deploy.create_nodes(lab, synth, name)
    applied = deploy.manifests(synth.dist, deploy.BASE, deploy.DASHBOARDS, deploy.JOB)
    try:
        lab.apply(applied)
        placed = deploy.wait_placed(lab, config, nodes, ns, "ray.io/is-ray-node=yes")
        print(f"{name}: {placed}")
        # The operator goes on to create the submitter Job once the cluster is ready; its pod runs on a system
        # node, never holding a GPU node's capacity.
        (job_name,) = [o["metadata"]["name"] for o in applied if o["kind"] == "RayJob"]

        def submitter():
            return [p for p in deploy.namespace_pods(lab, ns, f"batch.kubernetes.io/job-name={job_name}")
                    if p.status.phase == "Running"]

        (pod,) = wait_for(submitter, 60, f"the submitter Job {job_name}'s pod to run")
        assert nodes[pod.spec.node_name].labels.get("ray-efa.io/role") == "system"
        pending = [p.metadata.name for p in deploy.namespace_pods(lab, ns) if p.status.phase != "Running"]
        assert pending == [], deploy.scheduling_events(lab, ns)
    finally:
        deploy.remove(lab, applied, ns)
        deploy.delete_nodes(lab, nodes)


def test_a_config_that_cannot_fit_is_refused_and_the_scheduler_says_why(crds, tmp_path):
    """A head larger than the system node: `config check` refuses the file; the manifests it would give (the same
    builder, the refused value forced past the check) leave the head Pending with the scheduler's own reason."""
    lab = crds
    data = yaml.safe_load(CONFIGS["cluster"].read_text())
    data["ray"]["head"]["memory_gib"] = 40
    bad = tmp_path / "big-head.yaml"
    bad.write_text(yaml.safe_dump(data))
    check = subprocess.run([sys.executable, "-m", "config", "check", str(bad)], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert check.returncode == 2 and "does not fit a m7i.2xlarge" in check.stderr, check.stderr

    from charts.__main__ import synthesize

    good = synthesized("cluster")
    config = good.config
    forced = config.model_copy(update={"ray": config.ray.model_copy(
        update={"head": config.ray.head.model_copy(update={"memory_gib": 40})})})
    # What the loader derived from the good file (cached properties: head_resources, ...) is derived again.
    for cls in type(forced).__mro__:
        for name, attr in vars(cls).items():
            if isinstance(attr, functools.cached_property):
                forced.__dict__.pop(name, None)
    dist = tmp_path / "dist"
    synthesize(forced, bad, dist)
    ns = config.ray.namespace
    lab.ensure_namespace(ns)
    nodes = deploy.create_nodes(lab, good, "unfit")
    applied = deploy.manifests(dist, deploy.BASE, deploy.JOB)
    try:
        lab.apply(applied)

        # The scheduler's per-node verdict ("0/4 nodes are available: ..."); a "no nodes available" event can come
        # first when its cache has not seen the new nodes yet (seen once under load), and is followed by this one.
        def reason():
            return [m for m in deploy.scheduling_events(lab, ns) if "-head-" in m and "nodes are available" in m]

        def seen() -> str:
            pods = [(p.metadata.name, p.status.phase) for p in deploy.namespace_pods(lab, ns)]
            events = [(e.reason, e.involved_object.name, e.message) for e in lab.core.list_namespaced_event(ns).items]
            return f": pods {pods}, events {events}"

        messages = wait_for(reason, 60, "a FailedScheduling event for the head pod", interval_s=0.5, detail=seen)
        print("scheduler:", messages[0])
        assert "Insufficient memory" in messages[0]
        assert [p.status.phase for p in deploy.namespace_pods(lab, ns, "ray.io/node-type=head")] == ["Pending"]
    finally:
        deploy.remove(lab, applied, ns)
        deploy.delete_nodes(lab, nodes)
