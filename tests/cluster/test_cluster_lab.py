"""The tier's control plane is the add-on's: the operator's flags and environment, the nodes' shapes."""

from __future__ import annotations

from tests import k8s_lab
from tests.cluster.conftest import CLUSTER_MARKS, TIER_OPERATOR_ENV, synthesized

pytestmark = CLUSTER_MARKS


def test_operator_runs_with_the_addons_flags(lab):
    """Every flag of the chart's Deployment, rendered with the stack's values, reaches the running operator, and
    the operator runs with nothing else beyond ALLOWED_FLAG_DIFFERENCES (feature gates, QPS, concurrency...)."""
    rendered = k8s_lab.render_operator(lab.addon_values)
    running = k8s_lab.running_operator_args(lab)
    assert k8s_lab.flag_drift(rendered["args"], running) == []
    assert "--feature-gates" in k8s_lab.parse_flags(running)


def test_operator_runs_with_the_addons_environment(lab):
    """The Deployment's env (plus the tier's shortened timers, through the same `env` value) is the operator's."""
    _, env = k8s_lab.operator_settings(lab.addon_values, TIER_OPERATOR_ENV)
    environ = dict(item.split("=", 1) for item in
                   open(f"/proc/{lab.operator_pid()}/environ").read().split("\0") if "=" in item)
    assert {k: environ.get(k) for k in env} == env


def test_drift_is_caught():
    """A flag the add-on does not set, or sets otherwise, is drift; the allowed differences are not."""
    addon = ["--enable-leader-election=true", "--feature-gates=A=true", "--qps=100"]
    assert k8s_lab.flag_drift(addon, ["--enable-leader-election=false", "--feature-gates=A=true", "--qps=100",
                                      "--use-kubernetes-proxy", "--metrics-addr", "0"]) == []
    assert k8s_lab.flag_drift(addon, ["--feature-gates=A=false", "--qps=100", "--burst=5"]) == [
        "--burst: add-on None, lab '5'", "--feature-gates: add-on 'A=true', lab 'A=false'"]


def test_gpu_nodes_carry_the_launch_templates_huge_pages():
    """EFA transport: the launch template reserves 2 MiB huge pages, so the node reports them; socket (the
    single-node example, same instance type): none."""
    efa = {s.instance_type: s for s in k8s_lab.node_shapes(synthesized("cluster").templates)}
    socket = {s.instance_type: s for s in k8s_lab.node_shapes(synthesized("single-node").templates)}
    assert efa["g6.12xlarge"].allocatable["hugepages-2Mi"] == "5120Mi"
    assert efa["g6.12xlarge"].allocatable["vpc.amazonaws.com/efa"] == "1"
    assert "hugepages-2Mi" not in socket["g6.12xlarge"].allocatable
    assert efa["g6.12xlarge"].taints == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
