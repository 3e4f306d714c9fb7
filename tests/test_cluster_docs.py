"""The commands the docs give to follow and stop a run are the ones the cluster tier checked (tests/cluster/)."""

from __future__ import annotations

import re

import pytest

from tests.helpers import REPO

PAGES = [REPO / "README.md", REPO / "docs" / "watching.md", REPO / "docs" / "manifests.md",
         REPO / "docs" / "failure-handling.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_reads_the_submitter_log_from_the_head_pod(page):
    """K8sJobMode: the submitter is a Job of its own (the tier saw the operator create `ray-efa-job`); the head pod
    has no `ray-job-submitter` container (that is SidecarMode)."""
    for line in page.read_text().splitlines():
        if "kubectl logs" in line and "ray-job-submitter" in line:
            assert "node-type=head" not in line, f"{page.name}: {line.strip()}"


@pytest.mark.parametrize("page", [REPO / "README.md", REPO / "docs" / "watching.md"], ids=lambda p: p.name)
def test_the_follow_and_stop_commands_are_given(page):
    text = page.read_text()
    assert re.search(r"kubectl logs -n ray -f job/ray-efa-job", text)
    assert "python -m ops.stop" in text
