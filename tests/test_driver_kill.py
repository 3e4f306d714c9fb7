"""The driver killed mid-run (SIGKILL of its whole process group: driver, its local Ray cluster, the workers),
then resubmitted under the same run name: it resumes from the last checkpoint Ray registered and ends with
the same weights as an unbroken run (the exact comparison of tests/test_train_ray.py), with local storage
and through S3 (moto's server with auth, credentials from a Pod-Identity-style endpoint only).

The kill lands at a known point, not by timing: rank 0 stops right after reporting checkpoint 4
(`tests/driver_run.py --gate`), and the test kills once Ray's checkpoint manager snapshot in storage
names checkpoint 4 as the latest. Before, the kill followed a poll of the run's files, and a driver that
trained faster than the poll finished all its steps first.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # driver processes with their own Ray clusters: `make check` leaves it out

from tests import driver_run  # noqa: E402
from tests.driver_run import SNAPSHOT  # noqa: E402
from tests.loopback import PodIdentityEndpoint, StallingProxy, s3_policy  # noqa: E402
from workloads.fsdp_finetune.train import latest_in_snapshot as latest_registered  # noqa: E402

CHECKPOINT = "checkpoint_step_0000004"  # the gate: rank 0 stops after reporting it
RESUME_STEP = 4
BUCKET = "driver-kill"
REGISTER_TIMEOUT_S = 300.0  # driver start, Ray start, model build and 4 steps on a loaded two-core machine


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("driverkill")


def _read(path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def test_driver_killed_and_resubmitted_resumes_and_ends_with_unbroken_weights(out, driver_assets, unbroken_model):
    name, marker = "killed", out / "killed.gate"
    job = ["--assets", str(driver_assets)]
    proc = driver_run.start(out, name, *job, "--gate", CHECKPOINT, "--gate-marker", str(marker))
    snapshot = out / name / name / SNAPSHOT  # local_plan: storage OUT/<name>, Ray's run folder <storage>/<name>
    try:
        driver_run.wait_for(lambda: marker.exists() and latest_registered(_read(snapshot)) == CHECKPOINT,
                            REGISTER_TIMEOUT_S, f"{CHECKPOINT} registered with rank 0 at the gate", proc, out, name)
    finally:
        driver_run.kill_group(proc)
    assert not (out / name / "model").exists()

    assert driver_run.wait_exit(driver_run.start(out, name, *job), out, name) == 0  # resubmitted under the same name
    records = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert {r["resumed_from_step"] for r in records if r["step"] > RESUME_STEP} == {RESUME_STEP}
    assert driver_run.same_weights(driver_run.weights(out / name / "model"), driver_run.weights(unbroken_model))


@pytest.fixture(scope="module")
def s3(moto_server):
    """The job's bucket and a Pod-Identity endpoint for a role that may use it: the drivers' only credentials.

    The drivers reach moto through a `StallingProxy` that is never armed: it passes only whole requests on,
    so a driver killed mid-request leaves moto nothing half-sent to wait for (see `_moto_child`).
    """
    moto_server.create_bucket(BUCKET)
    role = moto_server.create_role("driver-kill-pod", s3_policy(BUCKET))
    with PodIdentityEndpoint(lambda: moto_server.assume_role(role), moto_server.account_id) as endpoint, \
            StallingProxy(moto_server.endpoint_url) as proxy:
        yield endpoint, endpoint.exclusive_env(proxy.endpoint_url), moto_server.client("s3")


def _object(s3, key: str) -> bytes | None:
    try:
        return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None


def _keys(s3, prefix: str) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def test_driver_killed_through_s3_resumes_from_the_checkpoint_in_s3(out, s3, driver_assets, unbroken_model):
    from safetensors.torch import load

    endpoint, env, client = s3
    name, marker, storage = "s3-killed", out / "s3-killed.gate", f"s3://{BUCKET}/checkpoints"
    run, job = f"checkpoints/{name}", ["--assets", str(driver_assets), "--storage", storage]
    proc = driver_run.start(out, name, *job, "--gate", CHECKPOINT, "--gate-marker", str(marker), env=env)
    try:
        driver_run.wait_for(
            lambda: marker.exists() and latest_registered((_object(client, f"{run}/{SNAPSHOT}") or b"")
                                                          .decode()) == CHECKPOINT,
            REGISTER_TIMEOUT_S, f"{CHECKPOINT} registered in S3 with rank 0 at the gate", proc, out, name,
            interval_s=0.5)
    finally:
        driver_run.kill_group(proc)
    assert not [k for k in _keys(client, f"{run}/") if "/model/" in k]

    assert driver_run.wait_exit(driver_run.start(out, name, *job, env=env), out, name) == 0
    body = _object(client, f"{run}/metrics.jsonl").decode()
    records = [json.loads(line) for line in body.splitlines() if line.strip()]
    assert {r["resumed_from_step"] for r in records if r["step"] > RESUME_STEP} == {RESUME_STEP}
    assert driver_run.same_weights(load(_object(client, f"{run}/model/model.safetensors")),
                                   driver_run.weights(unbroken_model))
    assert set(endpoint.calls) == {endpoint.token}  # the drivers and workers had only the endpoint
