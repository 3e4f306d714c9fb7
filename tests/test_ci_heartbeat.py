"""tests/heartbeat.py: a line whenever pytest has been silent for the interval, saying what it is doing; none while
pytest prints. The class with a hand-driven clock, then a real pytest run in a child process (collection and a test
that are quiet for longer than the interval, with and without pytest-xdist)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import heartbeat
from tests.helpers import REPO


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Collector:
    def __init__(self, nodeid):
        self.nodeid = nodeid


def _beating(interval=10.0):
    clock, lines = Clock(), []
    return heartbeat.Heartbeat(lines.append, interval, clock=clock), clock, lines


def test_no_line_while_the_terminal_was_written_within_the_interval():
    beat, clock, lines = _beating()
    for _ in range(5):
        clock.now += 9.0
        beat.stamp()  # pytest wrote something (a progress dot)
        assert not beat.beat()
    assert lines == []


def test_a_line_every_interval_of_silence_while_collecting():
    beat, clock, lines = _beating()
    for _ in range(412):
        beat.pytest_itemcollected(item=None)
    beat.pytest_collectstart(collector=Collector("tests"))  # a folder: the module is what imports
    beat.pytest_collectstart(collector=Collector("tests/test_train_ray.py"))
    beat.pytest_collectstart(collector=Collector("tests/test_train_ray.py::TestFit"))
    clock.now += 10.0
    assert beat.beat()
    clock.now += 5.0
    assert not beat.beat()  # the heartbeat itself counts as output
    clock.now += 5.0
    assert beat.beat()
    assert lines == ["pytest: collecting tests/test_train_ray.py, 412 tests so far, 10 s since the start",
                     "pytest: collecting tests/test_train_ray.py, 412 tests so far, 20 s since the start"]


def test_a_long_test_is_named_with_its_time_in_it():
    beat, clock, lines = _beating()
    beat.pytest_collection_finish(session=None)
    beat.pytest_runtest_logstart("tests/test_a.py::test_slow", None)
    clock.now += 3.0
    beat.pytest_runtest_logstart("tests/test_b.py::test_other", None)  # a second xdist worker's test
    clock.now += 9.0
    assert beat.beat()
    beat.pytest_runtest_logfinish("tests/test_a.py::test_slow", None)
    clock.now += 10.0
    assert beat.beat()
    beat.pytest_runtest_logfinish("tests/test_b.py::test_other", None)
    clock.now += 10.0
    assert beat.beat()
    assert lines == ["pytest: still running tests/test_a.py::test_slow (12 s in it, 1 more running)",
                     "pytest: still running tests/test_b.py::test_other (19 s in it)",
                     "pytest: still working (fixtures' teardown, the summary), 32 s since the start"]


def test_the_interval_comes_from_the_environment():
    assert heartbeat.interval({}) == heartbeat.HEARTBEAT_S == 10.0
    assert heartbeat.interval({heartbeat.ENV: "0"}) == 0  # off
    with pytest.raises(pytest.UsageError, match="PYTEST_HEARTBEAT_S='ten': not a number of seconds"):
        heartbeat.interval({heartbeat.ENV: "ten"})


SUITE = '''
import time

time.sleep(2.0)  # a slow import: collection is quiet


def test_a():
    pass


def test_long():
    time.sleep(2.0)


def test_b():
    pass
'''


@pytest.mark.slow  # pytest in a child process
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_real_run_says_what_it_does_when_quiet(tmp_path, workers):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_quiet.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TEST_TIER", "PYTEST_ADDOPTS")}
    env.update(PYTHONPATH=str(REPO), PYTEST_HEARTBEAT_S="0.5")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.heartbeat", "-p", "no:cacheprovider", "-q",
                          *workers, "tests"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    out = run.stdout
    assert run.returncode == 0, out
    # Under xdist the workers collect: the controller, which prints, does not see which module is importing.
    assert ("pytest: collecting, " if workers else "pytest: collecting tests/test_quiet.py, ") in out
    assert "pytest: still running tests/test_quiet.py::test_long (" in out
    assert "3 passed" in out
    # Each heartbeat is a line of its own: never glued to the progress dots.
    assert all(line.startswith("pytest: ") or "pytest: " not in line for line in out.splitlines()), out
