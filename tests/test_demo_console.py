"""The local run's console (workloads/fsdp_finetune/console.py): Ray's chatter to the log file, what matters shown.

The end-to-end test runs the demo's entry point (`python -m workloads.fsdp_finetune --local`) for five
steps (one report with a checkpoint) in a subprocess and reads exactly what reached its stdout/stderr.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO
from workloads.fsdp_finetune import console
from workloads.fsdp_finetune.console import RunLog

RAY_LINES = ("Reporting training result", "Checkpoint successfully created", "PlacementGroupCleaner",
             "Failed to query Ray Train Controller actor state")


def batch(lines, *, pid=1234, actor_name="RayTrainWorker", **extra):
    """A batch as Ray's log monitor hands it to the driver's printer."""
    return {"ip": "192.0.2.2", "pid": pid, "job": "01000000", "is_err": False, "lines": lines,
            "actor_name": actor_name, "task_name": "", "localhost": "192.0.2.2", **extra}


@pytest.mark.parametrize("line", [
    "Reporting training result 1: TrainingReport(checkpoint=None, metrics={'step': 5, 'resumed_from_step': 0})",
    "Checkpoint successfully created at: Checkpoint(filesystem=local, path=/tmp/x/checkpoint_step_0000005)",
    "Failed to query Ray Train Controller actor state. State API may be temporarily unavailable.",
    "Setting up process group for: env:// [rank=0, world_size=2]",
    "The actor is dead because its worker process has died. ... (1) the process was killed by the OOM killer",
])
def test_routine_lines_stay_off_the_console(line):
    assert not console.matters(line)


@pytest.mark.parametrize("line", [
    "[FailurePolicy] RETRY",
    "  Error count: 1 (max allowed: 1)",
    "[fsdp_finetune rank 0] resumed from /out/local-demo/checkpoint_step_0000050 at step 50",
    "[fsdp_finetune rank 1] fail_at_step=6: rank 1 exits abruptly",
])
def test_failures_restarts_and_resumes_are_shown(line):
    assert console.matters(line)


def test_raylet_errors_are_shown():
    assert console.matters("A worker died or was killed while executing a task by an unexpected system error.",
                           "raylet")


def test_batches_go_to_the_file_and_only_what_matters_to_the_console(tmp_path, capsys):
    log = RunLog(tmp_path / "ray.log")
    log.on_batch(batch(["Reporting training result 1: TrainingReport(...)", "Checkpoint successfully created at: x"]))
    log.on_batch(batch(["[FailurePolicy] RETRY", "  Source: worker group", "  Error count: 1 (max allowed: 1)"],
                       pid=77, actor_name="TrainController"))
    died = "A worker died or was killed " + "x" * 400
    log.on_batch(batch([died], pid="raylet", actor_name=""))
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["(TrainController pid=77) [FailurePolicy] RETRY",
                                "(TrainController pid=77)   Error count: 1 (max allowed: 1)",
                                f"(raylet) {died}"[:console.CONSOLE_WIDTH - 3] + "..."]
    text = (tmp_path / "ray.log").read_text()
    assert "(RayTrainWorker pid=1234) Reporting training result 1" in text
    assert "(TrainController pid=77)   Source: worker group" in text
    assert "x" * 400 in text


def test_failure_prints_the_log_tail_without_the_chatter(tmp_path, capsys):
    log = RunLog(tmp_path / "ray.log")
    log.on_batch(batch([f"line {i}" for i in range(30)] + ["PlacementGroupCleaner noise"] * 5))
    assert log.failed(RuntimeError("Training failed due to worker errors:\nsnippet")) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "training failed: Training failed due to worker errors:"
    assert err[1] == f"last {console.TAIL_LINES} lines of {tmp_path / 'ray.log'}:"
    assert err[2:] == [f"  (RayTrainWorker pid=1234) line {i}" for i in range(12, 30)] + [
        "  (driver) training failed: RuntimeError: Training failed due to worker errors:", "  (driver) snippet"]


def test_verbose_keeps_rays_printer_and_the_file(tmp_path, capsys):
    ray_worker = pytest.importorskip("ray._private.worker")
    saved, logger = ray_worker.print_worker_logs, logging.getLogger("ray")
    saved_handlers, saved_propagate = list(logger.handlers), logger.propagate
    try:
        RunLog(tmp_path / "ray.log", verbose=True).attach()
        ray_worker.print_worker_logs(batch(["Reporting training result 1: ..."]), sys.stdout)
        logger.warning("driver-side warning")
    finally:
        ray_worker.print_worker_logs, logger.handlers, logger.propagate = saved, saved_handlers, saved_propagate
    assert "Reporting training result 1" in capsys.readouterr().out
    text = (tmp_path / "ray.log").read_text()
    assert "(RayTrainWorker pid=1234) Reporting training result 1: ..." in text
    assert "(driver) WARNING ray: driver-side warning" in text


@pytest.mark.slow
def test_demo_entry_point_console_holds_no_ray_lines(tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "demo"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.run([sys.executable, "-m", "workloads.fsdp_finetune", "--local", "--output-dir", str(out),
                          "--max-steps", "5"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    console_text = run.stdout + run.stderr
    # The bar redraws every half second: leave its lines out of the failure message, or they are all it shows.
    assert run.returncode == 0, "\n".join(line for line in console_text.replace("\r", "\n").splitlines()
                                          if not line.startswith("train:"))[-4000:]
    for line in RAY_LINES:
        assert line not in console_text
    assert "(RayTrainWorker" not in console_text and "(TrainController" not in console_text
    assert "Loading weights" not in console_text and "Writing model shards" not in console_text
    assert run.stdout.count("train:") >= 1 and "before training:" in run.stdout and "after training:" in run.stdout
    log = out / "ray.log"
    # The console ends with where everything is and what to do next, not a JSON dump (that is summary.json).
    *_, log_line, next_line = run.stdout.splitlines()
    assert log_line == f"Ray's and the workers' log: {log}"
    assert next_line.startswith("next: open loss.png")
    assert "outputs in " in run.stdout and not any(line.startswith("{") for line in run.stdout.splitlines())
    assert json.loads((out / "summary.json").read_text())["eval_exact_match_after"] >= 0
    text = log.read_text()
    assert "Reporting training result" in text and "Checkpoint successfully created" in text
