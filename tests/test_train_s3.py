"""The storage path as it runs on the cluster, offline: moto's S3 server (IAM auth enforced) and a
Pod-Identity-style credential endpoint as the only source of credentials (harness/loopback.py).

* the driver's storage check (`storage_check`) round-trips one object through pyarrow's S3
  filesystem, as Ray Train will, and names the cause when the token or the policy is wrong;
* a kill during a checkpoint upload: a real local Ray Train run (a driver process, `harness/driver_run.py`)
  checkpoints to s3:// through `StallingProxy`, which holds checkpoint 8's upload; the driver's whole
  process group is SIGKILLed while it is held, and a rerun under the same name resumes from checkpoint 4,
  the last complete one (the one the checkpoint manager's snapshot in S3 names), never the partial 8, and
  ends with the weights of the session's unbroken run (conftest `reference_run`); the exported model,
  the tracking folder and the rank logs land in S3 too; the credential endpoint was called, always with
  the token.
"""

from __future__ import annotations

import json
import os

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # Ray runs against the local S3 server: `make check` leaves it out

from harness import driver_run  # noqa: E402
from harness.driver_run import SNAPSHOT  # noqa: E402
from harness.loopback import PodIdentityEndpoint, StallingProxy, s3_policy  # noqa: E402
from workloads.fsdp_finetune.storage_check import storage_problem  # noqa: E402
from workloads.fsdp_finetune.train_hooks import latest_in_snapshot as latest_registered  # noqa: E402

BUCKET = "train-s3-path"
HELD = "checkpoint_step_0000008"  # the upload the proxy holds (harness/driver_run.py JOB: checkpoints 4, 8, 12)
COMPLETE = "checkpoint_step_0000004"  # the last checkpoint whose upload completed before the kill
COMPLETE_STEP = 4
HOLD_WAIT_S = 300.0  # driver start, Ray start, model build and 8 steps on a loaded two-core machine


@pytest.fixture(scope="module")
def pod_identity(moto_server):
    """The module's process (and the local Ray cluster it starts) sees only the credential endpoint."""
    moto_server.create_bucket(BUCKET)
    role = moto_server.create_role("train-pod", s3_policy(BUCKET))
    with PodIdentityEndpoint(lambda: moto_server.assume_role(role), moto_server.account_id) as endpoint:
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(endpoint.exclusive_env(moto_server.endpoint_url, base=saved))
        try:
            yield endpoint
        finally:
            os.environ.clear()
            os.environ.update(saved)


_CLIENTS: dict = {}


def _client(moto_server):
    """One admin S3 client per server: the test polls through it, and each new client opens new connections."""
    return _CLIENTS.setdefault(moto_server.endpoint_url, moto_server.client("s3"))


def _objects(moto_server, prefix: str) -> list[str]:
    pages = _client(moto_server).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def test_storage_check_round_trips_through_pod_identity(pod_identity, moto_server):
    before = pod_identity.authorized_calls
    assert storage_problem(f"s3://{BUCKET}/checks", "run-a") is None
    assert pod_identity.authorized_calls > before
    assert set(pod_identity.calls) == {pod_identity.token}
    # The probe object is deleted (pyarrow may leave an empty "folder/" marker when it deletes the last file).
    assert [k for k in _objects(moto_server, "checks/run-a/") if not k.endswith("/")] == []


def test_storage_check_names_a_bucket_the_role_cannot_write(pod_identity, moto_server):
    moto_server.create_bucket("not-the-jobs-bucket")
    problem = storage_problem("s3://not-the-jobs-bucket/checkpoints", "run-b")
    assert problem is not None
    assert "could not write" in problem and "s3://not-the-jobs-bucket/checkpoints" in problem
    assert "AccessDenied" in problem or "Access Denied" in problem or "403" in problem


def _object(moto_server, key: str) -> bytes | None:
    s3 = _client(moto_server)
    try:
        return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None


@pytest.fixture(scope="module")
def upload_killed(pod_identity, moto_server, driver_assets, tmp_path_factory):
    """A driver SIGKILLed (its whole process group) while checkpoint 8's upload is held, then rerun.

    Ray Train registers a checkpoint only once every rank's upload has finished and its report has been
    taken (`_upload_checkpoint`, then `_wait_then_report`: ray/train/v2/_internal/execution/context.py,
    Ray 2.58.0), and a rerun resumes from the latest registered one, named in the checkpoint manager's
    snapshot in storage (`_maybe_load_state_from_storage`, execution/checkpoint/checkpoint_manager.py).
    The kill lands while the upload is held, not by timing: the test waits for the proxy to hold one of
    checkpoint 8's files and for checkpoint 4 to be registered; rank 0 waits after reporting 8
    (`driver_run --gate`), so no later step trains meanwhile.
    """
    out = tmp_path_factory.mktemp("s3kill")
    name, storage, marker = "s3-run", f"s3://{BUCKET}/checkpoints", out / "gate"
    calls_before = pod_identity.authorized_calls
    with StallingProxy(moto_server.endpoint_url) as proxy:
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint_url}  # pyarrow's S3 traffic through the proxy
        proxy.arm(HELD)
        job = ["--assets", str(driver_assets), "--storage", storage]
        proc = driver_run.start(out, name, *job, "--gate", HELD, "--gate-marker", str(marker), env=env)
        try:
            driver_run.wait_for(
                lambda: proxy.held and latest_registered(
                    (_object(moto_server, f"checkpoints/{name}/{SNAPSHOT}") or b"").decode()) == COMPLETE,
                HOLD_WAIT_S, f"{HELD}'s upload held with {COMPLETE} registered", proc, out, name, interval_s=0.5)
        finally:
            driver_run.kill_group(proc)
        killed = {"held": proxy.held, "keys": _objects(moto_server, f"checkpoints/{name}/"),
                  "snapshot": latest_registered(_object(moto_server, f"checkpoints/{name}/{SNAPSHOT}").decode())}
        proxy.disarm()
        status = driver_run.wait_exit(driver_run.start(out, name, *job, env=env), out, name)
        assert status == 0, driver_run.log_tail(out, name)
    return killed, calls_before


def test_a_kill_during_a_checkpoint_upload_leaves_that_checkpoint_unregistered(upload_killed):
    killed, _ = upload_killed
    assert killed["held"] and all(HELD in path for path in killed["held"])
    assert killed["snapshot"] == COMPLETE
    assert not any("/model/" in k for k in killed["keys"])  # the killed run trained no step past 8


def test_the_rerun_resumes_from_the_last_complete_checkpoint_with_unbroken_weights(upload_killed, moto_server,
                                                                                 reference_run):
    from safetensors.torch import load

    body = _object(moto_server, "checkpoints/s3-run/metrics.jsonl").decode()
    records = [json.loads(line) for line in body.splitlines() if line.strip()]
    assert [r["step"] for r in records if r["step"] > COMPLETE_STEP] == [6, 8, 10, 12]
    assert {r["resumed_from_step"] for r in records if r["step"] > COMPLETE_STEP} == {COMPLETE_STEP}  # never 8
    weights = load(_object(moto_server, "checkpoints/s3-run/model/model.safetensors"))
    assert driver_run.same_weights(weights, driver_run.weights(reference_run[0].export_uri))


def test_the_model_tracking_and_rank_logs_land_in_s3(upload_killed, moto_server):
    keys = _objects(moto_server, "checkpoints/s3-run/")
    assert any(k.split("/")[-1].startswith("events.out.tfevents") for k in keys)  # TensorBoard, beside metrics
    assert "checkpoints/s3-run/loss.png" in keys
    assert "checkpoints/s3-run/model/tokenizer_config.json" in keys
    # Logs outlive the cluster: rank 0's last lines beside the metrics, the killed attempt's first lines kept
    # above the rerun's (job_logs.attach_rank_tail).
    rank0 = _object(moto_server, "checkpoints/s3-run/logs/rank-0.log").decode()
    resumed = rank0.index(f"resumed from {BUCKET}/checkpoints/s3-run/{COMPLETE} at step {COMPLETE_STEP}")
    assert "parameters, world size" in rank0[:resumed]  # the killed attempt's
    assert "exported the model" in rank0[resumed:]


def test_ray_took_credentials_only_from_the_endpoint_with_the_token(upload_killed, pod_identity):
    _, calls_before = upload_killed
    assert pod_identity.authorized_calls > calls_before
    assert set(pod_identity.calls) == {pod_identity.token}
