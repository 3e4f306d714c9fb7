"""Logs that outlive the Ray cluster: each rank's last lines and the driver's output, in the run's folder.

The Ray cluster (its head's session logs, every worker's stdout) is deleted `job.ttl_hours` after
the job ends, or at once by a retry. What is needed to understand a failure afterwards is small:
the driver's output (it carries the preflight table, the JOB_STAGE lines and Ray's forwarded
worker output) and the last lines each training rank logged. Both go to `<run folder>/logs/`
beside metrics.jsonl and the TensorBoard events (S3 on the cluster):

* `rank-<r>.log`: the last `RANK_LINES` lines of the `fsdp_finetune` logger on that rank (every
  rank, not only rank 0's INFO lines: warnings and errors of all ranks), written at once for a
  warning or worse (so a rank that is about to die leaves its last words), at most every
  `FLUSH_S` otherwise, and when `train_func` ends, error or not;
* `driver.log`: everything the driver process writes to stdout and stderr (a tee at the file
  descriptor level, so Ray's forwarded worker lines are in it), copied every `FLUSH_S` and at exit;
* `submitter-<job id>-<pod>.log`: each RayJob attempt's submitter (follow.sh, K8sJobMode) output, copied by
  follow.sh at its exit through `python -m workloads.fsdp_finetune.job_logs`. KubeRay 1.7.0 deletes the
  submitter Job, and so its pod's log, at every retry (rayjob_controller.go, case JobDeploymentStatusRetrying:
  `deleteSubmitterJob`), and a retry gets a new submission id (`status.jobId`), so every attempt (and every
  restart of its pod) keeps a file of its own.
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import threading
import time
from pathlib import Path

LOGS_DIR = "logs"
RANK_LINES = 200
FLUSH_S = 30.0
SUBMITTER_MAX_BYTES = 64 * 1024 * 1024
"""The most of a submitter log copied (its end): it carries the driver's whole output, NCCL INFO lines included."""


def logs_uri(run_dir: str) -> str:
    return f"{run_dir.rstrip('/')}/{LOGS_DIR}"


def _write(run_dir: str, name: str, data: bytes) -> None:
    import pyarrow.fs as pafs

    from workloads.fsdp_finetune.checkpoint import filesystem

    fs, root = filesystem(logs_uri(run_dir))
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(root, recursive=True)
    with fs.open_output_stream(f"{root}/{name}") as out:
        out.write(data)


class RankTail(logging.Handler):
    """Keeps a rank's last lines and writes them to `<run_dir>/logs/rank-<rank>.log`."""

    def __init__(self, run_dir: str, rank: int, *, lines: int = RANK_LINES, flush_s: float = FLUSH_S):
        super().__init__(level=logging.DEBUG)
        self.run_dir, self.name_ = run_dir, f"rank-{rank}.log"
        self.lines: collections.deque[str] = collections.deque(maxlen=lines)
        self.flush_s, self._last = flush_s, 0.0
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))
        if record.levelno >= logging.WARNING or time.monotonic() - self._last >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        self._last = time.monotonic()
        try:
            _write(self.run_dir, self.name_, ("\n".join(self.lines) + "\n").encode())
        except Exception:  # noqa: BLE001 - logging must never break training
            pass


def attach_rank_tail(logger: logging.Logger, run_dir: str | None, rank: int) -> RankTail | None:
    """Add a `RankTail` for this rank to `logger` (replacing one left from an earlier attempt)."""
    for handler in [h for h in logger.handlers if isinstance(h, RankTail)]:
        logger.removeHandler(handler)
    if not run_dir:
        return None
    tail = RankTail(run_dir, rank)
    # An earlier attempt's lines (a killed rank's last words) stay at the top of the file.
    tail.lines.extend(line for line in _read(run_dir, tail.name_).splitlines() if line)
    logger.addHandler(tail)
    return tail


def _read(run_dir: str, name: str) -> str:
    from workloads.fsdp_finetune.checkpoint import filesystem

    try:
        fs, root = filesystem(logs_uri(run_dir))
        with fs.open_input_stream(f"{root}/{name}") as stream:
            return stream.read().decode(errors="replace")
    except Exception:  # noqa: BLE001 - none yet (or unreadable): start empty
        return ""


class _Tee:
    """A text stream that writes through to `stream` and keeps the lines for `DriverLog`."""

    def __init__(self, stream, sink: collections.deque, lock: threading.Lock):
        self.stream, self.sink, self.lock, self.partial = stream, sink, lock, ""

    def write(self, text: str) -> int:
        with self.lock:
            lines = (self.partial + text).split("\n")
            self.partial = lines.pop()
            self.sink.extend(lines)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


class DriverLog:
    """Tee the driver's stdout and stderr (Ray's forwarded worker lines included) to `<run_dir>/logs/driver.log`.

    Keeps the last `max_lines` lines (training's NCCL INFO output from every rank can be large) and
    writes them every `flush_s` from a background thread, and once more on exit, error or not.
    """

    def __init__(self, run_dir: str, *, max_lines: int = 20000, flush_s: float = FLUSH_S):
        self.run_dir, self.flush_s = run_dir, flush_s
        self.lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="driver-log")

    def __enter__(self) -> DriverLog:
        self._saved = sys.stdout, sys.stderr
        sys.stdout = _Tee(sys.stdout, self.lines, self._lock)
        sys.stderr = _Tee(sys.stderr, self.lines, self._lock)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        sys.stdout, sys.stderr = self._saved
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            text = "\n".join(self.lines) + "\n"
        try:
            _write(self.run_dir, "driver.log", text.encode())
        except Exception as exc:  # noqa: BLE001 - never fail the job over its log copy
            print(f"note: could not copy the driver log to {logs_uri(self.run_dir)} ({exc})", file=self._saved[1]
                  if hasattr(self, "_saved") else sys.__stderr__)


def keep_submitter_log(run_dir: str, log: Path, name: str, *, max_bytes: int = SUBMITTER_MAX_BYTES) -> str:
    """Copy the submitter's log file (its last `max_bytes`) to `<run_dir>/logs/<name>`; the URI written."""
    data = Path(log).read_bytes()
    if len(data) > max_bytes:
        data = f"[the first {len(data) - max_bytes} bytes left out]\n".encode() + data[-max_bytes:]
    _write(run_dir, name, data)
    return f"{logs_uri(run_dir)}/{name}"


def main(argv: list[str] | None = None) -> int:
    """follow.sh's exit step: keep this attempt's submitter log in the run folder. Never fails the submitter."""
    parser = argparse.ArgumentParser(prog="python -m workloads.fsdp_finetune.job_logs",
                                     description="Copy a RayJob submitter's log to <run folder>/logs/")
    parser.add_argument("file", metavar="FILE", help="the variable file (the bundle's config/cluster.yaml)")
    parser.add_argument("--submitter-log", required=True, type=Path, help="the log file follow.sh wrote")
    parser.add_argument("--name", required=True, help="the object's name under <run folder>/logs/")
    args = parser.parse_args(argv)
    where = ("this attempt's submitter log is only in its pod's own log (kubectl logs -n <ray.namespace> "
             "job/<RayJob name>) until KubeRay deletes the submitter Job (at a retry, or with the RayJob)")
    if not Path(args.file).is_file():
        print(f"follow.sh: no variable file at {args.file}; {where}", file=sys.stderr)
        return 0
    try:
        from config import load_config
        from workloads.fsdp_finetune.run_folder import run_dir_of

        uri = keep_submitter_log(run_dir_of(load_config(args.file)), args.submitter_log, args.name)
    except Exception as exc:  # noqa: BLE001 - the job's outcome must not depend on its log copy
        print(f"follow.sh: could not copy the submitter log ({type(exc).__name__}: {exc}); {where}", file=sys.stderr)
        return 0
    print(f"follow.sh: this attempt's submitter log is kept at {uri}")
    return 0


if __name__ == "__main__":
    from config.errors import run_cli

    run_cli(main)
