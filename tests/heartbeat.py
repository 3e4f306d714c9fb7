"""Pytest plugin: a line whenever pytest has printed nothing for HEARTBEAT_S seconds, saying what it is doing.

Why: bench/newcomer.py measured 50.8 s without output in `make check` while pytest collected the suite (imports of
torch, Ray and the CDK libraries on a loaded two-core machine; `-q` prints nothing until the first test ends), and a
long test (a Ray run, a cluster scenario) is as silent. A newcomer should never watch a silent terminal for 30 s.

What it prints, only after HEARTBEAT_S seconds in which pytest's terminal wrote nothing (so a normal run, which
prints a dot per test, is unchanged):

    pytest: collecting tests/test_train_ray.py, 412 tests so far, 24 s since the start
    pytest: still running tests/test_train_ray.py::test_fit (31 s in it)

"Nothing written" is measured on the terminal reporter's own writer (`TerminalWriter._file`, wrapped here), so any
line pytest writes (progress, xdist's worker lines, a heartbeat) restarts the count. Output a test writes past the
capture (`-s`) is not seen: under `-s` a line may come while a test prints. The line is written by a thread; it
writes only after HEARTBEAT_S of quiet, so it does not interleave with the reporter's own writes in practice.

`PYTEST_HEARTBEAT_S` sets the interval (0 turns it off). Under pytest-xdist only the controller prints (the workers'
output is not shown): it sees each test start and end from the workers' reports. Loaded from tests/conftest.py.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

HEARTBEAT_S = 10.0
ENV = "PYTEST_HEARTBEAT_S"


class _Stamped:
    """A file that records the time of its last write, and otherwise is the file it wraps."""

    def __init__(self, file, stamp):
        self._wrapped = file
        self._stamp = stamp

    def write(self, text):
        self._stamp()
        return self._wrapped.write(text)

    def __getattr__(self, name):
        return getattr(self._wrapped, name)


class Heartbeat:
    def __init__(self, write_line, interval: float, clock=time.monotonic):
        self.write_line = write_line
        self.interval = interval
        self.clock = clock
        self.start = self.last = clock()
        self.collected = 0
        self.collecting = True
        self.module = ""  # the module being collected (imported)
        self.running: dict[str, float] = {}
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.terminal: int | None = None  # the duplicated terminal fd it writes to, closed at the end

    def stamp(self) -> None:
        self.last = self.clock()

    def message(self) -> str:
        now = self.clock()
        if self.running:
            nodeid, began = min(self.running.items(), key=lambda item: item[1])
            more = f", {len(self.running) - 1} more running" if len(self.running) > 1 else ""
            return f"pytest: still running {nodeid} ({now - began:.0f} s in it{more})"
        if self.collecting:
            where = f" {self.module}" if self.module else ""
            so_far = f"{self.collected} tests so far, " if self.collected else ""
            return f"pytest: collecting{where}, {so_far}{now - self.start:.0f} s since the start"
        return f"pytest: still working (fixtures' teardown, the summary), {now - self.start:.0f} s since the start"

    def beat(self) -> bool:
        """Write the line if the terminal has been quiet for the interval; True when it wrote."""
        if self.clock() - self.last < self.interval:
            return False
        self.write_line(self.message())
        self.stamp()  # also when the writer is not the wrapped one
        return True

    def run(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="pytest-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._done.wait(min(1.0, self.interval / 4)):
            try:
                self.beat()
            except Exception:  # a closed terminal at exit: never fail the run for a progress line
                return

    def stop(self) -> None:
        self._done.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self.terminal is not None:
            os.close(self.terminal)
            self.terminal = None

    # ---- hooks ----
    @pytest.hookimpl
    def pytest_itemcollected(self, item):
        self.collected += 1

    @pytest.hookimpl
    def pytest_collectstart(self, collector):
        if collector.nodeid.endswith(".py"):  # a module: its import is what takes the time
            self.module = collector.nodeid

    @pytest.hookimpl
    def pytest_collection_finish(self, session):
        self.collecting = False

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid, location):
        self.collecting = False
        self.running[nodeid] = self.clock()

    @pytest.hookimpl
    def pytest_runtest_logfinish(self, nodeid, location):
        self.running.pop(nodeid, None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_unconfigure(self, config):
        self.stop()


def interval(environ=os.environ) -> float:
    value = environ.get(ENV, "")
    try:
        return float(value) if value.strip() else HEARTBEAT_S
    except ValueError:
        raise pytest.UsageError(f"{ENV}={value!r}: not a number of seconds (0 turns the heartbeat off)") from None


@pytest.hookimpl(trylast=True)  # after the terminal reporter is registered
def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker: its output is not shown; the controller beats
        return
    seconds = interval()
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if seconds <= 0 or reporter is None:
        return
    writer = reporter._tw
    try:
        # The terminal itself, duplicated now, while pytest's capture is suspended: during collection and each test
        # pytest points fd 1 at its capture file, and a line written through the reporter then would be captured
        # with the test's output instead of shown (pytest writes its own lines with capture suspended).
        terminal = os.dup(writer._file.fileno())
    except (AttributeError, OSError, ValueError):  # not a real file (pytest run in-process): through the reporter
        terminal = None
    heartbeat = Heartbeat(lambda line: _write(writer, terminal, line) if terminal is not None
                          else reporter.write_line(line), seconds)
    heartbeat.terminal = terminal
    writer._file = _Stamped(writer._file, heartbeat.stamp)
    config.pluginmanager.register(heartbeat, "heartbeat")
    heartbeat.run()


def _write(writer, terminal: int, line: str) -> None:
    """`line` on its own line of the terminal; the writer's record of its current line is reset, so the progress
    dots after it continue on a fresh line with their percentage in place."""
    try:
        if os.path.sameopenfile(writer._file.fileno(), terminal):
            # Not captured now: what pytest wrote but its buffered stdout holds (a pipe, as under make or CI) comes
            # first, so the line lands where it happened.
            writer.flush()
    except (AttributeError, OSError, ValueError):
        pass
    prefix = "\n" if writer.width_of_current_line else ""
    os.write(terminal, f"{prefix}{line}\n".encode(errors="replace"))
    writer._current_line = ""
