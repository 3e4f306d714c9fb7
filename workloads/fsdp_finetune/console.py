"""What a local run shows on the console, and the log file that takes the rest.

Ray forwards every line its workers and actors print to the driver (`log_to_driver`): per report
Ray Train's `Reporting training result ...` and `Checkpoint successfully created ...`, about once a
second the PlacementGroupCleaner's `Failed to query Ray Train Controller actor state`, besides the
workers' own log and Hugging Face's progress bars. Drawn through the driver's progress bar they bury
it. `RunLog` writes all of that to a file under the output directory and lets through to the
console only the lines a user acts on: a worker that died or was killed, a restart, a resume, an
error. `--verbose` keeps Ray's own printing as well (the file is written either way).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections import deque
from pathlib import Path

# Ray's routine chatter, never shown (checked first: a report's metrics can hold `resumed_from_step`).
NOISE = re.compile(r"Reporting training result|Checkpoint successfully created|PlacementGroupCleaner"
                   r"|Failed to query Ray Train Controller")
# What is shown: Ray Train's failure decision ("[FailurePolicy] RETRY" or "RAISE") and its error count,
# a worker's own last word, restarts and resumes, errors. The error dump that follows a decision
# (tracebacks, actor details, Ray's list of causes, OOM among them) stays in the file.
MATTERS = re.compile(r"\[FailurePolicy\]|Error count:|exits abruptly|\bresumed from\b|\bresuming\b"
                     r"|\brestart(ing|ed)?\b|\bERROR\b")
CONSOLE_WIDTH = 200
TAIL_LINES = 20
_ray_printer = None  # Ray's own `print_worker_logs`, kept for --verbose


def matters(line: str, pid: object = None) -> bool:
    """Whether a line of Ray's or a worker's output belongs on the console of a quiet run.

    The raylet's lines are the errors Ray pushes to the driver ("A worker died or was killed ..."): all shown.
    """
    return not NOISE.search(line) and (pid == "raylet" or bool(MATTERS.search(line)))


def origin(batch: dict) -> str:
    """Ray's prefix for a batch of forwarded lines: `(TrainController pid=123)`, `(raylet)`."""
    pid = batch.get("pid")
    if pid in ("raylet", "autoscaler"):
        return f"({pid})"
    name = batch.get("actor_name") or batch.get("task_name")
    return f"({name} pid={pid})" if name else f"(pid={pid})"


class _ToRunLog(logging.Handler):
    def __init__(self, run_log: RunLog):
        super().__init__(logging.INFO)
        self.run_log = run_log
        self.setFormatter(logging.Formatter("(driver) %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        text = self.format(record)
        self.run_log.write(text.splitlines())
        if not self.run_log.verbose and (record.levelno >= logging.ERROR or
                                         (record.levelno >= logging.WARNING and matters(text))):
            self.run_log.show(text.splitlines()[0])


KEPT_LOGS = 5
"""Earlier runs' logs kept beside the current one in the same output folder (`ray.log.1` the last, up to
`ray.log.5`): a rerun, a resume after a failure, must not wipe the log that explains the failure."""


def keep_previous(path: Path) -> Path | None:
    """Shift `path` to `path.1` (and `.1` to `.2`, ... up to KEPT_LOGS, the oldest dropped); the kept file."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    for n in range(KEPT_LOGS - 1, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{n + 1}"))
    kept = path.with_name(f"{path.name}.1")
    path.replace(kept)
    return kept


class RunLog:
    """The log file of one local run (`<output dir>/ray.log`) and the filter in front of the console."""

    def __init__(self, path: str | os.PathLike, *, verbose: bool = False):
        self.path, self.verbose = Path(path), verbose
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.previous = keep_previous(self.path)
        self.path.write_text(f"# Ray's and the workers' output of a local run, started {time.strftime('%F %T')}\n")
        if not verbose:
            # Hugging Face's "Loading weights" / "Writing model shards" bars: one bar (training) is enough.
            # Read when transformers is imported; workers started later inherit it too.
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
            if "transformers" in sys.modules:
                sys.modules["transformers"].utils.logging.disable_progress_bar()

    def write(self, lines: list[str]) -> None:
        """Append lines to the file (opened per write: Ray's logging thread may outlive the run)."""
        with self._lock, self.path.open("a", encoding="utf-8") as out:
            out.writelines(f"{line}\n" for line in lines)

    def show(self, line: str) -> None:
        """One line to the console's stderr (cut at CONSOLE_WIDTH), drawn around the driver's progress bar."""
        from tqdm import tqdm

        tqdm.write(line if len(line) <= CONSOLE_WIDTH else line[:CONSOLE_WIDTH - 3] + "...", file=sys.stderr)

    def on_batch(self, batch: dict, print_file=None, ignore_prefix: bool = False) -> None:
        """Ray's printer for a batch of forwarded lines: all to the file, what matters to the console."""
        raw = batch.get("lines") or []
        if batch.get("pid") == "autoscaler":
            # The monitor's whole status report comes every few seconds; keep its events, as Ray's printer does.
            from ray._private.worker import filter_autoscaler_events

            raw = list(filter_autoscaler_events(raw))
        prefix = origin(batch)
        lines = [f"{prefix} {line}" for line in raw]
        self.write(lines)
        if self.verbose:
            _ray_printer(batch, print_file, ignore_prefix)
        else:
            for line in lines:
                if matters(line, batch.get("pid")):
                    self.show(line)

    def attach(self) -> None:
        """Take over Ray's printing of forwarded output and the driver's `ray` logger; call after `ray.init`.

        Ray prints what its processes write (through `log_to_driver`) and the errors it pushes to the
        driver ("A worker died ...") with one function, `ray._private.worker.print_worker_logs`, looked up
        at each call: replacing it catches both. Private API, pinned with ray 2.58.0; the demo test
        (tests/test_demo_console.py) fails if an upgrade moves it.
        """
        import ray._private.worker as ray_worker

        global _ray_printer
        _ray_printer = _ray_printer or ray_worker.print_worker_logs
        ray_worker.print_worker_logs = self.on_batch
        logger = logging.getLogger("ray")
        logger.handlers = [h for h in logger.handlers if not isinstance(h, _ToRunLog)]
        if not self.verbose:
            logger.handlers = []
        logger.addHandler(_ToRunLog(self))
        logger.propagate = False

    def tail(self, n: int = TAIL_LINES) -> list[str]:
        """The file's last `n` lines, Ray's routine chatter left out."""
        with self._lock, self.path.open(encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n") for line in deque((x for x in f if not NOISE.search(x)), maxlen=n)]

    def failed(self, error: object) -> int:
        """Report a failed run on stderr with the file's last lines; return the exit status (1)."""
        text = str(error).strip() or type(error).__name__
        self.write([f"(driver) {line}" for line in f"training failed: {type(error).__name__}: {text}".splitlines()])
        print(f"training failed: {text.splitlines()[0]}", file=sys.stderr)
        print(f"last {TAIL_LINES} lines of {self.path}:", file=sys.stderr)
        for line in self.tail():
            print(f"  {line}", file=sys.stderr)
        return 1

    def where(self) -> str:
        """The closing line naming the file."""
        return f"Ray's and the workers' log: {self.path}"
