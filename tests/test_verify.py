"""`workloads.verify` decisions on kubernetes client model objects for healthy and broken clusters."""

from __future__ import annotations

import socket

import pytest
from kubernetes.client import (
    V1Container,
    V1DaemonSet,
    V1DaemonSetStatus,
    V1Deployment,
    V1DeploymentSpec,
    V1DeploymentStatus,
    V1EnvVar,
    V1EnvVarSource,
    V1LabelSelector,
    V1Node,
    V1NodeCondition,
    V1NodeStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodCondition,
    V1PodSpec,
    V1PodStatus,
    V1SecretKeySelector,
)

from config.errors import run_cli
from config.k8s import system_node_labels, worker_node_labels
from tests.helpers import EXAMPLES, load_variant
from workloads import verify

MARKER_OK = ('PREFLIGHT_RESULT {"ok":true,"network":"efa","world_size":8,"hosts":2,"all_reduce_busbw_gbs":3.41,'
             '"size_bytes":1073741824,"floor_gbs":1.25,"failures":[]}')
MARKER_FAIL = ('PREFLIGHT_RESULT {"ok":false,"network":"socket","world_size":8,"hosts":2,"all_reduce_busbw_gbs":0.8,'
               '"size_bytes":1073741824,"floor_gbs":1.25,"failures":["all: nccl-network: EFA expected but NCCL '
               'selected NET/Socket"]}')


def node(name, labels, *, gpu="4", efa="1", ready=True):
    alloc = {"cpu": "47810m", "memory": "180Gi", "hugepages-2Mi": "5Gi"}
    if gpu is not None:
        alloc["nvidia.com/gpu"] = gpu
    if efa is not None:
        alloc["vpc.amazonaws.com/efa"] = efa
    return V1Node(metadata=V1ObjectMeta(name=name, labels=labels),
                  status=V1NodeStatus(allocatable=alloc,
                                      conditions=[V1NodeCondition(type="Ready", status="True" if ready else "False")]))


def daemonset(name, namespace="kube-system", *, desired=2, ready=2):
    return V1DaemonSet(metadata=V1ObjectMeta(name=name, namespace=namespace),
                       status=V1DaemonSetStatus(desired_number_scheduled=desired, number_ready=ready,
                                                current_number_scheduled=desired, number_misscheduled=0))


def deployment(name, namespace="kuberay-operator", *, replicas=1, ready=1):
    return V1Deployment(metadata=V1ObjectMeta(name=name, namespace=namespace),
                        spec=V1DeploymentSpec(replicas=replicas, selector=V1LabelSelector(), template={}),
                        status=V1DeploymentStatus(ready_replicas=ready))


def token_env(cluster="finetune-raycluster-x7k"):
    """The environment KubeRay adds to every Ray container for `authOptions.mode: token`."""
    return [V1EnvVar(name="RAY_AUTH_MODE", value="token"),
            V1EnvVar(name="RAY_AUTH_TOKEN", value_from=V1EnvVarSource(
                secret_key_ref=V1SecretKeySelector(name=cluster, key="auth_token")))]


def ray_pod(name, kind, *, ready=True, cluster="finetune-raycluster-x7k", env=None):
    container = V1Container(name=f"ray-{kind}", env=token_env(cluster) if env is None else env)
    return V1Pod(metadata=V1ObjectMeta(name=name, labels={"ray.io/node-type": kind, "ray.io/cluster": cluster}),
                 spec=V1PodSpec(containers=[container]),
                 status=V1PodStatus(phase="Running" if ready else "Pending",
                                    conditions=[V1PodCondition(type="Ready", status="True" if ready else "False")]))


def rayjob(name="finetune", created="2026-12-01T10:00:00Z", job_status="RUNNING", deployment_status="Running"):
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": name, "namespace": "ray", "creationTimestamp": created},
            "status": {"jobStatus": job_status, "jobDeploymentStatus": deployment_status,
                       "rayClusterName": "finetune-raycluster-x7k"}}


def healthy(config):
    group = config.cluster.worker_groups[0]
    return {
        "nodes": [node("ip-10-0-1-23", worker_node_labels(config, group)),
                  node("ip-10-0-1-57", worker_node_labels(config, group)),
                  node("ip-10-0-2-11", system_node_labels(), gpu=None, efa=None)],
        "daemonsets": [daemonset("nvidia-device-plugin"),
                       daemonset("nvidia-device-plugin-mps-control-daemon", desired=0, ready=0),
                       daemonset("aws-efa-k8s-device-plugin"),
                       daemonset("aws-node", desired=3, ready=3)],
        "deployments": [deployment("kuberay-operator"), deployment("coredns", "kube-system", replicas=2, ready=2)],
        "pods": [ray_pod("finetune-head-abcde", "head"), ray_pod("finetune-gpu-worker-1", "worker"),
                 ray_pod("finetune-gpu-worker-2", "worker")],
        "rayjobs": [rayjob("old", created="2026-11-30T10:00:00Z", job_status="FAILED", deployment_status="Failed"),
                    rayjob()],
        "job_logs": "2026-12-01 10:01:02 INFO starting\n" + MARKER_OK + "\nTraining started\n",
    }


def idle(config):
    """The default cluster after a job: its Ray cluster deleted, no GPU node (scaled to zero), device plugins with
    nothing to run on."""
    snap = healthy(config)
    snap["nodes"] = [n for n in snap["nodes"] if n.metadata.labels.get("ray-efa.io/role") == "system"]
    snap["daemonsets"] = [daemonset("nvidia-device-plugin", desired=0, ready=0),
                          daemonset("aws-efa-k8s-device-plugin", desired=0, ready=0)]
    snap["pods"], snap["job_logs"] = [], None
    snap["rayjobs"] = [rayjob(job_status="SUCCEEDED", deployment_status="Complete")]
    return snap


@pytest.mark.parametrize(("autoscaling", "expected"), [(True, "SKIP"), (False, "FAIL")])
def test_gpu_groups_without_nodes_are_idle_only_under_the_autoscaler(tmp_path, autoscaling, expected):
    config = load_variant(tmp_path, {"autoscaling": {"enabled": autoscaling}})
    rows = verify.evaluate(config, **idle(config))
    got = statuses(rows)
    assert got[("nodes", "group gpu")] == got[("add-ons", "NVIDIA device plugin")] == expected
    assert verify.failed(rows) is (not autoscaling), verify.render(rows)


def statuses(rows):
    return {(r.section, r.name): r.status for r in rows}


def test_healthy_cluster_passes(tmp_path):
    config = load_variant(tmp_path)
    rows = verify.evaluate(config, **healthy(config))
    assert not verify.failed(rows), verify.render(rows)
    got = statuses(rows)
    assert got[("nodes", "ip-10-0-1-23")] == "PASS" and got[("nodes", "group gpu")] == "PASS"
    assert ("nodes", "ip-10-0-2-11") not in got  # system node: not a GPU node
    assert got[("ray", "workers")] == "PASS" and got[("job", "last preflight")] == "PASS"
    # The MPS control daemon wants 0 pods by design and is not counted as the device plugin.
    assert sum(1 for r in rows if r.name == "NVIDIA device plugin") == 1
    text = verify.render(rows)
    assert "verify: PASS" in text and "3.41 GB/s" in text


def test_device_plugin_daemonset_with_zero_desired_pods_fails(tmp_path):
    config = load_variant(tmp_path)
    snap = healthy(config)
    snap["daemonsets"][2] = daemonset("aws-efa-k8s-device-plugin", desired=0, ready=0)
    rows = verify.evaluate(config, **snap)
    bad = [r for r in rows if r.status == "FAIL"]
    assert [r.name for r in bad] == ["EFA device plugin"]
    assert "0 desired pods" in bad[0].detail and "vpc.amazonaws.com/efa.present=true" in bad[0].fix


def test_node_without_efa_allocatable_fails(tmp_path):
    config = load_variant(tmp_path)
    snap = healthy(config)
    labels = worker_node_labels(config, config.cluster.worker_groups[0])
    snap["nodes"][1] = node("ip-10-0-1-57", labels, efa=None)
    rows = verify.evaluate(config, **snap)
    bad = [r for r in rows if r.status == "FAIL"]
    assert [r.name for r in bad] == ["ip-10-0-1-57"]
    assert "vpc.amazonaws.com/efa allocatable 0, expected 1" in bad[0].detail
    assert "EFA device plugin" in bad[0].fix
    assert "ip-10-0-1-57" in verify.render(rows) and "verify: FAIL" in verify.render(rows)


def test_socket_transport_does_not_need_efa(tmp_path):
    config = load_variant(tmp_path, base=EXAMPLES / "socket.yaml", name="socket.yaml")
    snap = healthy(config)
    labels = worker_node_labels(config, config.cluster.worker_groups[0])
    snap["nodes"][:2] = [node("a", labels, gpu="1", efa=None), node("b", labels, gpu="1", efa=None)]
    snap["daemonsets"] = [daemonset("nvidia-device-plugin")]
    rows = verify.evaluate(config, **snap)
    assert not verify.failed(rows), verify.render(rows)
    assert statuses(rows)[("add-ons", "EFA device plugin")] == "SKIP"


def test_missing_gpu_node_gpu_allocatable_and_missing_operator(tmp_path):
    config = load_variant(tmp_path)
    snap = healthy(config)
    labels = worker_node_labels(config, config.cluster.worker_groups[0])
    snap["nodes"][0] = node("ip-10-0-1-23", labels, gpu="0", ready=False)
    snap["deployments"] = [deployment("coredns", "kube-system")]
    rows = verify.evaluate(config, **snap)
    got = statuses(rows)
    assert got[("nodes", "ip-10-0-1-23")] == "FAIL"
    assert got[("nodes", "group gpu")] == "FAIL"  # one Ready node of two
    assert got[("add-ons", "KubeRay operator")] == "FAIL"
    node_row = next(r for r in rows if r.name == "ip-10-0-1-23")
    assert "not Ready" in node_row.detail and "nvidia.com/gpu allocatable 0, expected 4" in node_row.detail


def test_unready_daemonset_and_worker_pods(tmp_path):
    config = load_variant(tmp_path)
    snap = healthy(config)
    snap["daemonsets"][0] = daemonset("nvidia-device-plugin", "nvidia-device-plugin", desired=2, ready=1)
    snap["pods"][2] = ray_pod("finetune-gpu-worker-2", "worker", ready=False)
    rows = verify.evaluate(config, **snap)
    got = statuses(rows)
    assert got[("add-ons", "NVIDIA device plugin")] == "FAIL"
    assert got[("ray", "workers")] == "FAIL"
    workers = next(r for r in rows if r.name == "workers")
    assert "1/2 worker pods ready" in workers.detail and "finetune-gpu-worker-2" in workers.detail


def test_failed_preflight_marker_fails_and_missing_one_warns(tmp_path):
    config = load_variant(tmp_path)
    snap = healthy(config)
    snap["job_logs"] = MARKER_OK + "\n" + MARKER_FAIL  # a retry: the last line counts
    rows = verify.evaluate(config, **snap)
    row = next(r for r in rows if r.name == "last preflight")
    assert row.status == "FAIL" and "NET/Socket" in row.detail and "finetune" in row.detail
    snap["job_logs"] = None
    assert statuses(verify.evaluate(config, **snap))[("job", "last preflight")] == "WARN"
    snap["rayjobs"] = []
    assert statuses(verify.evaluate(config, **snap))[("job", "last preflight")] == "SKIP"


def test_finished_job_without_pods_skips_ray_rows(tmp_path):
    config = load_variant(tmp_path)
    snap = healthy(config)
    snap["pods"] = []
    snap["rayjobs"] = [rayjob(job_status="SUCCEEDED", deployment_status="Complete")]
    rows = verify.evaluate(config, **snap)
    assert statuses(rows)[("ray", "head and workers")] == "SKIP"
    snap["rayjobs"] = [rayjob()]
    got = statuses(verify.evaluate(config, **snap))
    assert got[("ray", "head")] == "FAIL" and got[("ray", "workers")] == "FAIL"


def test_latest_rayjob():
    jobs = [rayjob("b", created="2026-12-01T10:00:00Z"), rayjob("a", created="2026-12-02T09:00:00Z")]
    assert verify.latest_rayjob(jobs)["metadata"]["name"] == "a"
    assert verify.latest_rayjob([]) is None


def test_unreachable_cluster_exits_2(tmp_path, capsys):
    # A port bound but not listening, held for the whole test: a real connection refusal, no API server,
    # and no other process can take the port meanwhile (as it could once a probe socket is closed).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
        with pytest.raises(SystemExit) as exited:
            run_cli(verify.main, ["--kubeconfig", str(kubeconfig)])
        assert exited.value.code == 2
    assert "cannot read the cluster" in capsys.readouterr().err



def test_iter_lines_across_chunks_and_bounded():
    chunks = [b"first li", b"ne\nsec", b"ond\n", b"x" * 50, b"y" * 50, b"\nafter long\nno newline at end"]
    assert list(verify.iter_lines(chunks, max_line=64)) == [
        "first line", "second", "x" * 50 + "y" * 14, "after long", "no newline at end"]
    assert list(verify.iter_lines(["a\n", "b"])) == ["a", "b"]


class FakeResponse:
    """What read_namespaced_pod_log(..., _preload_content=False) returns: a urllib3 response to stream."""

    def __init__(self, text: str):
        self.data = text.encode()
        self.released = False
        self.largest_chunk = 0

    def stream(self, amt):
        for at in range(0, len(self.data), amt):
            chunk = self.data[at:at + amt]
            self.largest_chunk = max(self.largest_chunk, len(chunk))
            yield chunk

    def release_conn(self):
        self.released = True


class FakeCore:
    """CoreV1Api's two calls that `submitter_marker` makes, over fixed log texts per pod."""

    def __init__(self, logs: dict[str, str]):
        self.logs = logs
        self.calls = []
        self.responses = []

    def list_namespaced_pod(self, namespace, label_selector=None):
        self.selectors = [*getattr(self, "selectors", []), label_selector]
        pods = [V1Pod(metadata=V1ObjectMeta(name=name, creation_timestamp=f"2026-12-01T10:0{i}:00Z"))
                for i, name in enumerate(self.logs)]
        return type("PodList", (), {"items": list(reversed(pods))})()

    def read_namespaced_pod_log(self, name, namespace, **kwargs):
        self.calls.append((name, kwargs))
        self.responses.append(FakeResponse(self.logs[name]))
        return self.responses[-1]


def nccl_flood(lines: int) -> str:
    return "".join(f"finetune-gpu-worker-{i % 2}:312:{400 + i % 8} [{i % 4}] NCCL INFO Channel {i % 32:02d}/0 : "
                   f"0[0] -> 1[1] via P2P/CUMEM\n" for i in range(lines))


def test_marker_found_after_a_long_nccl_flood(tmp_path):
    """Training's NCCL INFO output after the preflight pushes the marker far beyond any tail window."""
    config = load_variant(tmp_path)
    log = "2026-12-01 10:01:02 INFO starting\n" + MARKER_FAIL + "\n" + nccl_flood(60_000) + "step 10 loss 1.2\n"
    core = FakeCore({"finetune-abcde": log})
    line = verify.submitter_marker(core, "ray", "finetune")
    assert line == MARKER_FAIL
    (name, kwargs), = core.calls
    assert name == "finetune-abcde" and "tail_lines" not in kwargs and kwargs["_preload_content"] is False
    # K8sJobMode: the submitter Job's pods, labelled by KubeRay with the RayJob's name; our container's name.
    assert kwargs["container"] == "ray-job-submitter"
    assert core.selectors == ["ray.io/originated-from-cr-name=finetune"]
    assert core.responses[0].released and core.responses[0].largest_chunk <= 64 * 1024 < len(log)
    snap = healthy(config)
    snap["job_logs"] = line
    row = next(r for r in verify.evaluate(config, **snap) if r.name == "last preflight")
    assert row.status == "FAIL" and "NET/Socket" in row.detail


def test_marker_from_latest_submitter_and_missing():
    # A retried submitter: the later pod's result wins, whatever order the API lists them in.
    core = FakeCore({"finetune-1": MARKER_FAIL + "\n" + nccl_flood(10), "finetune-2": MARKER_OK + "\n"})
    assert verify.submitter_marker(core, "ray", "finetune") == MARKER_OK
    assert verify.submitter_marker(FakeCore({"finetune-1": nccl_flood(10)}), "ray", "finetune") == ""
    assert verify.submitter_marker(FakeCore({}), "ray", "finetune") is None


def test_head_with_the_injected_token_passes(tmp_path):
    config = load_variant(tmp_path)
    rows = verify.evaluate(config, **healthy(config))
    (row,) = [r for r in rows if r.name == "token auth"]
    assert row.status == "PASS" and "Secret finetune-raycluster-x7k (key auth_token)" in row.detail


def test_head_without_token_auth_fails_when_the_file_asks_for_it(tmp_path):
    config = load_variant(tmp_path)
    snapshot = healthy(config)
    snapshot["pods"][0] = ray_pod("finetune-head-abcde", "head", env=[])
    rows = verify.evaluate(config, **snapshot)
    assert statuses(rows)[("ray", "token auth")] == "FAIL"
    assert verify.failed(rows)
    assert "authOptions" in verify.render(rows)


def test_disabled_auth_warns(tmp_path):
    config = load_variant(tmp_path, {"ray": {"auth": "disabled"}})
    snapshot = healthy(config)
    snapshot["pods"] = [ray_pod(p.metadata.name, p.metadata.labels["ray.io/node-type"], env=[])
                        for p in snapshot["pods"]]
    rows = verify.evaluate(config, **snapshot)
    assert statuses(rows)[("ray", "token auth")] == "WARN"
    assert not verify.failed(rows)


# ---- the last job's outcome ------------------------------------------------------------------------


def _finished(config, job_status, deployment_status, reason=None, message=None, *, workers=0):
    snap = healthy(config)
    job = rayjob(job_status=job_status, deployment_status=deployment_status)
    job["status"].update({k: v for k, v in (("reason", reason), ("message", message)) if v})
    snap["rayjobs"] = [job]
    snap["pods"] = [ray_pod("finetune-head-abcde", "head")] + [
        ray_pod(f"finetune-gpu-worker-{i}", "worker") for i in range(workers)]
    # DeleteWorkers has released the GPU workers, so their nodes are scaling away.
    snap["nodes"] = [n for n in snap["nodes"] if n.metadata.labels.get("ray-efa.io/role") != "gpu"]
    return snap


def test_a_finished_successful_job_passes_with_its_workers_released(tmp_path):
    config = load_variant(tmp_path)
    rows = verify.evaluate(config, **_finished(config, "SUCCEEDED", "Complete"))
    assert not verify.failed(rows), verify.render(rows)
    got = statuses(rows)
    assert got[("ray", "head")] == "PASS" and got[("ray", "workers")] == "SKIP"
    (job,) = [r for r in rows if r.name == "last job"]
    assert job.status == "PASS" and "succeeded" in job.detail
    assert "ray.io/originated-from-cr-name=finetune -c ray-job-submitter" in job.detail
    # The logs that outlive the cluster: beside the run's metrics in the checkpoint storage.
    assert f"{config.job.run_name}/logs/" in job.detail and job.detail.count("s3://") == 1


@pytest.mark.parametrize(("stage", "reason", "expected"), [
    (None, "AppFailed", "plan"),
    ("settings", "AppFailed", "settings"),
    ("preflight", "AppFailed", "preflight"),
    ("train", "AppFailed", "training"),
    (None, "PreRunningDeadlineExceeded", "waiting for the cluster"),
    ("train", "DeadlineExceeded", "deadline"),
    (None, "SubmissionFailed", "submission"),
])
def test_a_failed_job_names_the_failing_stage(tmp_path, stage, reason, expected):
    config = load_variant(tmp_path)
    snap = _finished(config, "FAILED" if reason == "AppFailed" else "PENDING", "Failed", reason=reason)
    rows = verify.evaluate(config, **snap, job_stage=stage)
    (job,) = [r for r in rows if r.name == "last job"]
    assert job.status == "FAIL" and f"at stage '{expected}'" in job.detail
    assert job.fix
    assert [r.name for r in rows if r.status == "FAIL"] == ["last job"]  # released GPU nodes are not a failure


def test_a_job_stopped_by_its_spent_deadline_fails_though_kuberay_says_succeeded(tmp_path):
    """A spent job.timeout_hours ends the job with status 0 (no KubeRay retry: workloads/fsdp_finetune/deadline.py),
    so the RayJob is Complete/SUCCEEDED; the driver's last JOB_STAGE says what happened."""
    config = load_variant(tmp_path)
    rows = verify.evaluate(config, **_finished(config, "SUCCEEDED", "Complete"), job_stage="deadline")
    (job,) = [r for r in rows if r.name == "last job"]
    assert job.status == "FAIL" and "at stage 'deadline'" in job.detail and "did not retry" in job.detail
    assert "resubmit" in job.fix


def test_no_capacity_says_so(tmp_path):
    config = load_variant(tmp_path)
    rows = verify.evaluate(config, **_finished(config, "PENDING", "Failed", reason="PreRunningDeadlineExceeded",
                                               message="The RayJob has passed the preRunningDeadlineSeconds."))
    (job,) = [r for r in rows if r.name == "last job"]
    assert "no GPU capacity" in job.detail and "quota" in job.detail and "preRunningDeadlineSeconds" in job.detail


def test_stage_is_the_last_job_stage_line_of_the_submitter_logs():
    log = "JOB_STAGE settings\n" + MARKER_OK + "\nJOB_STAGE preflight\nnoise\nJOB_STAGE train\nstep 1\n"
    core = FakeCore({"finetune-sub-1": "JOB_STAGE settings\n", "finetune-sub-2": log})
    assert verify.submitter_logs(core, "ray", "finetune") == (MARKER_OK, "train")
    assert verify.submitter_logs(FakeCore({"x": "nothing\n"}), "ray", "finetune") == ("", None)


def test_a_running_job_passes(tmp_path):
    config = load_variant(tmp_path)
    rows = verify.evaluate(config, **healthy(config), job_stage="train")
    (job,) = [r for r in rows if r.name == "last job"]
    assert job.status == "PASS" and "stage train" in job.detail
