"""The real pinned CDK CLI (`npx cdk synth`) on a bad variable file, in a temporary copy of the project.

Both ways of naming the file are exercised: the default `config/cluster.yaml`, and `-c config=FILE`,
which must win over it. Each run stops at loading the file, before any stack is built.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from tests.helpers import REPO, default_data

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)


def _cdk_synth(cwd, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CDK_DISABLE_CLI_TELEMETRY": "true", "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
           "CDK_DISABLE_VERSION_CHECK": "true"}
    env.pop("CLUSTER_CONFIG", None)
    return subprocess.run(["npx", "--no-install", "cdk", "synth", "--quiet", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cdk_synth_refuses_a_bad_variable_file(tmp_path):
    for item in ("app.py", "cdk.json", "config", "stacks", "tools"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / item)
    for item in (".venv", "node_modules", "package.json"):
        (tmp_path / item).symlink_to(REPO / item)
    data = default_data()
    data["cluster"]["worker_groups"][0]["gpus_per_pod"] = 3
    (tmp_path / "config" / "cluster.yaml").write_text(yaml.safe_dump(data, sort_keys=False))

    proc = _cdk_synth(tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "config/cluster.yaml: cluster.worker_groups.0.gpus_per_pod: 3 does not divide g6.12xlarge's 4 GPUs" \
        in output, output
    assert not list(tmp_path.glob("cdk.out/*.template.json"))

    # -c config=FILE: its own problem is reported, not the default file's.
    data = default_data()
    data["network"]["max_azs"] = 4
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = _cdk_synth(tmp_path, "-c", f"config={other}")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert f"{other}: network.max_azs: 4 AZs, but us-east-2 has 3" in output, output
    assert "gpus_per_pod" not in output
    assert not list(tmp_path.glob("cdk.out/*.template.json"))
