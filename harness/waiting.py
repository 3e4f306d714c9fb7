"""Bounded waits on a condition, and the end of the processes a test started: the one way tests do both.

A test waits for the state it needs (a file, an HTTP answer, a scraped sample), never for time to pass; the
poll interval below only sets how soon after the state appears the wait sees it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout_s: float, what: str, *, interval_s: float = 0.1,
             detail: Callable[[], str] = str) -> T:
    """`condition()`'s first truthy value; AssertionError naming `what` (and `detail()`) after `timeout_s`.

    `condition` may raise to end the wait early (a process it watches has exited)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{detail()}")
        time.sleep(interval_s)


def kill_session(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGKILL the process group `proc` leads (started with `start_new_session=True`), then reap `proc`.

    For servers a test owns outright (a Ray head, ...): nothing of them outlives the test, so there is nothing
    to stop gracefully. On SIGTERM `ray start` drains the node and stops its children one after another (ray
    2.58.0 ray/_private/node.py, `kill_all_processes(allow_graceful=True)`): 5 to 12 s of teardown here."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=timeout_s)


def descendants(pid: int) -> set[int]:
    """Every process below `pid`, from one read of /proc. For processes that leave their parent's group or session
    (sshd's per-connection children, the lab's setsid'd components), which no group signal reaches."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
