"""`job.timeout_hours` across KubeRay's retries: the driver's own deadline (workloads.fsdp_finetune.deadline)."""

from __future__ import annotations

import json
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
