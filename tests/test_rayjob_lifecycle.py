"""The RayJob's submission mode, deadlines, retries and deletion rules, for every shipped variable file.

What KubeRay 1.7.0 does with each field is cited from its source (ray-project/kuberay, tag v1.7.0,
ray-operator/controllers/ray/rayjob_controller.go unless named otherwise); the manifests are
validated against the 1.7.0 CRDs in ../shared by `charts.validation`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from charts import build_app, bundle, inputs, manifests, ray, validation
from config import DEFAULT_FILE, load_config
from tests.helpers import EXAMPLES

SHIPPED = [DEFAULT_FILE, *sorted(EXAMPLES.glob("*.yaml"))]


@pytest.fixture(scope="module", params=SHIPPED, ids=lambda p: Path(p).stem)
def shipped(request):
    config = load_config(request.param)
    objects = [o for chart in manifests(build_app(inputs(config, request.param))).values() for o in chart]
    (job,) = [o for o in objects if o["kind"] == "RayJob"]
    configmaps = [o for o in objects if o["kind"] == "ConfigMap" and bundle.flatten(bundle.FOLLOW_SCRIPT) in o["data"]]
    return config, job, configmaps


def test_every_shipped_rayjob_validates_against_the_kuberay_crd(shipped):
    config, job, _ = shipped
    assert validation.problems([job], config.cluster.kubernetes_version) == []


def test_deadlines_and_retries_come_from_the_job_section(shipped):
    # checkActiveDeadlineAndUpdateStatusIfNeeded / checkPreRunningDeadlineAndUpdateStatusIfNeeded compare
    # now with status.startTime + the deadline; a DeadlineExceeded failure is never retried
    # (checkBackoffLimitAndUpdateStatusIfNeeded), any other Failed one is, backoffLimit times.
    config, job, _ = shipped
    spec = job["spec"]
    assert spec["activeDeadlineSeconds"] == round(config.job.timeout_hours * 3600)
    assert spec["preRunningDeadlineSeconds"] == round(config.job.start_deadline_minutes * 60)
    assert spec["preRunningDeadlineSeconds"] < spec["activeDeadlineSeconds"]
    assert spec["backoffLimit"] == config.job.retries


def test_submitter_is_a_k8s_job_running_follow_sh_not_a_head_sidecar(shipped):
    # SidecarMode sets the head pod's restartPolicy to Never (constructRayClusterForRayJob): once the
    # sidecar exits the head is never Ready again (kuberay#4945). K8sJobMode leaves the head alone.
    config, job, configmaps = shipped
    spec = job["spec"]
    assert spec["submissionMode"] == "K8sJobMode"
    assert "restartPolicy" not in spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    template = spec["submitterPodTemplate"]
    (container,) = template["spec"]["containers"]
    # configureSubmitterContainer keeps a command that is set (KubeRay's default only replaces an empty one).
    assert container["command"] == ["bash", "/app/follow.sh"]
    assert container["image"] == config.ray.image
    assert template["spec"]["restartPolicy"] == "Never"
    assert template["spec"]["activeDeadlineSeconds"] == spec["activeDeadlineSeconds"]
    assert template["spec"]["nodeSelector"] == {"ray-efa.io/role": "system"}
    assert template["metadata"]["labels"][ray.OWNER_LABEL] == ray.job_name(config)
    # createNewK8sJob: the Job's backoffLimit is submitterConfig.backoffLimit (default 2).
    assert spec["submitterConfig"] == {"backoffLimit": ray.SUBMITTER_BACKOFF_LIMIT}
    assert configmaps and all(cm["data"]["follow.sh"] == bundle.follow_script() for cm in configmaps)


def _matching(rules: list[dict], *, job_status: str, deployment_status: str) -> dict[str, int]:
    """{policy: ttlSeconds} of the rules KubeRay runs for a RayJob ended in this state.

    isDeletionRuleMatched: a rule matches on jobStatus == status.jobStatus, or on jobDeploymentStatus ==
    status.jobDeploymentStatus; handleDeletionRules runs each matching rule ttlSeconds after status.endTime.
    """
    out: dict[str, int] = {}
    for rule in rules:
        cond = rule["condition"]
        if "jobStatus" in cond:
            hit = cond["jobStatus"] == job_status
        else:
            hit = cond["jobDeploymentStatus"] == deployment_status
        if hit:
            out[rule["policy"]] = min(out.get(rule["policy"], 1 << 31), cond.get("ttlSeconds", 0))
    return out


@pytest.mark.parametrize(("job_status", "deployment_status"), [
    ("SUCCEEDED", "Complete"),          # a finished job
    ("FAILED", "Failed"),               # the driver failed (plan refusal, dataset error, training error)
    ("RUNNING", "Failed"),              # activeDeadlineSeconds passed (DeadlineExceeded)
    ("PENDING", "Failed"),              # no GPU capacity: PreRunningDeadlineExceeded
    ("", "Failed"),                     # the submitter Job failed (SubmissionFailed)
])
def test_gpu_workers_go_at_once_and_the_head_after_ttl_hours(shipped, job_status, deployment_status):
    config, job, _ = shipped
    rules = job["spec"]["deletionStrategy"]["deletionRules"]
    ttl = round(config.job.ttl_hours * 3600)
    # DeleteWorkers suspends the worker groups (suspendWorkerGroups): the GPU pods go at endTime and the
    # autoscaler removes their nodes after autoscaling.scale_down_minutes; DeleteCluster removes the head
    # ttl_hours later and keeps the submitter Job (its pod log is the driver's output).
    assert _matching(rules, job_status=job_status, deployment_status=deployment_status) == {
        "DeleteWorkers": 0, "DeleteCluster": ttl}


def test_deletion_rules_pass_kuberays_own_checks(shipped):
    # utils/validation.go validateDeletionConfiguration: rules mode excludes shutdownAfterJobFinishes and the
    # global ttlSecondsAfterFinished; validateDeletionRules: one rule per (condition, policy) and
    # DeleteWorkers' TTL <= DeleteCluster's <= DeleteSelf's for each condition.
    _, job, _ = shipped
    spec = job["spec"]
    assert "shutdownAfterJobFinishes" not in spec and "ttlSecondsAfterFinished" not in spec
    rules = spec["deletionStrategy"]["deletionRules"]
    keys = [(tuple(sorted((k, v) for k, v in r["condition"].items() if k != "ttlSeconds")), r["policy"]) for r in rules]
    assert len(keys) == len(set(keys))
    by_condition: dict = {}
    for (condition, policy), rule in zip(keys, rules, strict=True):
        by_condition.setdefault(condition, {})[policy] = rule["condition"]["ttlSeconds"]
    for ttls in by_condition.values():
        assert ttls["DeleteWorkers"] <= ttls["DeleteCluster"]


def test_ttl_hours_zero_deletes_the_whole_cluster_at_once(tmp_path):
    from tests.helpers import load_variant

    config = load_variant(tmp_path, {"job": {"ttl_hours": 0}})
    rules = ray.deletion_rules(config).to_json()["deletionRules"]
    assert {r["condition"]["ttlSeconds"] for r in rules} == {0}


def test_start_deadline_is_refused_when_out_of_range(tmp_path):
    from config import ConfigError
    from tests.helpers import write_variant

    path = write_variant(tmp_path, {"job": {"start_deadline_minutes": 0}})
    with pytest.raises(ConfigError, match="start_deadline_minutes"):
        load_config(path)
