"""`make cluster-real`: the project's RayJob, as synthesized, through the real KubeRay 1.7.0 operator on a real node.

One module-scoped cluster (tests/cluster_real/harness.py): the lab's control plane and operator, one real kubelet
node holding the head and both worker pods (real containers of the stand-in image, tests/cluster_real/image.py),
the test's S3 server on the node's bridge address. The RayJob is the `dist/` output of the lab variable file
(tests/fixtures/cluster-real.yaml) with only the declared substitutions (tests/cluster_real/substitutions.py).

1. A run to the end: the submitter Job runs follow.sh, which runs `ray job submit`; two CPU workers on gloo train
   the demo's tiny model, checkpoint to S3 more than once, export; the RayJob ends Complete/SUCCEEDED.
2. The head pod lost mid-run (deleted after the first checkpoint reached S3): KubeRay recreates the head, follow.sh
   finds the new head without the job and resubmits it under the same id, the workload resumes from the last
   checkpoint, and the same RayJob ends SUCCEEDED with no backoffLimit retry (status.failed stays unset, one
   RayCluster, one submitter pod).

Each run prints its timeline and writes its entry to dist/cluster-report.json (beside the cluster tier's scenarios).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness.waiting import wait_for
from tests import k8s_lab
from tests.cluster_real import harness, image, substitutions
from tests.cluster_real.harness import NAMESPACE, S3, Lab, Node, Timeline, wait
from workloads.fsdp_finetune.train_hooks import latest_in_snapshot

pytestmark = [pytest.mark.slow, pytest.mark.cluster_real]

LAB_FILE = harness.REPO / "tests" / "fixtures" / "cluster-real.yaml"
RUN_TIMEOUT_S = 900
# Production values for the report's cost (docs/failure-handling.md): the GPU nodes of the reference file.
PRODUCTION_GPU_NODES = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = harness.available()
    if why:
        if os.environ.get("CLUSTER_TIER_REQUIRED"):
            pytest.fail(why)
        pytest.skip(why)
    from config import load_config
    from config.k8s import system_node_labels, worker_pod_node_selector

    config = load_config(LAB_FILE)
    times: dict[str, float] = {}
    t0 = time.monotonic()
    archive = image.build(log=lambda m: print(m, file=sys.stderr))
    times["image"] = time.monotonic() - t0
    lab = Lab(harness.CACHE / "lab")
    node = None
    s3 = None
    try:
        times["lab up"] = lab.up()
        node = Node(harness.CACHE / "node", lab.kubeconfig)
        labels = {**system_node_labels(), **worker_pod_node_selector(config.cluster.worker_groups[0])}
        times.update(node.up(gpus=config.world_size, labels=labels, image_archive=archive, image=image.image_name()))
        s3 = S3()
        t1 = time.monotonic()
        outdir = tmp_path_factory.mktemp("dist")
        subprocess.run([sys.executable, "-m", "charts", str(LAB_FILE), "--outdir", str(outdir)], check=True,
                       cwd=harness.REPO, capture_output=True, timeout=300)
        times["synth"] = time.monotonic() - t1
        t2 = time.monotonic()
        _upload_assets(s3, config)
        times["assets"] = time.monotonic() - t2
        print("set-up: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()), file=sys.stderr)
        yield {"config": config, "lab": lab, "node": node, "s3": s3, "dist": outdir, "times": times}
    finally:
        if s3 is not None:
            s3.stop()
        if node is not None:
            node.down()
        lab.down()


def assets_dir(config) -> Path:
    """Where the lab file's local dataset lives on the node: `job.dataset` is <dir>/data/train.jsonl."""
    return Path(config.job.dataset).parents[1]


def _upload_assets(s3: S3, config) -> None:
    """The demo's tiny model and arithmetic data (workloads/fsdp_finetune/local_assets.py): the model to S3, where
    the file names it (the workload downloads it with boto3), the data where the file names it on the node.

    The data stays on the node (a read-only host mount, a declared substitution): `datasets` reads s3:// through
    s3fs, which the project's venv does not carry (s3fs 2026.9.0 would pin botocore below the venv's)."""
    from workloads.fsdp_finetune.local_assets import prepare_local_assets

    assets = prepare_local_assets(assets_dir(config))
    assert Path(config.job.dataset) == Path(assets.dataset_path)
    client = s3.client()
    bucket = config.storage.bucket_name
    client.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": config.region})
    model_prefix = config.job.model.removeprefix(f"s3://{bucket}/")
    for path in sorted(Path(assets.model_dir).rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{model_prefix}/{path.relative_to(assets.model_dir)}")


def _manifests(cluster) -> tuple[list[dict], dict, dict]:
    base = [d for d in yaml.safe_load_all((cluster["dist"] / "ray-base.k8s.yaml").read_text()) if d]
    job_docs = [d for d in yaml.safe_load_all((cluster["dist"] / "ray-job.k8s.yaml").read_text()) if d]
    (rayjob,) = [d for d in job_docs if d["kind"] == "RayJob"]
    others = [d for d in job_docs if d["kind"] != "RayJob"]
    lab = substitutions.substitute(rayjob, image=image.image_name(),
                                   host_paths=[image.python_home(), image.venv_dir(),
                                               assets_dir(cluster["config"])],
                                   s3_env=cluster["s3"].pod_env())
    return base + others, rayjob, lab


def _apply(cluster, objects: list[dict], where: Path) -> None:
    path = where / "apply.yaml"
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    harness._run(cluster["node"].kubectl + ["apply", "--server-side", "--force-conflicts", "-f", str(path)],
                 timeout=120)


def _get(cluster, *args: str) -> dict:
    out = harness._run(cluster["node"].kubectl + ["get", "-n", NAMESPACE, *args, "-o", "json"], timeout=60,
                       check=False)
    return json.loads(out or "{}")


def _checkpoints(cluster) -> set[str]:
    config = cluster["config"]
    prefix = f"{config.storage.checkpoint_prefix}{config.job.run_name}/"
    keys = cluster["s3"].keys(config.storage.bucket_name, prefix)
    return {k[len(prefix):].split("/")[0] for k in keys if k[len(prefix):].startswith("checkpoint_")}


def _registered(cluster) -> str | None:
    """The checkpoint Ray Train's controller registered last, from the snapshot it writes to the run's storage.

    A checkpoint folder in S3 is not yet a checkpoint a new attempt resumes from: Ray uploads the folder, then the
    controller registers it and rewrites `checkpoint_manager_snapshot.json` (Ray 2.58.0
    train/v2/_internal/execution/checkpoint/checkpoint_manager.py). A head lost between the two restarts from
    step 0, correctly; so the test loses the head only once a checkpoint is registered.
    """
    config = cluster["config"]
    key = f"{config.storage.checkpoint_prefix}{config.job.run_name}/checkpoint_manager_snapshot.json"
    try:
        body = cluster["s3"].client().get_object(Bucket=config.storage.bucket_name, Key=key)["Body"].read()
    except Exception:  # noqa: BLE001 - not written yet (NoSuchKey) reads as "nothing registered"
        return None
    return latest_in_snapshot(body)


def _metrics(cluster) -> list[dict]:
    config = cluster["config"]
    prefix = f"{config.storage.checkpoint_prefix}{config.job.run_name}/"
    client = cluster["s3"].client()
    rows = []
    for key in cluster["s3"].keys(config.storage.bucket_name, prefix):
        if key.endswith("metrics.jsonl"):
            body = client.get_object(Bucket=config.storage.bucket_name, Key=key)["Body"].read().decode()
            rows += [json.loads(line) for line in body.splitlines() if line.strip()]
    return rows


def _submitter_log(cluster, name: str) -> str:
    """The submitter's log (follow.sh and the driver's log it follows): what a failed run is read from."""
    pods = [p["metadata"]["name"] for p in _get(cluster, "pods")["items"]
            if p["metadata"].get("labels", {}).get("job-name") == name]
    return "".join(harness._run(cluster["node"].kubectl + ["logs", "-n", NAMESPACE, pod], timeout=60, check=False)
                   for pod in pods)


def _kept_submitter_logs(cluster, name: str, job_id: str) -> dict[str, str]:
    """The submitter logs follow.sh kept in `<run folder>/logs/` (its EXIT trap copies them: KubeRay deletes the
    submitter Job, and its pod's log, at every retry), waited for: the pod exits after the RayJob may read
    terminal. Each must end with follow.sh's own `ended` line for the job."""
    config = cluster["config"]
    prefix = f"{config.storage.checkpoint_prefix}{config.job.run_name}/logs/"
    client = cluster["s3"].client()

    seen: dict[str, str] = {}

    def kept():
        keys = cluster["s3"].keys(config.storage.bucket_name, prefix)
        seen.clear()
        seen.update({k[len(prefix):]: client.get_object(Bucket=config.storage.bucket_name, Key=k)["Body"].read()
                     .decode() for k in keys if k[len(prefix):].startswith("submitter-")})  # not driver/rank logs
        return dict(seen) if seen and all(f"follow.sh: job {job_id} ended: " in t for t in seen.values()) else None

    def detail() -> str:
        found = "".join(f"\n--- {key} (tail):\n{text[-1500:]}" for key, text in seen.items()) or " none"
        return f"\nkept:{found}\nsubmitter pod log (tail):\n{_submitter_log(cluster, name)[-1500:]}"

    return wait_for(kept, 90, f"the submitter log of {name} in s3://{config.storage.bucket_name}/{prefix}",
                    interval_s=1, detail=detail)


def _ended(cluster, name: str, status: dict) -> None:
    """Fail with the driver's log unless the RayJob ended Complete/SUCCEEDED."""
    if (status.get("jobDeploymentStatus"), status.get("jobStatus")) != ("Complete", "SUCCEEDED"):
        pytest.fail(f"RayJob ended {status}\nsubmitter log (tail):\n{_submitter_log(cluster, name)[-6000:]}")


def _terminal(cluster, name: str):
    status = _get(cluster, "rayjob", name).get("status", {})
    if status.get("jobDeploymentStatus") in ("Complete", "Failed"):
        return status
    return None


def _start_run(cluster, tmp_path) -> tuple[dict, Timeline]:
    objects, product, lab = _manifests(cluster)
    name = product["metadata"]["name"]
    # Each run starts from an empty storage path and no RayJob of that name (the first run's is deleted first).
    harness._run(cluster["node"].kubectl + ["delete", "rayjob", "-n", NAMESPACE, name, "--ignore-not-found",
                                            "--wait=true", "--timeout=120s"], timeout=180, check=False)
    wait(lambda: not _get(cluster, "pods").get("items"), 180, "the previous run's pods to go")
    config = cluster["config"]
    cluster["s3"].delete_prefix(config.storage.bucket_name, config.storage.checkpoint_prefix)
    timeline = Timeline(cluster["node"].kubectl, name)
    _apply(cluster, objects + [lab], tmp_path)
    timeline.mark("RayJob applied (the lab file's dist/ output, declared substitutions only)")
    return product, timeline.start()


def back_to_running(events: list[tuple[float, str]]) -> float:
    """When the RayJob last became RUNNING (seconds on the timeline): after follow.sh's last resubmission, the job
    running again. Not "the first RUNNING after the line `resubmitting`": the timeline reads the RayJob's status and
    the submitter's log on separate polls, and in one CI run the resubmitted job's RUNNING was seen 0.5 s before
    follow.sh's line. The timeline records a status only when it changes, so the last RUNNING is the resumed run's."""
    return max(t for t, text in events if text.startswith("RayJob Running/RUNNING"))


def _report(entry: dict) -> None:
    k8s_lab.write_report([entry])


def test_only_declared_substitutions(cluster):
    _, product, lab = _manifests(cluster)
    print("\n" + substitutions.render_table())
    print("changed leaves: " + ", ".join(substitutions.changed_leaves(product, lab)))
    assert substitutions.undeclared(product, lab) == []
    # The table's rows each change something: a row that matches nothing is stale.
    leaves = substitutions.changed_leaves(product, lab)
    for row in substitutions.TABLE:
        assert any(substitutions.matches(leaf, row.pattern) for leaf in leaves), row.pattern
    # And the check is not blind: a change outside the table is caught.
    lab["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] = "1"
    assert substitutions.undeclared(product, lab) == [
        "spec.rayClusterSpec.headGroupSpec.rayStartParams.num-gpus: '0' -> '1'"]


def test_a_run_to_the_end(cluster, tmp_path):
    product, timeline = _start_run(cluster, tmp_path)
    name = product["metadata"]["name"]
    seen: set[str] = set()
    try:
        status = wait(lambda: seen.update(_checkpoints(cluster)) or _terminal(cluster, name), RUN_TIMEOUT_S,
                      "the RayJob to end", detail=lambda: "\n" + timeline.render("so far"))
        timeline.observe()
    finally:
        timeline.stop()
        print("\n" + timeline.render("a run to the end"))
    _ended(cluster, name, status)
    assert not status.get("failed"), status  # no backoffLimit retry
    seen |= _checkpoints(cluster)
    assert len(seen) >= 2, seen  # checkpointed at least twice
    assert any("Running ready" in text and "-head-" in text for _, text in timeline.events)
    workers = {text.split()[1] for _, text in timeline.events if "-worker-" in text and "Running ready" in text}
    assert len(workers) == 2, workers
    assert timeline.first("submitter: follow.sh: job") is not None, timeline.render("")
    steps = [row["step"] for row in _metrics(cluster) if "step" in row]
    assert steps and max(steps) == cluster["config"].job.max_steps
    (pod,) = [p["metadata"]["name"] for p in _get(cluster, "pods")["items"]
              if p["metadata"].get("labels", {}).get("job-name") == name]
    logs = _kept_submitter_logs(cluster, name, status["jobId"])
    assert list(logs) == [f"submitter-{status['jobId']}-{pod}.log"], list(logs)
    assert f"follow.sh: job {status['jobId']} ended: SUCCEEDED" in logs[f"submitter-{status['jobId']}-{pod}.log"]
    _report({"scenario": "real node: a run to the end", "outcome": "SUCCEEDED", "gpu_nodes": PRODUCTION_GPU_NODES,
             "gpu_node_minutes_lost": 0, "limit": ""})


def test_head_pod_lost_resumes_in_the_same_rayjob(cluster, tmp_path):
    product, timeline = _start_run(cluster, tmp_path)
    name = product["metadata"]["name"]
    seen: set[str] = set()
    try:
        registered = wait_for(lambda: _registered(cluster), RUN_TIMEOUT_S, "the first checkpoint registered in S3",
                              interval_s=0.3, detail=lambda: "\n" + timeline.render("so far"))
        seen.update(_checkpoints(cluster))
        cluster_name = _get(cluster, "rayjob", name)["status"]["rayClusterName"]
        (head,) = [p["metadata"]["name"] for p in _get(cluster, "pods", "-l", "ray.io/node-type=head")["items"]]
        killed_at = timeline.mark(f"checkpoint {registered} registered (in S3: {sorted(seen)}); "
                                  f"deleting head pod {head}")
        # Lost as with its node: no grace period (the kubelet's minimum applies), the API object gone at once.
        harness._run(cluster["node"].kubectl + ["delete", "pod", "-n", NAMESPACE, head, "--grace-period=0",
                                                "--force", "--wait=false"], timeout=60)
        status = wait(lambda: seen.update(_checkpoints(cluster)) or _terminal(cluster, name), RUN_TIMEOUT_S,
                      "the RayJob to end", detail=lambda: "\n" + timeline.render("so far"))
        timeline.observe()
    finally:
        timeline.stop()
        print("\n" + timeline.render("head pod lost mid-run"))
    _ended(cluster, name, status)
    assert not status.get("failed"), status  # the same RayJob, no backoffLimit retry
    assert status["rayClusterName"] == cluster_name
    resubmitted = timeline.first("resubmitting")
    assert resubmitted is not None and resubmitted > killed_at, timeline.render("")
    metrics = _metrics(cluster)
    resumed = [row["resumed_from_step"] for row in metrics if row.get("resumed_from_step")]
    assert resumed and min(resumed) >= cluster["config"].job.checkpoint_every, metrics[-3:]
    steps = [row["step"] for row in metrics if "step" in row]
    assert max(steps) == cluster["config"].job.max_steps
    submitters = [p for p in _get(cluster, "pods")["items"] if p["metadata"].get("labels", {}).get("job-name") == name]
    assert len(submitters) == 1, [p["metadata"]["name"] for p in submitters]
    # One attempt (the resubmission is inside it), so one kept log, which holds the resubmission too.
    (log,) = _kept_submitter_logs(cluster, name, status["jobId"]).values()
    assert "resubmitting" in log and f"follow.sh: job {status['jobId']} ended: SUCCEEDED" in log
    # Cost at production values: the GPU nodes idle from the loss until the job runs again (the RayJob's
    # RUNNING after the last resubmission; a crash-looping new head can need more than one).
    minutes = round((back_to_running(timeline.events) - killed_at) / 60 * PRODUCTION_GPU_NODES, 2)
    _report({"scenario": "real node: head pod lost mid-run", "outcome": "resumed in the same RayJob, SUCCEEDED",
             "gpu_nodes": PRODUCTION_GPU_NODES, "gpu_node_minutes_lost": minutes, "limit": ""})
