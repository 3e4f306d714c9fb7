"""`job.timeout_hours` across the RayJob's retries: one deadline per job, kept beside its checkpoints.

KubeRay 1.7.0 counts `activeDeadlineSeconds` from `status.startTime`, which it sets anew for every
retry (rayjob_controller.go `initRayJobStatusIfNeed`, reached again through Retrying -> New), so
`job.retries: 2` allowed three full `timeout_hours`. The driver therefore keeps the job's own
deadline in `<run folder>/job_deadline.json` (S3 on the cluster): the first attempt writes it, every
later attempt of the same job reads it, and a driver past it stops at once with exit status 3.

"The same job": the record carries a heartbeat the driver refreshes every `HEARTBEAT_S`; an attempt
that finds the heartbeat older than `stale_after_s` (the start deadline plus a margin: a KubeRay
retry starts a new cluster within `job.start_deadline_minutes` of the failure) is a new submission
under the same run name and starts a fresh deadline.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass

DEADLINE_FILE = "job_deadline.json"
HEARTBEAT_S = 60.0
EXIT_DEADLINE = 3


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


def spent_message(deadline: JobDeadline, timeout_hours: float) -> str:
    return (f"job.timeout_hours ({timeout_hours:g} h) is spent: this job started "
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(deadline.started))}, attempt {deadline.attempt}. "
            f"Resubmit to continue from the last checkpoint (a new submission starts a new deadline)")


class DeadlineWatch:
    """Refresh the heartbeat every `interval_s`; at the deadline print why and end the driver (exit 3)."""

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
                print(f"JOB_STAGE deadline\n{spent_message(self.deadline, self.timeout_hours)}", file=sys.stderr,
                      flush=True)
                self._exit(EXIT_DEADLINE)
                return
            try:
                record = _read(self.run_dir) or {}
                _write(self.run_dir, {**record, "heartbeat": time.time()})
            except Exception as exc:  # noqa: BLE001 - a missed heartbeat only risks a fresh deadline later
                print(f"note: could not refresh {DEADLINE_FILE} ({exc})", file=sys.stderr)
