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
  descriptor level, so Ray's forwarded worker lines are in it), copied every `FLUSH_S` and at exit.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time

LOGS_DIR = "logs"
RANK_LINES = 200
FLUSH_S = 30.0


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
