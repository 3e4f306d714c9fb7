"""The whole-job deadline already spent when an attempt starts, against the real KubeRay operator (issue 32).

How production gets there: an attempt of the job fails (any AppFailed) close to the end of `job.timeout_hours`; KubeRay
retries it under `backoffLimit` (rayjob_controller.go `checkBackoffLimitAndUpdateStatusIfNeeded`), and by the time the
retry's cluster is up the job's own deadline, kept in `<run folder>/job_deadline.json` by the first attempt
(workloads/fsdp_finetune/deadline.py), has passed. The test puts that record in the run folder as the earlier attempt
left it (written with the module's own `start_or_resume`, its heartbeat refreshed as `DeadlineWatch` does), then lets
the RayJob of `dist/ray-job.k8s.yaml` run.

What runs for real: the operator, the RayJob, its RayCluster and submitter Job (kwok pods), and the Ray job on a
real Ray head in a network namespace (tests/cluster/ray_netns.py), its entrypoint the bundle's own `job.sh` read
back from the API server's code ConfigMap, as the pods mount it, with the RayJob's runtime env. Its run folder is
on a moto S3 server on the namespace's host-side address (the only address both the test and the head reach).
The lab's changes, not the product's: the bundle is written to a temporary folder, so `/app` in job.sh and in the
runtime env names that folder; the S3 endpoint and keys stand in for the pod identity. As in
test_cluster_scenarios.py, the submitter pod does not run (kwok): the test submits the entrypoint with the RayJob's
`status.jobId`, as follow.sh would, and marks the pod Succeeded once the job has ended, as follow.sh exits then;
so follow.sh's copy of its own log to `<run folder>/logs/` is not exercised here (tests/test_follow.py and the
real-node tier run it).

The test variable file shortens `job.ttl_hours` only; `job.timeout_hours`, `job.start_deadline_minutes` and the
costs are config/cluster.yaml's production values.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from harness.waiting import wait_for
from tests.cluster import deploy
from tests.cluster.conftest import CLUSTER_MARKS, record, synthesize_variant
from tests.cluster.ray_netns import ray_head
from tests.cluster.test_cluster_scenarios import (
    NAME,
    cleanup,
    cost_minutes,
    finish_submitter,
    gpu_pods,
    jobs_client,
    rayjob_manifest,
    submitter_pods,
    wait_job,
)

pytestmark = CLUSTER_MARKS

BUCKET = "deadline-spent-runs"
VARIANT = {"job": {"ttl_hours": 0.01}, "storage": {"bucket_name": BUCKET}}
"""The test variable file: the head's TTL after the job ends shortened; the bucket named (no STS lookup)."""
S3_KEYS = {"AWS_ACCESS_KEY_ID": "deadline-spent", "AWS_SECRET_ACCESS_KEY": "deadline-spent"}
LATE_S = 300.0
"""How long past its deadline the retry starts: the earlier attempt failed 8 minutes ago, the deadline passed 5."""


class S3:
    """moto's server in this process on the network namespace's host-side address (the head reaches it there)."""

    def __init__(self, ip: str) -> None:
        import socket

        from moto.server import ThreadedMotoServer

        with socket.socket() as probe:
            probe.bind((ip, 0))
            port = probe.getsockname()[1]
        self._server = ThreadedMotoServer(ip_address=ip, port=port, verbose=False)
        self._server.start()
        self.endpoint_url = f"http://{ip}:{port}"

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_EC2_METADATA_DISABLED": "true", **S3_KEYS}

    def client(self):
        import boto3

        return boto3.session.Session(region_name="us-east-2", **{k.lower(): v for k, v in S3_KEYS.items()}).client(
            "s3", endpoint_url=self.endpoint_url)

    def stop(self) -> None:
        self._server.stop()


@pytest.fixture(scope="module")
def env(lab, tmp_path_factory):
    """The lab with config/cluster.yaml's nodes and ray-base applied, a real Ray head in a network namespace and an
    S3 server the head reaches."""
    folder = tmp_path_factory.mktemp("deadline")
    base = synthesize_variant("deadline", VARIANT, folder)
    deploy.install_addon_crds(lab)
    ns = base.config.ray.namespace
    lab.ensure_namespace(ns)
    nodes = deploy.create_nodes(lab, base, "dl")
    applied = deploy.manifests(base.dist, deploy.BASE)
    lab.apply(applied)
    try:
        with ray_head() as head:
            s3 = S3(head.ip.rsplit(".", 1)[0] + ".1")
            try:
                s3.client().create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-east-2"})
                yield {"lab": lab, "synth": base, "ns": ns, "nodes": nodes, "head": head, "s3": s3,
                       "folder": folder}
            finally:
                s3.stop()
    finally:
        deploy.remove(lab, applied, ns)
        deploy.delete_nodes(lab, nodes)


def mounted_bundle(env, rayjob: dict) -> Path:
    """The code ConfigMap as the API server holds it, written where its volume's `items` put each key (kubelet's
    ConfigMap volume), under a temporary folder standing in for MOUNT_PATH; the scripts' `/app` names that folder."""
    from charts.bundle import MOUNT_PATH

    spec = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    volume = next(v["configMap"] for v in spec["volumes"] if "configMap" in v)
    data = env["lab"].core.read_namespaced_config_map(volume["name"], env["ns"]).data
    root = env["folder"] / "app"
    for item in volume["items"]:
        path = root / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        text = data[item["key"]]
        path.write_text(text.replace(MOUNT_PATH, str(root)) if path.suffix == ".sh" else text)
    return root


def runtime_env(rayjob: dict, root: Path, s3: S3) -> dict:
    """The RayJob's runtimeEnvYAML (what follow.sh's submit.sh passes) and the head container's PYTHONPATH, `/app`
    replaced by the mounted bundle, plus the lab's S3 endpoint and keys."""
    from charts.bundle import MOUNT_PATH

    env_vars = {k: str(v).replace(MOUNT_PATH, str(root))
                for k, v in (yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"]).get("env_vars") or {}).items()}
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    pythonpath = next(e["value"] for e in head["env"] if e["name"] == "PYTHONPATH")
    env_vars.update(PYTHONPATH=pythonpath.replace(MOUNT_PATH, str(root)), **s3.env())
    return {"env_vars": env_vars}


def earlier_attempt(config, s3: S3, now: float) -> str:
    """The record the job's first attempt left in its run folder: started `job.timeout_hours` + LATE_S ago, its
    heartbeat last refreshed 8 minutes ago, when it failed (inside `stale_after_s`: the retry is the same job)."""
    import os

    from workloads.fsdp_finetune import deadline
    from workloads.fsdp_finetune.run_folder import run_dir_of

    saved = dict(os.environ)
    os.environ.update(s3.env(), AWS_REGION="us-east-2")
    try:
        run_dir = run_dir_of(config)
        first = deadline.start_or_resume(run_dir, timeout_s=config.job.timeout_hours * 3600,
                                         stale_after_s=deadline.stale_after_s(config.job.start_deadline_minutes),
                                         now=now - config.job.timeout_hours * 3600 - LATE_S)
        deadline._write(run_dir, {"started": first.started, "deadline": first.deadline, "attempt": first.attempt,
                                  "heartbeat": now - LATE_S - 180})
        assert now - (now - LATE_S - 180) < deadline.stale_after_s(config.job.start_deadline_minutes)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return run_dir


def deadline_record(s3: S3, run_dir: str) -> dict:
    from workloads.fsdp_finetune.deadline import DEADLINE_FILE

    key = f"{run_dir.removeprefix('s3://').split('/', 1)[1]}/{DEADLINE_FILE}"
    return json.loads(s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read())


def test_spent_deadline_stops_before_plan_and_data_and_is_not_retried(env):
    """A retry that starts with `job.timeout_hours` spent: job.sh's first step stops it (`JOB_STAGE deadline`, no
    other stage, no memory plan), with status 0, so the Ray job is SUCCEEDED, the RayJob Complete with no
    backoffLimit retry (one attempt, one RayCluster, one submitter Job), and DeleteWorkers (jobStatus SUCCEEDED,
    ttlSeconds 0) takes the GPU workers at once."""
    from config.observability import PLAN_PREDICTION_FILE

    lab, ns, config = env["lab"], env["ns"], env["synth"].config
    timeline = deploy.Timeline("deadline-spent")
    objects = rayjob_manifest(env["synth"], env["head"].ip)
    rayjob = next(o for o in objects if o["kind"] == "RayJob")
    root = mounted_bundle(env, rayjob)
    run_dir = earlier_attempt(config, env["s3"], time.time())
    timeline(f"the earlier attempt's record in {run_dir}: job.timeout_hours ({config.job.timeout_hours:g} h) spent "
             f"{LATE_S:.0f} s ago")
    prediction = Path(PLAN_PREDICTION_FILE)
    prediction.unlink(missing_ok=True)
    lab.apply(objects)
    # The attempt's cost starts here: a retry's new RayCluster asks for its GPU workers at once.
    started = timeline(f"RayJob applied (backoffLimit {config.job.retries}): the retry's cluster is created")
    clusters, job_ids = set(), set()

    def status() -> dict:
        s = deploy.rayjob_status(lab, ns, NAME)
        clusters.add(s.get("rayClusterName"))
        job_ids.add(s.get("jobId"))
        return s

    try:
        running = wait_for(lambda: (s := status()).get("jobDeploymentStatus") == "Running" and s, 120,
                           "the RayJob to be Running (cluster ready, submitter Job created)", interval_s=0.5)
        held = len(gpu_pods(env))
        timeline(f"RayJob Running, cluster {running['rayClusterName']}, {held} GPU worker pods")
        wait_for(lambda: any(p.status.phase == "Running" for p in submitter_pods(env)), 30, "the submitter pod")
        client = jobs_client(env)
        entrypoint = rayjob["spec"]["entrypoint"].replace("/app", str(root))
        wait_for(lambda: _submit_with_env(client, entrypoint, running["jobId"], runtime_env(rayjob, root, env["s3"])),
                 120, "the Ray head to take the job", interval_s=1)
        timeline(f"submitted `{rayjob['spec']['entrypoint']}` as job {running['jobId']}")
        wait_job(env, running["jobId"], "SUCCEEDED", "FAILED", "STOPPED", timeout_s=180)
        timeline(f"Ray job {client.get_job_status(running['jobId']).value}")
        logs = client.get_job_logs(running["jobId"])
        stages = re.findall(r"^JOB_STAGE (\S+)", logs, flags=re.MULTILINE)
        timeline(f"job.sh's JOB_STAGE lines: {stages}")
        assert client.get_job_status(running["jobId"]).value == "SUCCEEDED", logs
        assert stages == ["deadline"], logs
        assert f"job.timeout_hours ({config.job.timeout_hours:g} h) is spent" in logs, logs
        assert "stopped before the memory plan and any data work" in logs, logs
        assert not prediction.exists(), f"the memory plan ran: {PLAN_PREDICTION_FILE} written"
        recorded = deadline_record(env["s3"], run_dir)
        assert recorded["attempt"] == 2 and recorded["deadline"] < time.time(), recorded
        finish_submitter(env)
        timeline("the submitter (follow.sh) exits 0")
        final = wait_for(lambda: (s := status()).get("jobDeploymentStatus") in ("Complete", "Failed", "Retrying")
                         and s, 60, "the RayJob to end", interval_s=0.5)
        timeline(f"RayJob {final['jobDeploymentStatus']}/{final.get('jobStatus')}, status.failed="
                 f"{final.get('failed', 0)}, status.succeeded={final.get('succeeded', 0)}")
        wait_for(lambda: not gpu_pods(env), 60, "the GPU worker pods to go", interval_s=0.5)
        gone = timeline("GPU worker pods deleted (DeleteWorkers on SUCCEEDED)")
        # Several of the operator's 3 s reconciles: still one attempt, no new cluster, no new submitter Job.
        time.sleep(10)
        last = status()
        jobs = lab.batch.list_namespaced_job(ns).items
        timeline(f"10 s later: {last.get('jobDeploymentStatus')}, clusters {sorted(c for c in clusters if c)}, "
                 f"{len(jobs)} submitter Job(s), {len(gpu_pods(env))} GPU pods")
        assert (final["jobDeploymentStatus"], final.get("jobStatus")) == ("Complete", "SUCCEEDED"), final
        assert last.get("jobDeploymentStatus") == "Complete" and not last.get("failed"), last
        assert len({c for c in clusters if c}) == 1 and len({j for j in job_ids if j}) == 1, (clusters, job_ids)
        assert len(jobs) <= 1 and not gpu_pods(env)
        nodes, lost = cost_minutes(env, gone - started)
        timeline(f"cost: {nodes} GPU nodes x ({gone - started:.1f} s held here + "
                 f"{config.autoscaling.scale_down_minutes:g} min scale-down) = {lost} GPU node minutes")
        assert lost <= 15 * nodes
        record(scenario="deadline-spent", outcome="job.sh's first step stopped the attempt (JOB_STAGE deadline, no "
               "plan or data work); Ray job SUCCEEDED, RayJob Complete, not retried; GPU workers deleted at once",
               gpu_nodes=nodes, gpu_node_minutes_lost=lost, limit="", timeline=timeline.entries)
    finally:
        prediction.unlink(missing_ok=True)
        cleanup(env, objects)


def _submit_with_env(client, entrypoint: str, job_id: str, runtime_env: dict) -> bool:
    try:
        client.submit_job(entrypoint=entrypoint, submission_id=job_id, runtime_env=runtime_env)
        return True
    except RuntimeError as exc:  # the head's job agent registers a little after the dashboard answers
        if "No available agent" in str(exc):
            return False
        raise
