"""Pytest plugin: count passed, skipped and failed per tier, and in CI fail the run on any skip not listed.

A tier is the marker a test carries among those pyproject.toml declares (`slow`, and any tier marker added
there later), else `fast`; `$TEST_TIER` names the whole run instead (`.ci/run`'s second step sets
`TEST_TIER=pyarrow-oldest`). At the end of every run one line per tier is printed:

    tier fast: 812 passed, 0 skipped, 0 failed

In CI (`CI=true`, as GitHub Actions and `.ci/run` set it) a skip is allowed only when `tests/allowed_skips.toml`
lists it: an entry's `test` (a node id, `*` globs allowed) and `reason` (a substring of the skip's reason)
must both match, its `why` says why that skip is acceptable, and an `only_when` names an environment variable
that must be set for the entry to apply (`GITHUB_ACTIONS`: the tiers GitHub's runners cannot run). Any other
skip is printed with its reason and the run exits 1 although every test passed: a pipeline that checks less than
ours must not stay green.
Loaded from tests/conftest.py (`pytest_plugins`). Under pytest-xdist the controller receives every worker's
reports, so it alone counts and decides.
"""

from __future__ import annotations

import fnmatch
import os
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

ALLOWED_FILE = Path(__file__).with_name("allowed_skips.toml")
TIER_ENV = "TEST_TIER"


@dataclass(frozen=True)
class AllowedSkip:
    test: str
    reason: str
    why: str
    # An environment variable that must be set (true/1/yes) for the skip to be allowed: `GITHUB_ACTIONS` for the
    # tiers GitHub's runners cannot run (no ../shared lab), so our CI, which has the lab, fails on those skips.
    only_when: str = ""

    def applies(self, environ=os.environ) -> bool:
        return not self.only_when or _true(environ.get(self.only_when, ""))

    def matches(self, nodeid: str, reason: str, environ=os.environ) -> bool:
        return self.applies(environ) and fnmatch.fnmatchcase(nodeid, self.test) and self.reason in reason


def load_allowed(path: Path = ALLOWED_FILE) -> list[AllowedSkip]:
    """The allowed skips; an entry without `test`, `reason` or `why` is an error naming the file and entry."""
    entries = tomllib.loads(path.read_text()).get("skip", [])
    out = []
    for i, entry in enumerate(entries):
        missing = [k for k in ("test", "reason", "why") if not str(entry.get(k, "")).strip()]
        if missing:
            raise pytest.UsageError(f"{path}: [[skip]] entry {i + 1} lacks {', '.join(missing)}")
        unknown = sorted(set(entry) - {"test", "reason", "why", "only_when"})
        if unknown:
            raise pytest.UsageError(f"{path}: [[skip]] entry {i + 1}: unknown key(s) {', '.join(unknown)}; "
                                    "the keys are test, reason, why and only_when")
        out.append(AllowedSkip(entry["test"], entry["reason"], entry["why"], str(entry.get("only_when", ""))))
    return out


def _true(value: str) -> bool:
    return value.lower() in ("true", "1", "yes")


def in_ci(environ=os.environ) -> bool:
    return _true(environ.get("CI", ""))


def skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class Accounting:
    def __init__(self, config: pytest.Config):
        self.config = config
        declared = config.getini("markers")
        self.tier_markers = [line.split(":", 1)[0].strip() for line in declared]
        self.counts: dict[str, Counter] = {}
        self.skips: list[tuple[str, str]] = []

    def tier(self, report) -> str:
        if os.environ.get(TIER_ENV):
            return os.environ[TIER_ENV]
        keywords = getattr(report, "keywords", {}) or {}
        return next((m for m in self.tier_markers if m in keywords), "fast")

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        counts = self.counts.setdefault(self.tier(report), Counter())
        if report.skipped and report.when in ("setup", "call"):
            counts["skipped"] += 1
            self.skips.append((report.nodeid, skip_reason(report)))
        elif report.failed:
            counts["failed"] += 1  # an error in setup or teardown fails the test too
        elif report.passed and report.when == "call":
            counts["passed"] += 1

    def unexpected(self) -> list[tuple[str, str]]:
        allowed = load_allowed()
        return [(nodeid, reason) for nodeid, reason in self.skips
                if not any(a.matches(nodeid, reason) for a in allowed)]

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter):
        write = terminalreporter.write_line
        for tier in sorted(self.counts):
            c = self.counts[tier]
            write(f"tier {tier}: {c['passed']} passed, {c['skipped']} skipped, {c['failed']} failed")
        if in_ci():
            bad = self.unexpected()
            for nodeid, reason in bad:
                write(f"unexpected skip in CI (not in {ALLOWED_FILE.name}): {nodeid}: {reason}", red=True)
            if bad:
                write(f"CI: {len(bad)} skip(s) not listed in tests/{ALLOWED_FILE.name}: the run fails", red=True)
            else:
                write(f"CI: {len(self.skips)} skip(s), all listed in tests/{ALLOWED_FILE.name}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if in_ci() and exitstatus == pytest.ExitCode.OK and self.unexpected():
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller counts
        return
    config.pluginmanager.register(Accounting(config), "ci-accounting")
