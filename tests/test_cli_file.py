"""One way to name the variable file for every command, `--help` without side effects, and outputs that
record which file (and which bytes of it) they came from."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, cdk_app, write_variant

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)

# Every `python -m X` entry point of the project, found on disk so a new one is covered without editing this.
COMMANDS = sorted(
    ".".join(p.relative_to(REPO).with_suffix("").parts[:-1])
    for top in ("config", "charts", "workloads", "stacks", "ops") for p in (REPO / top).rglob("__main__.py"))
COMMANDS += sorted(
    ".".join(p.relative_to(REPO).with_suffix("").parts)
    for top in ("charts", "workloads", "stacks", "ops", "tools") for p in (REPO / top).rglob("*.py")
    # tools/install.py runs as `python3 tools/install.py` before the venv exists (its own usage line)
    if p.name not in ("__main__.py", "install.py") and 'if __name__ == "__main__":' in p.read_text())
# Commands that read the variable file, with the arguments that reach the loading of it.
FILE_COMMANDS = {
    "config": ["check"],
    "workloads.check": [],
    "charts": [],
    "workloads.plan": [],
    "workloads.preflight": ["--local"],
    "workloads.verify": [],
    "workloads.verify_ec2": [],
    "ops.launcher": ["render", "--outputs", str(REPO / "config" / "examples" / "ec2" / "outputs.json")],
    "workloads.fsdp_finetune": [],
    "ops.check": ["--against", "config/cluster.yaml"],
}


def _run(module: str, *args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "CLUSTER_CONFIG"}
    environ.update(PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=120)


def test_every_command_is_listed():
    assert set(FILE_COMMANDS) <= set(COMMANDS)
    assert {"tools.crds", "ops.scan", "workloads.verify"} <= set(COMMANDS)


@pytest.mark.parametrize("module", COMMANDS)
def test_help_answers_without_side_effects(tmp_path, module):
    dist = REPO / "dist"
    before = sorted((p.name, p.stat().st_mtime_ns) for p in dist.iterdir()) if dist.exists() else None
    proc = _run(module, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: python -m "), proc.stdout[:200]
    assert proc.stderr == ""  # no Node.js banner, no download note
    assert list(tmp_path.iterdir()) == []  # nothing written where it ran
    after = sorted((p.name, p.stat().st_mtime_ns) for p in dist.iterdir()) if dist.exists() else None
    assert after == before  # the repository's manifests untouched


@pytest.mark.parametrize("module", sorted(FILE_COMMANDS))
def test_file_is_the_first_positional_argument(tmp_path, module):
    bad = write_variant(tmp_path, group={"gpus_per_pod": 3}, name="bad.yaml")
    proc = _run(module, *FILE_COMMANDS[module], str(bad), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{bad}: cluster.worker_groups.0.gpus_per_pod: 3 does not divide" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("module", sorted(FILE_COMMANDS))
def test_cluster_config_is_the_fallback(tmp_path, module):
    bad = write_variant(tmp_path, group={"gpus_per_pod": 3}, name="bad.yaml")
    proc = _run(module, *FILE_COMMANDS[module], cwd=tmp_path, env={"CLUSTER_CONFIG": str(bad)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{bad}: cluster.worker_groups.0.gpus_per_pod" in proc.stderr


def test_legacy_config_option_still_works_but_two_files_are_refused(tmp_path):
    bad = write_variant(tmp_path, group={"gpus_per_pod": 3}, name="bad.yaml")
    proc = _run("workloads.plan", "--config", str(bad), cwd=tmp_path)
    assert proc.returncode == 2 and f"{bad}: cluster.worker_groups.0.gpus_per_pod" in proc.stderr
    other = write_variant(tmp_path, name="other.yaml")
    proc = _run("workloads.plan", str(other), "--config", str(bad), cwd=tmp_path)
    assert proc.returncode == 2 and "two variable files given" in proc.stderr


def test_manifests_record_the_file_and_its_digest(tmp_path):
    from charts.__main__ import synthesize
    from charts.charts import CONFIG_FILE_ANNOTATION, CONFIG_SHA256_ANNOTATION
    from config import load_config

    path = write_variant(tmp_path, {"job": {"max_steps": 77}}, name="mine.yaml")
    files = synthesize(load_config(path), path, tmp_path / "dist")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    objects = [o for f in files for o in yaml.safe_load_all(f.read_text()) if o]
    assert objects
    for obj in objects:
        annotations = obj["metadata"]["annotations"]
        assert annotations[CONFIG_SHA256_ANNOTATION] == digest, obj["kind"]
        assert annotations[CONFIG_FILE_ANNOTATION] == str(path)


def test_templates_record_the_file_and_its_digest(tmp_path, monkeypatch):
    import aws_cdk as cdk

    import app

    path = write_variant(tmp_path, name="mine.yaml")
    monkeypatch.chdir(tmp_path)
    stack_app = cdk_app(outdir=str(tmp_path / "cdk.out"))
    stack = cdk.Stack(stack_app, "S")
    cdk.CfnWaitConditionHandle(stack, "H")
    app.record_source(stack_app, str(path))
    template = stack_app.synth().get_stack_by_name("S").template
    assert template["Metadata"][app.CONFIG_METADATA] == {
        "file": "mine.yaml", "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
