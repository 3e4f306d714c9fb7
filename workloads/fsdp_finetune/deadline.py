"""`job.timeout_hours` across the RayJob's retries: one deadline per job, kept beside its checkpoints.

KubeRay 1.7.0 counts `activeDeadlineSeconds` from `status.startTime`, which it sets anew for every
retry (rayjob_controller.go `initRayJobStatusIfNeed`, reached again through Retrying -> New), so
`job.retries: 2` allowed three full `timeout_hours`. The driver therefore keeps the job's own
deadline in `<run folder>/job_deadline.json` (S3 on the cluster): the first attempt writes it, every
later attempt of the same job reads it.

Where it is checked: first of all, as job.sh's first step (`python -m workloads.fsdp_finetune.deadline FILE`),
before the memory plan and any dataset or model work, so an attempt that starts with its deadline spent costs
the head a few seconds of CPU and nothing more; then by the driver's `DeadlineWatch` while it trains.

How a spent deadline ends the job: with status 0, so the Ray job is SUCCEEDED and the RayJob Complete, its
GPU workers deleted at once (DeleteWorkers on SUCCEEDED, charts/ray.py `deletion_rules`), and never retried.
KubeRay 1.7.0 retries every Failed RayJob under `backoffLimit` except for two reasons
(ray-operator/controllers/ray/rayjob_controller.go `checkBackoffLimitAndUpdateStatusIfNeeded`, v1.7.0 lines
542-555: `if rayJob.Status.Reason == rayv1.DeadlineExceeded || rayJob.Status.Reason ==
rayv1.JobStatusCheckTimeoutExceeded { ... return }`, else `JobDeploymentStatusRetrying`), and a driver's
non-zero exit is FAILED, reason AppFailed (same file, lines 343-348), so it would be retried: each retry
rebuilds the cluster and its GPU pods only to stop again. A STOPPED job would not be retried either, but no
deletion rule can match STOPPED (the CRD admits SUCCEEDED and FAILED only), so its GPU workers would stay.
The driver's log says why it stopped (`JOB_STAGE deadline` and `spent_message`), and `python -m
workloads.verify` reports such a job as stopped at stage 'deadline', not as succeeded.

"The same job": the record carries a heartbeat the driver refreshes every `HEARTBEAT_S`; an attempt
that finds the heartbeat older than `stale_after_s` (the start deadline plus a margin: a KubeRay
retry starts a new cluster within `job.start_deadline_minutes` of the failure) is a new submission
under the same run name and starts a fresh deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass

DEADLINE_FILE = "job_deadline.json"
HEARTBEAT_S = 60.0
EXIT_DEADLINE = 0
"""The driver's exit status when the deadline passes mid-run: 0, so KubeRay ends the RayJob without a retry."""
EXIT_SPENT = 3
"""This module's exit status when the deadline is already spent: job.sh then ends with status 0 at once."""
STALE_MARGIN_S = 600.0


@dataclass(frozen=True)
class JobDeadline:
    started: float
    deadline: float
    attempt: int

    def remaining(self, now: float | None = None) -> float:
        return self.deadline - (time.time() if now is None else now)


def _fs(run_dir: str):
    from workloads.fsdp_finetune.checkpoint import filesystem

    fs, root = filesystem(run_dir)
    return fs, f"{root.rstrip('/')}/{DEADLINE_FILE}"


def _read(run_dir: str) -> dict | None:
    import pyarrow.fs as pafs

    fs, path = _fs(run_dir)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as stream:
        try:
            return json.loads(stream.read())
        except ValueError:
            return None


def _write(run_dir: str, record: dict) -> None:
    import pyarrow.fs as pafs

    fs, path = _fs(run_dir)
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as out:
        out.write(json.dumps(record).encode())


def start_or_resume(run_dir: str, *, timeout_s: float, stale_after_s: float, now: float | None = None) -> JobDeadline:
    """This attempt's view of the job's deadline: the recorded one when the job is the same, else a fresh one."""
    now = time.time() if now is None else now
    record = _read(run_dir)
    if record is None or now - float(record.get("heartbeat", 0)) > stale_after_s:
        record = {"started": now, "deadline": now + timeout_s, "attempt": 1}
    else:
        record = {**record, "attempt": int(record.get("attempt", 1)) + 1}
    record["heartbeat"] = now
    _write(run_dir, record)
    return JobDeadline(float(record["started"]), float(record["deadline"]), int(record["attempt"]))


def stale_after_s(start_deadline_minutes: float) -> float:
    """How old a heartbeat may be for an attempt to count as the same job: KubeRay starts the retry's cluster
    within `job.start_deadline_minutes` of the failure (preRunningDeadlineSeconds), plus a margin."""
    return start_deadline_minutes * 60 + STALE_MARGIN_S


def current(run_dir: str, *, stale_after_s: float, now: float | None = None) -> JobDeadline | None:
    """The deadline job.sh's first step recorded for this attempt (None when there is none, or it is stale)."""
    now = time.time() if now is None else now
    record = _read(run_dir)
    if record is None or now - float(record.get("heartbeat", 0)) > stale_after_s:
        return None
    return JobDeadline(float(record["started"]), float(record["deadline"]), int(record.get("attempt", 1)))


def spent_message(deadline: JobDeadline, timeout_hours: float) -> str:
    return (f"job.timeout_hours ({timeout_hours:g} h) is spent: this job started "
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(deadline.started))}, attempt {deadline.attempt}. "
            f"Resubmit to continue from the last checkpoint (a new submission starts a new deadline)")


NOT_RETRIED = ("ending with status 0 so that KubeRay does not retry the RayJob (a retry would rebuild the GPU "
               "pods only to stop again)")


class DeadlineWatch:
    """Refresh the heartbeat every `interval_s`; at the deadline print why and end the driver (EXIT_DEADLINE: 0,
    so the RayJob is not retried; see the module docstring)."""

    def __init__(self, run_dir: str, deadline: JobDeadline, timeout_hours: float, *, interval_s: float = HEARTBEAT_S,
                 exit=os._exit):
        self.run_dir, self.deadline, self.timeout_hours = run_dir, deadline, timeout_hours
        self.interval_s, self._exit = interval_s, exit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="job-deadline")

    def __enter__(self) -> DeadlineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(min(self.interval_s, max(0.0, self.deadline.remaining()))):
            if self.deadline.remaining() <= 0:
                print(f"JOB_STAGE deadline\n{spent_message(self.deadline, self.timeout_hours)}; {NOT_RETRIED}",
                      file=sys.stderr, flush=True)
                self._exit(EXIT_DEADLINE)
                return
            try:
                record = _read(self.run_dir) or {}
                _write(self.run_dir, {**record, "heartbeat": time.time()})
            except Exception as exc:  # noqa: BLE001 - a missed heartbeat only risks a fresh deadline later
                print(f"note: could not refresh {DEADLINE_FILE} ({exc})", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """job.sh's first step: record or read the job's deadline; EXIT_SPENT when it is already spent, else 0."""
    from config import load_or_exit, resolve_path
    from config.cli import add_file_argument, chosen_file

    parser = argparse.ArgumentParser(prog="python -m workloads.fsdp_finetune.deadline",
                                     description="Check job.timeout_hours across the RayJob's attempts before any "
                                                 "work: exit 3 when it is spent, 0 otherwise")
    add_file_argument(parser)
    args = parser.parse_args(argv)
    config = load_or_exit(resolve_path(chosen_file(parser, args)))
    job = config.job
    try:
        from workloads.fsdp_finetune.run_folder import run_dir_of

        run_dir = run_dir_of(config)
        deadline = start_or_resume(run_dir, timeout_s=job.timeout_hours * 3600,
                                   stale_after_s=stale_after_s(job.start_deadline_minutes))
    except Exception as exc:  # noqa: BLE001 - the driver's storage check names storage problems with their fix
        print(f"note: could not read or record the job's deadline ({type(exc).__name__}: {exc}); going on, the "
              "driver checks the storage and the deadline again", file=sys.stderr, flush=True)
        return 0
    if deadline.remaining() <= 0:
        print(f"JOB_STAGE deadline\n{spent_message(deadline, job.timeout_hours)}; stopped before the memory plan "
              f"and any data work, {NOT_RETRIED}", file=sys.stderr, flush=True)
        return EXIT_SPENT
    print(f"job deadline: {deadline.remaining() / 3600:.2f} h of job.timeout_hours ({job.timeout_hours:g} h) left, "
          f"attempt {deadline.attempt}; recorded in {run_dir}/{DEADLINE_FILE}", flush=True)
    return 0


if __name__ == "__main__":
    from config.errors import run_cli

    run_cli(main)
