"""The storage path as it runs on the cluster, offline: moto's S3 server (IAM auth enforced) and a
Pod-Identity-style credential endpoint as the only source of credentials (tests/loopback.py).

* the driver's storage check (`storage_check`) round-trips one object through pyarrow's S3
  filesystem, as Ray Train will, and names the cause when the token or the policy is wrong;
* a real local Ray Train run checkpoints to s3://, loses a worker with no restart left (fit fails),
  and a rerun under the same name resumes from the checkpoint in S3; the exported model and the
  tracking folder land in S3 too; the credential endpoint was called, always with the token.
"""

from __future__ import annotations

import json
import os

import pytest

ray = pytest.importorskip("ray")

from tests.loopback import PodIdentityEndpoint, s3_policy  # noqa: E402
from workloads.fsdp_finetune.launch import local_plan, run_training, start_local_ray  # noqa: E402
from workloads.fsdp_finetune.storage_check import storage_problem  # noqa: E402

BUCKET = "train-s3-path"
JOB = dict(seq_len=64, micro_batch_size=4, global_batch_size=16, max_steps=12, warmup_steps=2,
           checkpoint_every=4, report_every=2, eval_every=6, learning_rate=3e-3)


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


def _objects(moto_server, prefix: str) -> list[str]:
    pages = moto_server.client("s3").get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
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


@pytest.fixture(scope="module")
def cluster(pod_identity):
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    start_local_ray()  # its processes inherit the environment: the endpoint is their only credential source
    yield
    ray.shutdown()


# Skipped in CI only: in 1 of 3 runs on the 2-core machine moto 5.2.5's server stopped answering every request after
# the worker was killed mid-upload (a curl to it timed out; 77 connections open), and the test then hangs until the
# suite's 900 s timeout. Real S3 has no such server-wide wedge; `make test` outside CI still runs it.
@pytest.mark.skipif(os.environ.get("CI") == "true", reason="moto 5.2.5 server can wedge after a worker is killed "
                    "mid-upload (see the comment); runs in `make test` outside CI")
def test_killed_run_resumes_from_s3_and_writes_model_and_tracking_there(cluster, pod_identity, moto_server,
                                                                         tmp_path_factory):
    from safetensors.torch import load

    root = tmp_path_factory.mktemp("s3run")
    plan, _ = local_plan(root / "run", assets_dir=root / "assets", run_name="s3-run", max_failures=0, **JOB)
    storage = f"s3://{BUCKET}/checkpoints"
    plan.storage_path = storage
    plan.run_dir = f"{storage}/s3-run"
    plan.export_uri = f"{storage}/s3-run/model"
    plan.metrics_path = None  # rank 0 logs; the metrics live in S3 only
    calls_before = pod_identity.authorized_calls
    marker = root / "killed"

    with pytest.raises(Exception):  # noqa: B017 - Ray's TrainingFailedError, whatever its module
        result = run_training(plan, fail_at_step=10, fail_marker=str(marker))
        if result.error:
            raise result.error
    assert marker.exists()
    keys = _objects(moto_server, "checkpoints/s3-run/")
    assert any(k.startswith("checkpoints/s3-run/checkpoint_step_0000008/") for k in keys)
    assert not any("/model/" in k for k in keys)

    result = run_training(plan, fail_at_step=10, fail_marker=str(marker))
    assert result.error is None
    assert result.checkpoint.path.endswith("checkpoints/s3-run/checkpoint_step_0000012")

    s3 = moto_server.client("s3")
    body = s3.get_object(Bucket=BUCKET, Key="checkpoints/s3-run/metrics.jsonl")["Body"].read().decode()
    records = [json.loads(line) for line in body.splitlines() if line.strip()]
    assert [r["step"] for r in records] == [0, 2, 4, 6, 8, 10, 12]  # step 0: the untrained model's held-out loss
    assert {r["resumed_from_step"] for r in records if r["step"] > 8} == {8}  # from the checkpoint in S3
    keys = _objects(moto_server, "checkpoints/s3-run/")
    assert any(k.split("/")[-1].startswith("events.out.tfevents") for k in keys)  # TensorBoard, beside metrics
    assert "checkpoints/s3-run/loss.png" in keys
    weights = load(s3.get_object(Bucket=BUCKET, Key="checkpoints/s3-run/model/model.safetensors")["Body"].read())
    assert weights and "checkpoints/s3-run/model/tokenizer_config.json" in keys
    # Logs outlive the cluster: each rank's last lines beside the metrics, the killed rank's last words too.
    rank1 = s3.get_object(Bucket=BUCKET, Key="checkpoints/s3-run/logs/rank-1.log")["Body"].read().decode()
    rank0 = s3.get_object(Bucket=BUCKET, Key="checkpoints/s3-run/logs/rank-0.log")["Body"].read().decode()
    assert "exported the model" in rank0
    assert "rank 1 exits abruptly" in rank1  # written before the kill, kept by the rerun's rank 1
    # Ray's workers and the driver took their credentials from the endpoint, with the token, nothing else.
    assert pod_identity.authorized_calls > calls_before
    assert set(pod_identity.calls) == {pod_identity.token}
