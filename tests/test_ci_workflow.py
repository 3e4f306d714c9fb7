"""The GitHub workflow and `.ci/run` run the same tests: the workflow's test job runs `.ci/run` the way our CI does
(`sudo -E`), nothing narrows the suite on the way (no pytest options, no marker, no tier variable), every artifact
comes through tools/pins.py, and the only skips it adds are the listed GitHub-only ones (the tiers that need the
../shared lab). The workflow itself has never run (no GitHub from this machine): docs/setup.md "CI"."""

from __future__ import annotations

import fnmatch
import re

import yaml

from harness import cluster_real
from tests import k8s_lab
from tests.ci_accounting import load_allowed
from tests.helpers import REPO

WORKFLOW = REPO / ".github" / "workflows" / "test.yml"
CI_RUN = REPO / ".ci" / "run"
# What the workflow may pass to .ci/run: where pip (and so uv) finds torch's CPU build. Anything else (PYTEST_ADDOPTS,
# TEST_TIER, TEST_WORKERS, CI, a marker) would make the workflow's run differ from ours.
ALLOWED_ENV = {"PIP_EXTRA_INDEX_URL"}
# The actions it uses. helm/kind-action brings kind and its node image (the cluster-kind job), at the pins table's
# `ci` versions and digest (test below).
ALLOWED_ACTIONS = {"actions/checkout", "actions/setup-python", "actions/setup-node", "helm/kind-action"}


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _commands(script: str) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in script.splitlines() if line.split("#", 1)[0].strip()]


def test_the_test_job_runs_ci_run_as_our_ci_does():
    steps = _workflow()["jobs"]["test"]["steps"]
    runs = [s for s in steps if ".ci/run" in s.get("run", "")]
    assert len(runs) == 1, "one step runs .ci/run"
    assert runs[0]["run"].strip() == 'sudo -E env "PATH=$PATH" .ci/run'
    # Nothing else in the job runs tests or make targets of its own.
    others = [c for s in steps if s is not runs[0] for c in _commands(s.get("run", ""))]
    assert not [c for c in others if re.search(r"\b(pytest|make)\b", c)], others


def test_ci_run_is_ci_true_make_test():
    commands = _commands(CI_RUN.read_text())
    assert commands[-2:] == ["export CI=true", "make test"], commands
    assert not [c for c in commands[:-2] if re.search(r"\b(pytest|make)\b|PYTEST|TEST_", c)]


def test_nothing_narrows_the_suite_on_the_way():
    workflow = _workflow()
    assert set(workflow.get("env") or {}) <= ALLOWED_ENV
    for name, job in workflow["jobs"].items():
        assert set(job.get("env") or {}) <= ALLOWED_ENV, name
        for step in job["steps"]:
            assert set(step.get("env") or {}) <= ALLOWED_ENV, (name, step.get("name"))


def test_every_artifact_comes_through_the_pins_table():
    for name, job in _workflow()["jobs"].items():
        for step in job["steps"]:
            if "uses" in step:
                assert step["uses"].split("@")[0] in ALLOWED_ACTIONS, (name, step["uses"])
            script = step.get("run", "")
            # No download of its own: a chart, a CRD or a binary is fetched and verified by tools/pins.py.
            assert not re.search(r"\b(curl|wget)\b|https?://|helm repo|helm pull", script), (name, script)
            if "helm install" in script:
                assert "pins.fetch(" in script, (name, script)


def test_no_step_brings_the_lab_so_the_listed_skips_are_the_ones_that_happen():
    # The GitHub-only skips assume the runner has no lab; a step providing one would make them unnecessary.
    text = WORKFLOW.read_text()
    for variable in ("PINS_MIRROR", k8s_lab.LAB_ENV, "CLUSTER_REAL_SHARED", "CLUSTER_TIER_REQUIRED"):
        assert variable not in text


def test_the_github_only_skips_are_the_tiers_that_need_the_lab():
    github = [a for a in load_allowed() if a.only_when]
    assert {a.only_when for a in github} == {"GITHUB_ACTIONS"}
    assert sorted(a.test for a in github) == ["tests/cluster/*", "tests/cluster_real/*"]
    for entry in github:
        files = [p.relative_to(REPO).as_posix() for p in REPO.glob("tests/**/test_*.py")]
        assert any(fnmatch.fnmatchcase(f"{f}::x", entry.test) for f in files), entry.test
    # Each entry's reason is a substring of the skip the tier gives without the lab, and of nothing it gives
    # when the lab is there but something else is missing.
    cluster, real = sorted(github, key=lambda a: a.test)
    assert cluster.reason in k8s_lab.HOW_TO_GET
    no_lab = f"no {cluster_real.LAB_SCRIPT} or {cluster_real.NODE_SCRIPT}: {cluster_real.HOW_TO_GET}"
    assert real.reason in no_lab
    assert real.reason not in f"not root: {cluster_real.HOW_TO_GET}"
    assert real.reason not in f"missing containerd: {cluster_real.HOW_TO_GET}"


def test_a_github_only_skip_fails_our_ci():
    (entry,) = [a for a in load_allowed() if a.test == "tests/cluster/*"]
    nodeid, reason = "tests/cluster/test_cluster_lab.py::test_lab_starts", k8s_lab.HOW_TO_GET
    assert entry.matches(nodeid, reason, {"CI": "true", "GITHUB_ACTIONS": "true"})
    assert not entry.matches(nodeid, reason, {"CI": "true"})


def test_kind_and_its_node_image_are_the_pinned_ones():
    from tools import pins

    kind_steps = [s for job in _workflow()["jobs"].values() for s in job["steps"]
                  if s.get("uses", "").startswith("helm/kind-action@")]
    assert kind_steps, "the cluster-kind job uses helm/kind-action"
    for step in kind_steps:
        assert step["with"] == {"version": pins.pin("kind").version, "node_image": pins.kind_node_image()}
    assert pins.kind_node_image().endswith("@sha256:" + pins.pin("kindest/node").sha256)
    assert len(pins.pin("kindest/node").sha256) == 64
