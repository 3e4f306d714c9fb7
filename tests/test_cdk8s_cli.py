"""The real, pinned `cdk8s synth` CLI (node_modules) running the Python app from cdk8s.yaml.

Output goes to a temporary directory (`--output`), so the repository's dist/ is left alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from charts import validation
from config import load_config
from tests.helpers import REPO, write_variant

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)

EXPECTED = ["dashboards.k8s.yaml", "ray-base.k8s.yaml", "ray-cluster.k8s.yaml", "ray-job.k8s.yaml",
            "ray-watchdog.k8s.yaml"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CLUSTER_CONFIG"}
    env.update(CDK8S_CHECK_UPGRADE="false", JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20", **extra)
    return env


def _cdk8s_synth(output: Path, **env: str) -> subprocess.CompletedProcess:
    npx = shutil.which("npx")
    if npx is None or not (REPO / "node_modules" / ".bin" / "cdk8s").exists():
        pytest.fail("the pinned cdk8s CLI is missing; run `make setup` (npm ci) first")
    return subprocess.run([npx, "--no-install", "cdk8s", "synth", "--output", str(output)], cwd=REPO,
                          env=_env(**env), capture_output=True, text=True, timeout=300)


def test_cdk8s_synth_writes_valid_manifests(tmp_path):
    out = tmp_path / "dist"
    result = _cdk8s_synth(out)
    assert result.returncode == 0, result.stderr + result.stdout
    assert sorted(p.name for p in out.iterdir()) == EXPECTED
    objects = [doc for name in EXPECTED for doc in yaml.safe_load_all((out / name).read_text()) if doc]
    config = load_config(REPO / "config" / "cluster.yaml")
    assert validation.problems(objects, config.cluster.kubernetes_version) == []
    assert {o["kind"] for o in objects} >= {"Namespace", "ServiceAccount", "ConfigMap", "RayCluster", "RayJob"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dist"]  # no staging directory left behind


def test_cdk8s_synth_refuses_a_bad_variable_file(tmp_path):
    bad = write_variant(tmp_path, group={"gpus_per_pod": 3}, name="bad.yaml")
    out = tmp_path / "dist"
    result = _cdk8s_synth(out, CLUSTER_CONFIG=str(bad))
    assert result.returncode != 0
    assert f"{bad}: cluster.worker_groups.0.gpus_per_pod: 3 does not divide g6.12xlarge's 4 GPUs" in result.stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_app_keeps_existing_output_on_a_bad_file(tmp_path):
    """Run directly (not through the CLI, which empties its output first), the app touches nothing on failure."""
    bad = write_variant(tmp_path, {"cluster": {"kubernetes_version": "1.29"}}, name="bad.yaml")
    out = tmp_path / "dist"
    out.mkdir()
    (out / "ray-cluster.k8s.yaml").write_text("previous: manifest\n")
    result = subprocess.run([sys.executable, "-m", "charts"], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env=_env(CLUSTER_CONFIG=str(bad), CDK8S_OUTDIR=str(out)))
    assert result.returncode == 2
    assert f"{bad}: cluster.kubernetes_version: use a current EKS version" in result.stderr
    assert (out / "ray-cluster.k8s.yaml").read_text() == "previous: manifest\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "dist"]


def test_make_setup_and_the_synth_note_name_the_same_node_majors():
    """The Makefile's `tools` check and `python -m charts`' note both say which Node.js majors jsii supports:
    one list may not move without the other."""
    import re

    from charts.__main__ import JSII_SUPPORTED_NODE

    makefile = (REPO / "Makefile").read_text()
    majors = re.search(r"^NODE_SUPPORTED := (.+)$", makefile, re.MULTILINE).group(1).split()
    assert tuple(majors) == JSII_SUPPORTED_NODE
