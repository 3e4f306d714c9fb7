"""The real pinned CDK CLI (`npx cdk synth`) on a bad variable file, in a temporary copy of the project."""

from __future__ import annotations

import os
import shutil
import subprocess

import yaml

from tests.helpers import REPO, default_data


def test_cdk_synth_refuses_a_bad_variable_file(tmp_path):
    for item in ("app.py", "cdk.json", "config", "stacks"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / item)
    for item in (".venv", "node_modules", "package.json"):
        (tmp_path / item).symlink_to(REPO / item)
    data = default_data()
    data["cluster"]["worker_groups"][0]["gpus_per_pod"] = 3
    (tmp_path / "config" / "cluster.yaml").write_text(yaml.safe_dump(data, sort_keys=False))

    env = {**os.environ, "CDK_DISABLE_CLI_TELEMETRY": "true", "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
           "CDK_DISABLE_VERSION_CHECK": "true"}
    env.pop("CLUSTER_CONFIG", None)
    proc = subprocess.run(["npx", "--no-install", "cdk", "synth", "--quiet"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "config/cluster.yaml: cluster.worker_groups.0.gpus_per_pod: 3 does not divide g6.12xlarge's 4 GPUs" \
        in output, output
    assert not list(tmp_path.glob("cdk.out/*.template.json"))
