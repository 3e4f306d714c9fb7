"""`make help` lists every target of the Makefile, one line each (the `## ` text on the target's line)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow  # runs make


def test_make_help_lists_every_phony_target_once():
    makefile = (REPO / "Makefile").read_text()
    phony = set(re.search(r"^\.PHONY:(.*)$", makefile, re.M).group(1).split())
    run = subprocess.run(["make", "-s", "--no-print-directory", "help"], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True)
    listed = [line.split()[0] for line in run.stdout.splitlines() if line.strip()]
    assert sorted(listed) == sorted(phony), set(phony) ^ set(listed)
    assert all(len(line.split(None, 1)) == 2 for line in run.stdout.splitlines() if line.strip())
