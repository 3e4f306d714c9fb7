"""tests/ci_accounting.py in a real pytest run (a child process on a throwaway suite): the per-tier counts, and in
CI a skip fails the run unless tests/allowed_skips.toml lists it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ci_accounting import load_allowed
from tests.helpers import REPO

pytestmark = pytest.mark.slow  # runs pytest in a child process

SUITE = '''
import pytest

def test_ok():
    pass

@pytest.mark.slow
def test_slow_ok():
    pass

def test_skipped():
    pytest.skip(REASON)
'''


def run_suite(tmp_path: Path, reason: str, *, ci: bool) -> subprocess.CompletedProcess:
    # Named like a listed module, so only the reason decides whether the skip is allowed.
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "tests" / "test_pins.py").write_text(f"REASON = {reason!r}\n" + SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TEST_TIER", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(REPO)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.ci_accounting", "-p", "no:cacheprovider",
                           "-q", "tests"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_counts_are_printed_per_tier(tmp_path):
    run = run_suite(tmp_path, "needs the mirror ../shared", ci=False)
    assert run.returncode == 0, run.stdout
    assert "tier fast: 1 passed, 1 skipped, 0 failed" in run.stdout
    assert "tier slow: 1 passed, 0 skipped, 0 failed" in run.stdout


def test_in_ci_an_unlisted_skip_fails_the_run(tmp_path):
    run = run_suite(tmp_path, "no prometheus here", ci=True)
    assert run.returncode == 1, run.stdout
    assert "unexpected skip in CI (not in allowed_skips.toml): tests/test_pins.py::test_skipped: no prometheus here" \
        in run.stdout


def test_in_ci_a_listed_skip_passes(tmp_path):
    run = run_suite(tmp_path, "needs the mirror ../shared (/x)", ci=True)
    assert run.returncode == 0, run.stdout
    assert "CI: 1 skip(s), all listed in tests/allowed_skips.toml" in run.stdout


def test_outside_ci_an_unlisted_skip_does_not_fail(tmp_path):
    assert run_suite(tmp_path, "no prometheus here", ci=False).returncode == 0


def test_every_allowed_skip_says_why():
    assert all(a.why.strip() and a.reason and a.test for a in load_allowed())


def test_an_only_when_entry_applies_only_with_its_variable(tmp_path):
    path = tmp_path / "allowed.toml"
    path.write_text('[[skip]]\ntest = "tests/x.py::*"\nreason = "no lab"\nonly_when = "GITHUB_ACTIONS"\nwhy = "w"\n')
    (entry,) = load_allowed(path)
    assert entry.matches("tests/x.py::t", "no lab here", {"GITHUB_ACTIONS": "true"})
    assert not entry.matches("tests/x.py::t", "no lab here", {})
    assert not entry.matches("tests/x.py::t", "no lab here", {"GITHUB_ACTIONS": "false"})


def test_an_unknown_key_in_an_entry_is_an_error_naming_it(tmp_path):
    path = tmp_path / "allowed.toml"
    path.write_text('[[skip]]\ntest = "t"\nreason = "r"\nwhy = "w"\nonly_if = "GITHUB_ACTIONS"\n')
    with pytest.raises(pytest.UsageError, match=r"allowed.toml: \[\[skip\]\] entry 1: unknown key\(s\) only_if"):
        load_allowed(path)
