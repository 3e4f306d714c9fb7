"""Logs that outlive the Ray cluster (workloads.fsdp_finetune.job_logs), written to a local run folder here;
tests/test_train_s3.py shows the rank logs in S3 after a real run."""

from __future__ import annotations

import logging
import sys

from workloads.fsdp_finetune.job_logs import DriverLog, RankTail, attach_rank_tail


def test_driver_output_is_copied_beside_the_metrics(tmp_path, capsys):
    with DriverLog(str(tmp_path), flush_s=3600):
        print("JOB_STAGE train")
        print("PREFLIGHT_RESULT {\"ok\": true}", file=sys.stderr)
    text = (tmp_path / "logs" / "driver.log").read_text()
    assert "JOB_STAGE train" in text and "PREFLIGHT_RESULT" in text
    assert "JOB_STAGE train" in capsys.readouterr().out  # still printed as before


def test_driver_log_is_written_even_when_the_driver_fails(tmp_path):
    try:
        with DriverLog(str(tmp_path), flush_s=3600):
            print("storage check failed; not starting training", file=sys.stderr)
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert "storage check failed" in (tmp_path / "logs" / "driver.log").read_text()


def test_a_rank_warning_is_written_at_once_and_only_the_last_lines_kept(tmp_path):
    logger = logging.getLogger("job-logs-test")
    logger.setLevel(logging.INFO)
    tail = attach_rank_tail(logger, str(tmp_path), 1)
    assert isinstance(tail, RankTail)
    tail.lines = type(tail.lines)(maxlen=3)
    tail.flush_s = 3600
    for i in range(5):
        logger.info("step %d", i)
    logger.warning("fail_at_step=4: rank 1 exits abruptly")  # written before the process dies
    text = (tmp_path / "logs" / "rank-1.log").read_text()
    assert "exits abruptly" in text and "step 2" not in text and "step 4" in text
    assert attach_rank_tail(logger, None, 1) is None and not [h for h in logger.handlers if isinstance(h, RankTail)]


def test_a_restarted_rank_keeps_the_killed_attempts_last_lines(tmp_path):
    logger = logging.getLogger("job-logs-restart")
    logger.setLevel(logging.INFO)
    attach_rank_tail(logger, str(tmp_path), 1)
    logger.warning("rank 1 exits abruptly")
    attach_rank_tail(logger, str(tmp_path), 1)  # the restarted worker
    logger.warning("resumed")
    text = (tmp_path / "logs" / "rank-1.log").read_text()
    assert text.index("exits abruptly") < text.index("resumed")


def test_a_submitter_log_is_kept_under_its_attempts_name_and_capped_at_its_end(tmp_path):
    from workloads.fsdp_finetune.job_logs import keep_submitter_log

    log = tmp_path / "submitter.log"
    log.write_text("first\n" + "x" * 100 + "\nlast line\n")
    run = tmp_path / "run"
    uri = keep_submitter_log(str(run), log, "submitter-job-1-pod-a.log", max_bytes=20)
    assert uri.endswith("/logs/submitter-job-1-pod-a.log")
    kept = (run / "logs" / "submitter-job-1-pod-a.log").read_text()
    assert kept.startswith("[the first ") and kept.endswith("last line\n") and "first\n" not in kept
    keep_submitter_log(str(run), log, "submitter-job-2-pod-b.log")
    assert sorted(p.name for p in (run / "logs").iterdir()) == ["submitter-job-1-pod-a.log",
                                                                 "submitter-job-2-pod-b.log"]


def test_the_submitter_log_copy_never_fails_the_submitter(tmp_path, capsys):
    from workloads.fsdp_finetune.job_logs import main

    log = tmp_path / "submitter.log"
    log.write_text("x\n")
    assert main([str(tmp_path / "missing.yaml"), "--submitter-log", str(log), "--name", "s.log"]) == 0
    assert "only in its pod's own log" in capsys.readouterr().err
