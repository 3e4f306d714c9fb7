"""`job.timeout_hours` across KubeRay's retries: the driver's own deadline (workloads.fsdp_finetune.deadline)."""

from __future__ import annotations

import contextlib
import json
import os
import threading

from workloads.fsdp_finetune.deadline import DEADLINE_FILE, EXIT_DEADLINE, DeadlineWatch, spent_message, start_or_resume

HOUR = 3600.0


def test_a_retry_keeps_the_first_attempts_deadline(tmp_path):
    first = start_or_resume(str(tmp_path), timeout_s=12 * HOUR, stale_after_s=HOUR, now=1000.0)
    assert (first.started, first.deadline, first.attempt) == (1000.0, 1000.0 + 12 * HOUR, 1)
    # KubeRay's retry, ten minutes after the last heartbeat: same deadline, not a fresh 12 h.
    retry = start_or_resume(str(tmp_path), timeout_s=12 * HOUR, stale_after_s=HOUR, now=1000.0 + 600)
    assert (retry.deadline, retry.attempt) == (first.deadline, 2)
    assert json.loads((tmp_path / DEADLINE_FILE).read_text())["heartbeat"] == 1600.0


def test_an_attempt_after_the_deadline_has_none_left(tmp_path):
    start_or_resume(str(tmp_path), timeout_s=HOUR, stale_after_s=HOUR, now=0.0)
    start_or_resume(str(tmp_path), timeout_s=HOUR, stale_after_s=HOUR, now=3000.0)  # heartbeat at 3000
    late = start_or_resume(str(tmp_path), timeout_s=HOUR, stale_after_s=HOUR, now=3000.0 + 1800)
    assert late.remaining(now=3000.0 + 1800) < 0 and late.attempt == 3
    assert "job.timeout_hours (1 h) is spent" in spent_message(late, 1) and "attempt 3" in spent_message(late, 1)


def test_a_new_submission_long_after_starts_a_fresh_deadline(tmp_path):
    start_or_resume(str(tmp_path), timeout_s=HOUR, stale_after_s=HOUR, now=0.0)
    fresh = start_or_resume(str(tmp_path), timeout_s=HOUR, stale_after_s=HOUR, now=5 * HOUR)
    assert (fresh.started, fresh.attempt) == (5 * HOUR, 1)


def test_the_watch_ends_the_driver_at_the_deadline_and_refreshes_the_heartbeat(tmp_path, capfd):
    import time

    deadline = start_or_resume(str(tmp_path), timeout_s=0.6, stale_after_s=HOUR)
    before = json.loads((tmp_path / DEADLINE_FILE).read_text())["heartbeat"]
    ended = threading.Event()
    codes = []

    def fake_exit(code):
        codes.append(code)
        ended.set()

    with DeadlineWatch(str(tmp_path), deadline, 0.6 / HOUR, interval_s=0.1, exit=fake_exit):
        assert ended.wait(timeout=30)
    assert codes == [EXIT_DEADLINE]
    assert json.loads((tmp_path / DEADLINE_FILE).read_text())["heartbeat"] > before
    assert "JOB_STAGE deadline" in capfd.readouterr().err
    assert time.time() >= deadline.deadline


def test_current_reads_the_attempts_record_and_ignores_a_stale_one(tmp_path):
    from workloads.fsdp_finetune.deadline import current

    assert current(str(tmp_path), stale_after_s=HOUR) is None
    recorded = start_or_resume(str(tmp_path), timeout_s=HOUR, stale_after_s=HOUR, now=1000.0)
    assert current(str(tmp_path), stale_after_s=HOUR, now=1000.0 + 60) == recorded
    assert current(str(tmp_path), stale_after_s=HOUR, now=1000.0 + 2 * HOUR) is None


def test_a_spent_deadline_ends_with_status_zero_so_kuberay_does_not_retry():
    # KubeRay 1.7.0 retries a FAILED (non-zero) driver under backoffLimit; only DeadlineExceeded and
    # JobStatusCheckTimeoutExceeded are exempt (rayjob_controller.go checkBackoffLimitAndUpdateStatusIfNeeded).
    from workloads.fsdp_finetune.deadline import EXIT_SPENT

    assert EXIT_DEADLINE == 0 and EXIT_SPENT not in (0, 1, 2)


def test_the_run_folder_is_the_drivers(tmp_path):
    from tests.helpers import load_variant
    from workloads.fsdp_finetune.run_folder import run_dir_of
    from workloads.fsdp_finetune.run_plan import cluster_plan

    config = load_variant(tmp_path, {"storage": {"bucket_name": "runs-bucket"}})
    assert run_dir_of(config) == cluster_plan(config).run_dir


# --- job.sh, run for real against S3 (moto): the deadline is its first step -----------------------------------

PYTHON_SHIM = """#!/usr/bin/env bash
# Records every `python` job.sh starts; runs the deadline check for real, stands in for the plan and the driver.
echo "$*" >> {calls}
case "$*" in
  *workloads.fsdp_finetune.deadline*) exec {python} "$@" ;;
  *) exit 0 ;;
esac
"""


def _job_sh(tmp_path, moto_server, overrides: dict | None = None):
    """job.sh as the bundle renders it, its /app paths on this checkout and a variant file; `python` recorded."""
    import sys

    from charts import bundle
    from config import load_config
    from harness.loopback import REGION, s3_policy
    from tests.helpers import REPO, write_variant

    bucket = moto_server.create_bucket(f"deadline-{tmp_path.name[-20:].lower().replace('_', '-')}")
    file = write_variant(tmp_path, {"storage": {"bucket_name": bucket}, **(overrides or {})})
    config = load_config(file)
    script = bundle.job_script(config).replace(bundle.CONFIG_IN_POD, str(file)).replace(bundle.MOUNT_PATH, str(REPO))
    (tmp_path / "job.sh").write_text(script)
    shims = tmp_path / "bin"
    shims.mkdir()
    calls = tmp_path / "calls"
    (shims / "python").write_text(PYTHON_SHIM.format(calls=calls, python=sys.executable))
    (shims / "python").chmod(0o755)
    keys = moto_server.create_user(bucket, s3_policy(bucket))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(keys.env(), AWS_ENDPOINT_URL=moto_server.endpoint_url, AWS_REGION=REGION, AWS_DEFAULT_REGION=REGION,
               AWS_EC2_METADATA_DISABLED="true", PYTHONPATH=str(REPO), PATH=f"{shims}:{env['PATH']}")
    return config, env, calls


def test_job_sh_stops_a_spent_job_before_the_plan_with_status_zero(tmp_path, moto_server):
    import subprocess
    import time

    from workloads.fsdp_finetune.deadline import _write
    from workloads.fsdp_finetune.run_folder import run_dir_of

    config, env, calls = _job_sh(tmp_path, moto_server)
    # An earlier attempt of this job started 13 h ago (job.timeout_hours 12) and was alive a minute ago.
    now = time.time()
    with job_environment(env):
        _write(run_dir_of(config), {"started": now - 13 * HOUR, "deadline": now - HOUR, "attempt": 2,
                                    "heartbeat": now - 60})
    done = subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "JOB_STAGE deadline" in done.stderr and "job.timeout_hours (12 h) is spent" in done.stderr
    assert "stopped before the memory plan and any data work" in done.stderr
    assert "does not retry" in done.stderr
    ran = calls.read_text().splitlines()
    assert len(ran) == 1 and "workloads.fsdp_finetune.deadline" in ran[0]  # no plan, no driver


def test_job_sh_records_a_fresh_deadline_then_plans_and_trains(tmp_path, moto_server):
    import subprocess

    from workloads.fsdp_finetune.run_folder import run_dir_of

    config, env, calls = _job_sh(tmp_path, moto_server)
    done = subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "h of job.timeout_hours (12 h) left, attempt 1" in done.stdout
    ran = calls.read_text().splitlines()
    assert [("deadline" in c, "workloads.plan" in c, "-m workloads.fsdp_finetune --config" in c) for c in ran] == \
        [(True, False, False), (False, True, False), (False, False, True)]
    key = f"{run_dir_of(config).removeprefix('s3://').split('/', 1)[1]}/{DEADLINE_FILE}"
    record = json.loads(moto_server.client("s3").get_object(Bucket=config.storage.bucket_name, Key=key)["Body"].read())
    assert record["attempt"] == 1 and record["deadline"] - record["started"] == 12 * HOUR


@contextlib.contextmanager
def job_environment(env):
    """This process under the job's S3 environment (the test's own writes to the run folder)."""
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
