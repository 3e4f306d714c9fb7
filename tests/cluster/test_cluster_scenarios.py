"""The run's failure paths against the real KubeRay operator, each with a timeline and its cost at production values.

The RayJob is the one `dist/ray-job.k8s.yaml` holds for config/cluster.yaml, with a test variable file where a
deadline must be shorter (`variant`). Its head pod is a kwok pod whose IP is a real Ray head's in a network namespace
(tests/cluster/ray_netns.py), so the operator reads real job statuses (SUCCEEDED, FAILED, STOPPED) through the API
server's service proxy. The submitter pod does not run (kwok): the test does what it would, submitting the entrypoint
with the RayJob's `status.jobId` and marking the pod Succeeded once the job has ended, as follow.sh exits then.

Cost (`report.cost`): GPU node minutes from the failure until the GPU nodes are gone, i.e. until the GPU pods are gone
plus the Cluster Autoscaler's `autoscaling.scale_down_minutes`, times the GPU nodes the job holds. Every scenario adds
its row to dist/cluster-report.json (conftest `report`).
"""

from __future__ import annotations

import copy
import time

import pytest

from harness.waiting import wait_for
from ops.stop import stop
from tests.cluster import deploy
from tests.cluster.conftest import CLUSTER_MARKS, deployed_base, record, synthesize_variant
from tests.cluster.ray_netns import ray_head

pytestmark = CLUSTER_MARKS

NAME = "ray-efa-job"
BAD_ENTRYPOINT = "python -c \"import sys; print('bad entrypoint'); sys.exit(3)\""


@pytest.fixture(scope="module")
def env(lab, tmp_path_factory):
    """The lab with config/cluster.yaml's nodes and ray-base applied, and a real Ray head in a network namespace."""
    base = synthesize_variant("scenarios", {"job": {"ttl_hours": 0.01}}, tmp_path_factory.mktemp("scenarios"))
    with deployed_base(lab, base, "sc") as (ns, nodes), ray_head() as head:
        yield {"lab": lab, "synth": base, "ns": ns, "nodes": nodes, "head": head}


def rayjob_manifest(synth, head_ip: str) -> list[dict]:
    """The RayJob and its NetworkPolicy as dist/ has them; the head pod template annotated with the Ray head's
    address (kwok reports it as the pod IP): the only change, and it is the lab's, not the product's."""
    objects = deploy.manifests(synth.dist, deploy.JOB)
    objects = [o for o in objects if o["kind"] != "PodMonitor"]
    for obj in objects:
        if obj["kind"] == "RayJob":
            meta = obj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"].setdefault("metadata", {})
            meta.setdefault("annotations", {})["kwok.lab/pod-ip"] = head_ip
    return copy.deepcopy(objects)


def jobs_client(env):
    """The Ray Jobs API client of the netns head (imported here: `make check` collects this module, starts nothing)."""
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(env["head"].url)


def gpu_pods(env) -> list:
    return [p for p in deploy.namespace_pods(env["lab"], env["ns"], "ray.io/node-type=worker")]


def submitter_pods(env) -> list:
    return deploy.namespace_pods(env["lab"], env["ns"], f"batch.kubernetes.io/job-name={NAME}")


def start_run(env, timeline, *, entrypoint: str) -> tuple[list[dict], str]:
    """Apply the RayJob, wait for its cluster and submitter, submit `entrypoint` as the submitter would."""
    lab = env["lab"]
    objects = rayjob_manifest(env["synth"], env["head"].ip)
    lab.apply(objects)
    timeline("RayJob applied")
    status = wait_for(lambda: (s := deploy.rayjob_status(lab, env["ns"], NAME)).get("jobDeploymentStatus") ==
                      "Running" and s, 90, "the RayJob to be Running (cluster ready, submitter Job created)",
                      interval_s=0.5)
    timeline(f"RayJob Running, cluster {status['rayClusterName']}, {len(gpu_pods(env))} GPU worker pods")
    wait_for(lambda: any(p.status.phase == "Running" for p in submitter_pods(env)), 30, "the submitter pod")
    client = jobs_client(env)

    def submitted() -> bool:
        try:
            client.submit_job(entrypoint=entrypoint, submission_id=status["jobId"])
            return True
        except RuntimeError as exc:  # the head's job agent registers a little after the dashboard answers
            if "No available agent" in str(exc):
                return False
            raise

    wait_for(submitted, 120, "the Ray head to take the job", interval_s=1)
    timeline(f"submitted job {status['jobId']}")
    return objects, status["jobId"]


def finish_submitter(env, phase: str = "Succeeded") -> None:
    for pod in submitter_pods(env):
        if pod.status.phase == "Running":
            env["lab"].core.patch_namespaced_pod(pod.metadata.name, env["ns"],
                                                 {"metadata": {"annotations": {"kwok.lab/phase": phase}}})


def wait_job(env, job_id: str, *statuses: str, timeout_s: float = 60) -> str:
    client = jobs_client(env)
    return wait_for(lambda: (s := client.get_job_status(job_id)) in statuses and s, timeout_s,
                    f"Ray job {job_id} to reach {statuses}", interval_s=0.5)


def cleanup(env, objects) -> None:
    deploy.remove(env["lab"], objects, env["ns"])


def cost_minutes(env, seconds_until_pods_gone: float) -> tuple[int, float]:
    config = env["synth"].config
    nodes = sum(g.nodes for g in config.cluster.worker_groups)
    return nodes, round(nodes * (seconds_until_pods_gone / 60 + config.autoscaling.scale_down_minutes), 1)


def test_success_deletes_the_workers_then_the_head(env, request):
    """(a) SUCCEEDED: DeleteWorkers (ttlSeconds 0) takes the GPU workers at once; DeleteCluster takes the head
    `job.ttl_hours` later (rayjob_controller.go `handleDeletionRules`, TTL from status.endTime)."""
    timeline = deploy.Timeline("success")
    objects, job_id = start_run(env, timeline, entrypoint="python -c \"print('trained')\"")
    try:
        wait_job(env, job_id, "SUCCEEDED")
        ended = timeline("Ray job SUCCEEDED; the submitter (follow.sh) exits 0")
        finish_submitter(env)
        wait_for(lambda: deploy.rayjob_status(env["lab"], env["ns"], NAME).get("jobDeploymentStatus") == "Complete",
                 60, "RayJob Complete", interval_s=0.5)
        timeline("RayJob Complete/SUCCEEDED")
        wait_for(lambda: not gpu_pods(env), 60, "the GPU worker pods to go", interval_s=0.5)
        gone = timeline("GPU worker pods deleted (DeleteWorkers)")
        heads = lambda: deploy.namespace_pods(env["lab"], env["ns"], "ray.io/node-type=head")  # noqa: E731
        assert heads(), "the head must outlive the workers (its dashboard and logs, job.ttl_hours)"
        ttl_s = env["synth"].config.job.ttl_hours * 3600
        wait_for(lambda: not heads(), ttl_s + 60, "the head to go (DeleteCluster after job.ttl_hours)")
        timeline(f"head deleted (DeleteCluster, ttlSeconds {ttl_s:.0f} in the test file)")
        nodes, lost = cost_minutes(env, gone - ended)
        record(scenario="success", outcome="SUCCEEDED; GPU workers deleted at once, head after job.ttl_hours",
               gpu_nodes=nodes, gpu_node_minutes_lost=lost, limit="", timeline=timeline.entries)
    finally:
        cleanup(env, objects)


def test_stop_command_frees_the_gpu_nodes(env):
    """(b) `python -m ops.stop` while the job trains: the Ray job ends STOPPED (the operator's finalizer) and
    every GPU pod goes with the RayJob's cluster. (A suspend would not: KubeRay 1.7.0 refuses it beside
    deletionRules; `ops/stop.py` cites the lines.)"""
    timeline = deploy.Timeline("stop-command")
    objects, job_id = start_run(env, timeline, entrypoint="python -c \"import time; time.sleep(600)\"")
    try:
        wait_job(env, job_id, "RUNNING")
        timeline("training; `python -m ops.stop`")
        took = stop(env["lab"].custom, env["lab"].core, env["ns"], NAME, batch=env["lab"].batch, timeout_s=60,
                    log=timeline)
        assert not gpu_pods(env)
        assert wait_job(env, job_id, "STOPPED") == "STOPPED"
        timeline("Ray job STOPPED; every Ray pod gone")
        nodes, lost = cost_minutes(env, took)
        assert lost <= 15 * nodes
        record(scenario="stop-command", outcome="STOPPED; RayJob deleted, its cluster and submitter with it",
               gpu_nodes=nodes, gpu_node_minutes_lost=lost, limit="", timeline=timeline.entries)
    finally:
        cleanup(env, objects)


def test_raw_ray_job_stop_then_the_stop_command(env):
    """(b) a raw `ray job stop` with no watchdog: STOPPED, RayJob Complete, and no deletion rule matches (the CRD's
    enum): the GPU workers stay. `python -m ops.stop` on the ended RayJob deletes its RayCluster. (With the
    watchdog, which the chart deploys by default, no command is needed: test_cluster_watchdog.py.)"""
    timeline = deploy.Timeline("raw-ray-job-stop-then-stop-command")
    objects, job_id = start_run(env, timeline, entrypoint="python -c \"import time; time.sleep(600)\"")
    try:
        wait_job(env, job_id, "RUNNING")
        jobs_client(env).stop_job(job_id)
        timeline("`ray job stop`")
        wait_job(env, job_id, "STOPPED")
        finish_submitter(env)
        wait_for(lambda: deploy.rayjob_status(env["lab"], env["ns"], NAME).get("jobDeploymentStatus") == "Complete",
                 60, "RayJob Complete", interval_s=0.5)
        timeline("RayJob Complete/STOPPED")
        # Several of the operator's 3 s reconciles later the workers are still there: no rule matches STOPPED.
        time.sleep(10)
        held = len(gpu_pods(env))
        timeline(f"10 s later: {held} GPU worker pods still up (no deletion rule matches STOPPED)")
        assert held == sum(g.nodes for g in env["synth"].config.cluster.worker_groups)
        took = stop(env["lab"].custom, env["lab"].core, env["ns"], NAME, batch=env["lab"].batch, timeout_s=60,
                    log=timeline)
        nodes, lost = cost_minutes(env, took)
        record(scenario="raw-ray-job-stop-then-stop-command", outcome="STOPPED; RayJob Complete; workers held "
               "until `python -m ops.stop` deletes the RayCluster (job.watchdog false)", gpu_nodes=nodes,
               gpu_node_minutes_lost=lost,
               limit="KubeRay 1.7.0 deletionRules admit jobStatus SUCCEEDED/FAILED only (rayjob_types.go "
               "DeletionCondition enum); without the watchdog the workers stay until `python -m ops.stop`: cost "
               "shown is when it follows the stop at once", timeline=timeline.entries)
    finally:
        cleanup(env, objects)


def test_operator_restart_mid_run_duplicates_and_orphans_nothing(env):
    """(g) The operator restarted while the job trains: the same RayCluster, the same submitter Job, the same job
    id afterwards, and the run still ends as it should."""
    lab = env["lab"]
    timeline = deploy.Timeline("operator-restart")
    objects, job_id = start_run(env, timeline, entrypoint="python -c \"import time; time.sleep(20)\"")
    try:
        wait_job(env, job_id, "RUNNING")
        before = deploy.rayjob_status(lab, env["ns"], NAME)
        pods_before = sorted(p.metadata.name for p in deploy.namespace_pods(lab, env["ns"], "ray.io/is-ray-node=yes"))
        took = lab.restart_operator()
        timeline(f"operator restarted (synced again after {took:.1f} s)")
        time.sleep(6)  # two of its 3 s reconciles
        after = deploy.rayjob_status(lab, env["ns"], NAME)
        assert (after["rayClusterName"], after["jobId"]) == (before["rayClusterName"], before["jobId"])
        clusters = lab.custom.list_namespaced_custom_object("ray.io", "v1", env["ns"], "rayclusters")["items"]
        assert [c["metadata"]["name"] for c in clusters] == [before["rayClusterName"]]
        assert len(lab.batch.list_namespaced_job(env["ns"]).items) == 1
        assert sorted(p.metadata.name for p in deploy.namespace_pods(lab, env["ns"], "ray.io/is-ray-node=yes")) == \
            pods_before
        assert [j["submission_id"] for j in env["head"].jobs() if j["submission_id"] == job_id] == [job_id]
        timeline("one RayCluster, one submitter Job, the same pods and one Ray job")
        wait_job(env, job_id, "SUCCEEDED")
        finish_submitter(env)
        wait_for(lambda: not gpu_pods(env), 60, "the GPU worker pods to go", interval_s=0.5)
        timeline("job SUCCEEDED; GPU workers deleted")
        nodes = sum(g.nodes for g in env["synth"].config.cluster.worker_groups)
        record(scenario="operator-restart", outcome="nothing duplicated or orphaned; SUCCEEDED", gpu_nodes=nodes,
               gpu_node_minutes_lost=0.0, limit="", timeline=timeline.entries)
    finally:
        cleanup(env, objects)



def test_entrypoint_error_retries_as_configured(env):
    """(f) An entrypoint that fails: FAILED (AppFailed), and KubeRay retries `job.retries` times, each with a new
    cluster and a new submitter Job (rayjob_controller.go `checkBackoffLimitAndUpdateStatusIfNeeded`: Failed ->
    Retrying while status.failed < backoffLimit + 1; case Retrying deletes the cluster and the submitter Job). The
    last failure leaves the RayJob Failed and DeleteWorkers (jobStatus FAILED, ttlSeconds 0) takes the GPU workers."""
    lab, ns = env["lab"], env["ns"]
    retries = env["synth"].config.job.retries
    timeline = deploy.Timeline("entrypoint-error")
    objects = rayjob_manifest(env["synth"], env["head"].ip)
    lab.apply(objects)
    timeline(f"RayJob applied (backoffLimit {retries})")
    job_ids, clusters = [], []
    try:
        for attempt in range(retries + 1):
            status = wait_for(lambda: (s := deploy.rayjob_status(lab, ns, NAME)).get("jobDeploymentStatus") ==
                              "Running" and s.get("jobId") not in job_ids and s, 120,
                              f"attempt {attempt + 1} to be Running", interval_s=0.5)
            job_ids.append(status["jobId"])
            clusters.append(status["rayClusterName"])
            wait_for(lambda: any(p.status.phase == "Running" for p in submitter_pods(env)), 30, "the submitter pod")
            client = jobs_client(env)
            wait_for(lambda c=client, i=status["jobId"]: _submit(c, BAD_ENTRYPOINT, i), 120,
                     "the Ray head to take the job", interval_s=1)
            wait_job(env, status["jobId"], "FAILED")
            finish_submitter(env)
            timeline(f"attempt {attempt + 1}: cluster {status['rayClusterName']}, job {status['jobId']} FAILED")
        final = wait_for(lambda: (s := deploy.rayjob_status(lab, ns, NAME)).get("jobDeploymentStatus") == "Failed"
                         and s.get("failed") == retries + 1 and s, 120, "the RayJob to end Failed", interval_s=0.5)
        ended = timeline(f"RayJob Failed ({final.get('reason')}), status.failed={final.get('failed')}")
        wait_for(lambda: not gpu_pods(env), 60, "the GPU worker pods to go", interval_s=0.5)
        gone = timeline("GPU worker pods deleted (DeleteWorkers on FAILED)")
        assert len(set(job_ids)) == len(set(clusters)) == retries + 1
        # Every attempt's driver log is still readable from the Ray head (the submitter Jobs are gone).
        for job_id in job_ids:
            assert "bad entrypoint" in jobs_client(env).get_job_logs(job_id)
        nodes, lost = cost_minutes(env, gone - ended)
        record(scenario="entrypoint-error", outcome=f"{retries + 1} attempts, each FAILED; RayJob Failed; GPU "
               "workers deleted at once", gpu_nodes=nodes, gpu_node_minutes_lost=lost,
               limit="in K8sJobMode each retry deletes the submitter Job and the cluster: the attempts' logs live "
               "only as long as the Ray head holding them (not yet copied to S3)", timeline=timeline.entries)
    finally:
        cleanup(env, objects)


def _submit(client, entrypoint: str, job_id: str) -> bool:
    try:
        client.submit_job(entrypoint=entrypoint, submission_id=job_id)
        return True
    except RuntimeError as exc:
        if "No available agent" in str(exc):
            return False
        raise


# The submitter that cannot start, the head crash loop, the raw `ray job stop` without the stop command and the lost
# GPU node: tests/cluster/test_cluster_watchdog.py, with the watchdog running.
