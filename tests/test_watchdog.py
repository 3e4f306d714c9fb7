"""The watchdog's rules (`workloads.watchdog`), the shared stop decision (`workloads.stopping`), its chart
(`charts.watchdog`), the worker pods' node-lost tolerations and the config fields and rule behind them.

The rules are pure functions of API-server JSON and a clock, so each case is the objects as the API server returns
them; the cluster tier (tests/cluster/test_cluster_watchdog.py) runs the same code against the real operator.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest

from config import ConfigError, load_config
from tests.helpers import REPO, write_variant
from workloads import stopping
from workloads.watchdog import (
    Settings,
    Snapshot,
    decide,
    head_rule,
    node_lost_rule,
    parse_time,
    stopped_rule,
    submitter_rule,
)

NOW = 1_800_000_000.0
S = Settings(namespace="ray", rayjob="ray-efa-job", submitter_start_s=180, head_restart_limit=3, head_ready_s=600,
             node_lost_s=60)


def ts(seconds_ago: float) -> str:
    return datetime.fromtimestamp(NOW - seconds_ago, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rayjob(deployment="Running", job_status="RUNNING", cluster="ray-efa-job-abc", deleting=False) -> dict:
    meta = {"name": "ray-efa-job", "namespace": "ray", **({"deletionTimestamp": ts(1)} if deleting else {})}
    return {"metadata": meta, "status": {"jobDeploymentStatus": deployment, "jobStatus": job_status,
                                         "rayClusterName": cluster}}


def pod(name, *, labels, phase="Running", created=1000, ready=True, ready_since=900, restarts=0, node="n1",
        deleted_ago=None) -> dict:
    meta = {"name": name, "labels": labels, "creationTimestamp": ts(created)}
    if deleted_ago is not None:
        meta["deletionTimestamp"] = ts(deleted_ago)
    return {"metadata": meta, "spec": {"nodeName": node},
            "status": {"phase": phase, "containerStatuses": [{"name": "c", "restartCount": restarts}],
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                       "lastTransitionTime": ts(ready_since)}]}}


def submitter(**kwargs) -> dict:
    return pod("ray-efa-job-x", labels={"batch.kubernetes.io/job-name": "ray-efa-job"}, **kwargs)


def head(**kwargs) -> dict:
    return pod("head", labels={"ray.io/cluster": "ray-efa-job-abc", "ray.io/node-type": "head"}, **kwargs)


def worker(name="w1", **kwargs) -> dict:
    return pod(name, labels={"ray.io/cluster": "ray-efa-job-abc", "ray.io/node-type": "worker"}, **kwargs)


def node(name="n1", ready=True) -> dict:
    return {"metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}]}}


def snap(job=None, pods=(), clusters=("ray-efa-job-abc",), submitter_job=True, nodes=None) -> Snapshot:
    nodes = [node()] if nodes is None else nodes
    return Snapshot(rayjob=job, rayclusters=[{"metadata": {"name": c}} for c in clusters],
                    submitter_job={"metadata": {"name": "ray-efa-job", "creationTimestamp": ts(400)}}
                    if submitter_job else None, pods=list(pods), nodes=list(nodes))


def actions(decisions) -> list[str]:
    return [str(a) for d in decisions for a in d.actions]


STOP_RUNNING = ["delete rayjobs/ray-efa-job", "delete rayclusters/ray-efa-job-abc", "delete jobs/ray-efa-job"]


# ---------------------------------------------------------------- the shared stop decision

def test_stop_plan_deletes_a_running_rayjob_then_its_cluster_and_submitter():
    plan, why = stopping.stop_plan(rayjob())
    assert list(map(str, plan)) == STOP_RUNNING
    assert "finalizer stops the Ray job" in why


@pytest.mark.parametrize("deployment,job_status", [("Complete", "STOPPED"), ("Failed", "FAILED"),
                                                   ("Complete", "SUCCEEDED")])
def test_stop_plan_keeps_an_ended_rayjob_and_deletes_only_its_cluster(deployment, job_status):
    plan, why = stopping.stop_plan(rayjob(deployment, job_status))
    assert list(map(str, plan)) == ["delete rayclusters/ray-efa-job-abc"]
    assert "keep it as the record" in why


def test_only_complete_with_a_status_no_rule_names_is_left_unfreed():
    assert stopping.no_rule_frees(rayjob("Complete", "STOPPED"))
    assert not stopping.no_rule_frees(rayjob("Complete", "SUCCEEDED"))
    assert not stopping.no_rule_frees(rayjob("Failed", "STOPPED"))  # the jobDeploymentStatus Failed rule frees it
    assert not stopping.no_rule_frees(rayjob("Running", "STOPPED"))  # the operator still drives it


def test_parse_time_reads_the_api_servers_timestamps():
    assert parse_time("1970-01-01T00:01:00Z") == 60
    assert parse_time(None) is None


# ---------------------------------------------------------------- (a) the submitter that cannot start

def test_a_submitter_pending_past_the_limit_deletes_the_rayjob():
    decisions = submitter_rule(snap(rayjob(), [submitter(phase="Pending", created=181)]), NOW, S)
    assert actions(decisions) == STOP_RUNNING
    assert decisions[0].rule == "submitter-start"
    assert "Pending for 181 s (limit 180 s, job.submitter_start_minutes)" in decisions[0].line()


def test_a_submitter_pending_within_the_limit_is_left_alone():
    assert submitter_rule(snap(rayjob(), [submitter(phase="Pending", created=179)]), NOW, S) == []


def test_a_submitter_that_runs_or_ran_is_left_alone():
    assert submitter_rule(snap(rayjob(), [submitter(phase="Running", created=3000)]), NOW, S) == []
    old_done = submitter(phase="Succeeded", created=3000)
    assert submitter_rule(snap(rayjob(), [old_done]), NOW, S) == []


def test_a_retried_submitter_pod_gets_its_own_start_time():
    failed = submitter(phase="Failed", created=3000)
    retry = submitter(phase="Pending", created=60)
    retry["metadata"]["name"] = "ray-efa-job-y"
    assert submitter_rule(snap(rayjob(), [failed, retry]), NOW, S) == []
    # A newest pod that ran and failed is the Job's backoffLimit's to handle, not the watchdog's.
    assert submitter_rule(snap(rayjob(), [failed]), NOW, S) == []


def test_a_job_that_made_no_pod_counts_from_its_own_creation():
    decisions = submitter_rule(snap(rayjob(), []), NOW, S)
    assert actions(decisions) == STOP_RUNNING and "no pod created for 400 s" in decisions[0].why


def test_the_submitter_rule_needs_a_running_rayjob_and_its_job():
    pending = [submitter(phase="Pending", created=1000)]
    assert submitter_rule(snap(rayjob("Initializing"), pending), NOW, S) == []
    assert submitter_rule(snap(rayjob(deleting=True), pending), NOW, S) == []
    assert submitter_rule(snap(rayjob(), pending, submitter_job=False), NOW, S) == []
    assert submitter_rule(snap(None, pending), NOW, S) == []


# ---------------------------------------------------------------- (b) the head in a crash loop

def test_a_head_restarting_limit_times_deletes_the_rayjob():
    decisions = head_rule(snap(rayjob("Initializing"), [head(restarts=3, ready=False, ready_since=20)]), NOW, S)
    assert actions(decisions) == STOP_RUNNING
    assert "restarted 3 times (limit 3, job.head_restart_limit)" in decisions[0].why


def test_a_head_not_ready_past_the_limit_deletes_the_rayjob():
    decisions = head_rule(snap(rayjob("Initializing"), [head(ready=False, ready_since=601)]), NOW, S)
    assert actions(decisions) == STOP_RUNNING and "not Ready for 601 s" in decisions[0].why


def test_a_head_without_a_ready_condition_counts_from_its_creation():
    young, old = head(created=100), head(created=700)
    for p in (young, old):
        p["status"]["conditions"] = []
    assert head_rule(snap(rayjob("Initializing"), [young]), NOW, S) == []
    assert actions(head_rule(snap(rayjob("Initializing"), [old]), NOW, S)) == STOP_RUNNING


def test_a_healthy_or_young_head_is_left_alone():
    assert head_rule(snap(rayjob(), [head(restarts=2)]), NOW, S) == []
    assert head_rule(snap(rayjob(), [head(ready=False, ready_since=599)]), NOW, S) == []


def test_the_head_rule_ignores_other_clusters_and_ended_rayjobs():
    other = pod("h2", labels={"ray.io/cluster": "someone-else", "ray.io/node-type": "head"}, restarts=9)
    assert head_rule(snap(rayjob(), [other]), NOW, S) == []
    assert head_rule(snap(rayjob("Complete", "SUCCEEDED"), [head(restarts=9)]), NOW, S) == []


# ---------------------------------------------------------------- (c) the raw `ray job stop`

def test_a_stopped_rayjob_with_its_cluster_loses_the_cluster_and_keeps_the_record():
    decisions = stopped_rule(snap(rayjob("Complete", "STOPPED")), NOW, S)
    assert actions(decisions) == ["delete rayclusters/ray-efa-job-abc"]
    assert "no deletion rule matches it" in decisions[0].why


def test_the_stopped_rule_leaves_what_the_deletion_rules_handle_or_what_is_gone():
    assert stopped_rule(snap(rayjob("Complete", "SUCCEEDED")), NOW, S) == []  # DeleteWorkers / DeleteCluster TTL
    assert stopped_rule(snap(rayjob("Running", "STOPPED")), NOW, S) == []  # the operator's grace period first
    assert stopped_rule(snap(rayjob("Complete", "STOPPED"), clusters=()), NOW, S) == []


# ---------------------------------------------------------------- (d) the lost GPU node

def test_a_pod_terminating_on_a_not_ready_node_past_the_limit_is_force_deleted():
    decisions = node_lost_rule(snap(rayjob(), [worker(deleted_ago=61)], nodes=[node(ready=False)]), NOW, S)
    assert actions(decisions) == ["delete pods/w1 (grace 0)"]
    assert "node n1 (not Ready" in decisions[0].why


def test_a_pod_terminating_on_a_node_that_is_gone_is_force_deleted():
    assert actions(node_lost_rule(snap(None, [worker(deleted_ago=61)], nodes=[]), NOW, S)) == [
        "delete pods/w1 (grace 0)"]


def test_pods_on_ready_nodes_or_within_the_limit_are_left_alone():
    assert node_lost_rule(snap(rayjob(), [worker(deleted_ago=600)]), NOW, S) == []  # its kubelet will confirm
    assert node_lost_rule(snap(rayjob(), [worker(deleted_ago=59)], nodes=[node(ready=False)]), NOW, S) == []
    assert node_lost_rule(snap(rayjob(), [worker()], nodes=[node(ready=False)]), NOW, S) == []  # not evicted yet
    unrelated = pod("other", labels={}, deleted_ago=600)
    assert node_lost_rule(snap(rayjob(), [unrelated], nodes=[]), NOW, S) == []


# ---------------------------------------------------------------- all rules at once

def test_a_rayjob_the_operator_has_not_given_a_status_yet_decides_nothing():
    fresh = {"metadata": {"name": "ray-efa-job", "namespace": "ray"}}  # the cluster tier met one: no `status`
    assert decide(snap(fresh, [submitter(phase="Pending", created=1000), worker(deleted_ago=1)]), NOW, S) == []


def test_decide_deletes_a_rayjob_once_whichever_rules_ask():
    pods = [submitter(phase="Pending", created=1000), head(restarts=5)]
    decisions = decide(snap(rayjob(), pods), NOW, S)
    assert [d.rule for d in decisions] == ["submitter-start"]
    assert actions(decisions) == STOP_RUNNING


def test_every_decision_is_one_log_line_naming_its_rule():
    decisions = decide(snap(rayjob("Complete", "STOPPED"), [worker(deleted_ago=100)], nodes=[]), NOW, S)
    lines = [d.line() for d in decisions]
    assert [line.split()[1] for line in lines] == ["rule=stopped", "rule=node-lost"]
    assert all("\n" not in line for line in lines)


def test_the_command_line_refuses_bad_values_and_runs_nowhere_without_a_server():
    cmd = [sys.executable, "-m", "workloads.watchdog", "--namespace", "ray", "--rayjob", "j"]
    bad = subprocess.run([*cmd, "--period", "-1"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--period must be >= 0 seconds" in bad.stderr
    env = {"PATH": "/usr/bin:/bin"}
    nowhere = subprocess.run([*cmd, "--once"], cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert nowhere.returncode != 0 and "KUBERNETES_SERVICE_HOST is not set" in nowhere.stderr


def test_the_watchdog_imports_only_the_standard_library():
    code = ("import sys; before = set(sys.modules); import workloads.watchdog; "
            "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
            "{'config', 'charts', 'stacks', 'yaml', 'pydantic', 'kubernetes', 'ray'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------- config

def test_the_watchdog_fields_default_as_documented():
    config = load_config(REPO / "config" / "cluster.yaml")
    job = config.job
    assert (job.watchdog, job.watchdog_period_seconds, job.submitter_start_minutes, job.head_restart_limit,
            job.head_ready_minutes, config.autoscaling.node_lost_seconds) == (True, 30, 3, 3, 10, 60)


def test_a_head_ready_limit_not_below_the_start_deadline_is_refused(tmp_path):
    path = write_variant(tmp_path, {"job": {"head_ready_minutes": 30, "start_deadline_minutes": 30}})
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "job.head_ready_minutes" in message and "not below job.start_deadline_minutes (30)" in message
    assert "lower job.head_ready_minutes or raise job.start_deadline_minutes" in message


def test_without_the_watchdog_the_head_ready_limit_binds_nothing(tmp_path):
    """The EC2 target and a run with job.watchdog off: nothing reads head_ready_minutes, so a short start
    deadline (the EC2 tier's 0.5 min) stays valid."""
    path = write_variant(tmp_path, {"job": {"watchdog": False, "head_ready_minutes": 10,
                                            "start_deadline_minutes": 0.5}})
    assert load_config(path).job.start_deadline_minutes == 0.5


# ---------------------------------------------------------------- the chart and the worker pods

def _objects(tmp_path, overrides=None) -> dict:
    from charts import build_app, inputs, manifests

    path = write_variant(tmp_path, overrides or {})
    return manifests(build_app(inputs(load_config(path), path)))


def test_the_watchdog_chart_is_least_privilege_and_runs_the_rendered_limits(tmp_path):
    charts = _objects(tmp_path, {"job": {"submitter_start_minutes": 2, "head_ready_minutes": 7},
                                 "autoscaling": {"node_lost_seconds": 45}})
    by_kind = {o["kind"]: o for o in charts["ray-watchdog"]}
    assert set(by_kind) == {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
                            "Deployment", "NetworkPolicy"}
    for obj in charts["ray-watchdog"]:
        assert obj["metadata"].get("namespace") == (None if obj["kind"].startswith("Cluster") else "ray"), obj["kind"]
    verbs = {(g, r): set(rule["verbs"]) for rule in by_kind["Role"]["rules"] for g in rule["apiGroups"]
             for r in rule["resources"]}
    assert verbs == {("ray.io", "rayjobs"): {"get", "list", "watch", "delete"},
                     ("ray.io", "rayclusters"): {"get", "list", "watch", "delete"},
                     ("", "pods"): {"get", "list", "watch", "delete"},
                     ("batch", "jobs"): {"get", "list", "watch", "delete"}}
    assert by_kind["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]
    spec = by_kind["Deployment"]["spec"]
    pod_spec = spec["template"]["spec"]
    (container,) = pod_spec["containers"]
    assert spec["replicas"] == 1 and pod_spec["nodeSelector"] == {"ray-efa.io/role": "system"}
    assert container["resources"] == {"requests": {"cpu": "10m", "memory": "64Mi"},
                                      "limits": {"cpu": "10m", "memory": "64Mi"}}
    job = next(o for o in charts["ray-job"] if o["kind"] == "RayJob")
    assert container["image"] == job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"][
        "containers"][0]["image"]
    args = dict(zip(container["command"][3::2], container["command"][4::2], strict=True))
    assert args == {"--namespace": "ray", "--rayjob": "ray-efa-job", "--period": "30", "--submitter-start": "120",
                    "--head-restarts": "3", "--head-ready": "420", "--node-lost": "45"}
    assert [i["path"] for i in pod_spec["volumes"][0]["configMap"]["items"]] == [
        "workloads/__init__.py", "workloads/stopping.py", "workloads/watchdog.py"]


def test_the_watchdog_chart_is_left_out_when_switched_off(tmp_path):
    assert "ray-watchdog" not in _objects(tmp_path, {"job": {"watchdog": False}})


def test_gpu_workers_leave_a_lost_node_after_node_lost_seconds(tmp_path):
    charts = _objects(tmp_path, {"autoscaling": {"node_lost_seconds": 45}})
    job = next(o for o in charts["ray-job"] if o["kind"] == "RayJob")
    for group in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        tolerations = group["template"]["spec"]["tolerations"]
        lost = {t["key"]: t for t in tolerations if t["effect"] == "NoExecute"}
        assert set(lost) == {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
        assert {t["tolerationSeconds"] for t in lost.values()} == {45}
