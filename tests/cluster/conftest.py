"""The cluster tier (`make cluster-test`): one real control plane with the real KubeRay operator per session.

Every module here sets `pytestmark = CLUSTER_MARKS`: `cluster` and `slow` (`make check` never starts a
cluster). The lab's operator runs with the flags and environment that the project's Helm values give the EKS
add-on (tests/k8s_lab.py `operator_settings`); the operator timers the scenarios shorten go through the chart's
`env` value (`TIER_OPERATOR_ENV`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from config import ClusterConfig, load_config
from tests import k8s_lab
from tests.helpers import EXAMPLES, cdk_app, write_variant

REPO = Path(__file__).resolve().parents[2]
CONFIGS = {"cluster": REPO / "config" / "cluster.yaml",
           **{p.stem: p for p in sorted(EXAMPLES.glob("*.yaml"))}}
"""Every example variable file the tier puts on the API server (config/cluster.yaml and config/examples/)."""

CLUSTER_MARKS = [pytest.mark.cluster, pytest.mark.slow]

TIER_OPERATOR_ENV: dict[str, str] = {}
"""Operator timers shortened for the tier, passed as the chart's `env` value (none needed so far)."""


@dataclass(frozen=True)
class Synthesized:
    """One variable file, synthesized as `make synth` does: CloudFormation templates and the dist/ manifests."""

    name: str
    file: Path
    config: ClusterConfig
    templates: list[dict]
    dist: Path


_ROOT = Path(tempfile.mkdtemp(prefix="cluster-tier-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


@cache
def synthesized(name: str) -> Synthesized:
    """CDK synth (no nag: the tier reads the node groups and the Helm values) and cdk8s synth of CONFIGS[name]."""
    from charts.__main__ import synthesize
    from stacks import build

    file = CONFIGS[name]
    config = load_config(file)
    app = cdk_app(outdir=str(_ROOT / name / "cdk.out"))
    build(app, config, nag=False)
    assembly = app.synth()
    dist = _ROOT / name / "dist"
    synthesize(config, file, dist)
    return Synthesized(name=name, file=file, config=config, templates=[s.template for s in assembly.stacks],
                       dist=dist)


def _lab_or_skip() -> Path:
    script = k8s_lab.lab_script()
    if script is None:
        if os.environ.get(k8s_lab.REQUIRED_ENV):
            pytest.fail(k8s_lab.HOW_TO_GET, pytrace=False)
        pytest.skip(k8s_lab.HOW_TO_GET)
    return script


@pytest.fixture(scope="session")
def lab():
    """The lab, its operator configured from config/cluster.yaml's synthesized KubeRay add-on values."""
    script = _lab_or_skip()
    values = k8s_lab.kuberay_values(synthesized("cluster").templates)
    args, env = k8s_lab.operator_settings(values, TIER_OPERATOR_ENV)
    # No cluster DNS in the lab: the operator reaches each head's dashboard through the API server's service proxy
    # (an allowed difference, k8s_lab.ALLOWED_FLAG_DIFFERENCES).
    args.append("--use-kubernetes-proxy")
    started = k8s_lab.start(operator_args=args, operator_env=env, script=script)
    try:
        started.addon_values = values
        yield started
    finally:
        k8s_lab.stop(started)


def synthesize_variant(name: str, overrides: dict, directory: Path) -> Synthesized:
    """config/cluster.yaml with `overrides` (the tier's test variable file: shorter deadlines), synthesized."""
    from charts.__main__ import synthesize

    file = write_variant(directory, overrides, name=f"{name}.yaml")
    config = load_config(file)
    dist = directory / "dist"
    synthesize(config, file, dist)
    return Synthesized(name=name, file=file, config=config, templates=synthesized("cluster").templates, dist=dist)


@contextlib.contextmanager
def deployed_base(lab, synth: Synthesized, prefix: str):
    """`synth`'s node groups as nodes named <prefix>-..., the add-on CRDs, its namespace and dist/ray-base applied;
    yields (namespace, {node: shape}); removes what it applied and the nodes afterwards (the scenario modules'
    shared set-up)."""
    from tests.cluster import deploy

    deploy.install_addon_crds(lab)
    ns = synth.config.ray.namespace
    lab.ensure_namespace(ns)
    nodes = deploy.create_nodes(lab, synth, prefix)
    applied = deploy.manifests(synth.dist, deploy.BASE)
    lab.apply(applied)
    try:
        yield ns, nodes
    finally:
        deploy.remove(lab, applied, ns)
        deploy.delete_nodes(lab, nodes)


_rows: list[dict] = []


def record(*, scenario: str, outcome: str, gpu_nodes: int, gpu_node_minutes_lost: float, limit: str,
           timeline: list | None = None) -> None:
    """Add a scenario's row; written to `k8s_lab.REPORT` as the session ends (other scenarios' rows stay)."""
    _rows.append({"scenario": scenario, "outcome": outcome, "gpu_nodes": gpu_nodes,
                  "gpu_node_minutes_lost": gpu_node_minutes_lost, "limit": limit, "timeline": timeline or []})


def pytest_sessionfinish(session):
    if _rows:
        k8s_lab.write_report(_rows)
