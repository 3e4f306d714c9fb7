"""The scheduling rules and nodeadm formulas of tests/placement.py, each against the upstream behaviour it
restates (sources in that module's docstring)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from config.catalog import load_catalog
from tests.placement import (
    MIB,
    NODEADM_INSTANCE_INFO,
    NodeGroup,
    kube_reserved_cpu_millicores,
    kube_reserved_memory_mib,
    max_pods,
    node_affinity_matches,
    placeable,
    pod_requests,
    quantity,
    shortfall,
    tolerates,
)

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


def group(labels=None, taints=None) -> NodeGroup:
    return NodeGroup(name="g", instance_type="m7i.2xlarge", labels=labels or {}, taints=taints or [],
                     capacity={"cpu": Fraction(8), "memory": Fraction(32 * 1024) * MIB, "pods": Fraction(58)},
                     is_gpu=False)


def affinity(*expressions) -> dict:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": list(expressions)}]}}}}


# ---- quantities ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "value"), [
    ("100m", Fraction(1, 10)), ("2", Fraction(2)), ("30Mi", Fraction(30 * MIB)), ("1Gi", Fraction(2**30)),
    ("1e3", Fraction(1000)), ("1.5", Fraction(3, 2)), ("128k", Fraction(128000)), (4, Fraction(4)),
])
def test_quantity_parses_kubernetes_forms(text, value):
    assert quantity(text) == value


def test_quantity_refuses_a_malformed_value():
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        quantity("12 cores")


# ---- tolerations --------------------------------------------------------------------------------

def test_equal_toleration_matches_key_value_and_effect():
    assert tolerates({"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
                     GPU_TAINT)


def test_equal_toleration_with_another_value_does_not_match():
    assert not tolerates({"key": "nvidia.com/gpu", "value": "false", "effect": "NoSchedule"}, GPU_TAINT)


def test_exists_toleration_ignores_the_value():
    assert tolerates({"key": "nvidia.com/gpu", "operator": "Exists"}, GPU_TAINT)


def test_exists_toleration_with_empty_key_matches_every_taint():
    assert tolerates({"operator": "Exists"}, GPU_TAINT)


def test_empty_key_with_equal_compares_only_the_value():
    """As `ToleratesTaint` does; API validation refuses such a toleration, so no rendered chart has one."""
    assert not tolerates({"operator": "Equal", "value": "false"}, GPU_TAINT)


def test_toleration_for_another_effect_does_not_match():
    assert not tolerates({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, GPU_TAINT)


def test_prefer_no_schedule_taint_does_not_keep_a_pod_off():
    assert placeable({}, group(taints=[{**GPU_TAINT, "effect": "PreferNoSchedule"}]))


def test_untolerated_no_schedule_taint_keeps_a_pod_off():
    assert not placeable({"tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}]},
                         group(taints=[GPU_TAINT]))


# ---- node selector and affinity ----------------------------------------------------------------

def test_node_selector_needs_every_label():
    assert not node_affinity_matches({"nodeSelector": {"a": "1", "b": "2"}}, {"a": "1"})


@pytest.mark.parametrize(("expression", "labels", "expected"), [
    ({"key": "t", "operator": "In", "values": ["g6.12xlarge"]}, {"t": "g6.12xlarge"}, True),
    ({"key": "t", "operator": "In", "values": ["g6.12xlarge"]}, {}, False),
    ({"key": "c", "operator": "NotIn", "values": ["fargate"]}, {}, True),
    ({"key": "c", "operator": "NotIn", "values": ["fargate"]}, {"c": "fargate"}, False),
    ({"key": "c", "operator": "Exists"}, {"c": ""}, True),
    ({"key": "c", "operator": "DoesNotExist"}, {}, True),
    ({"key": "c", "operator": "DoesNotExist"}, {"c": "x"}, False),
    ({"key": "n", "operator": "Gt", "values": ["3"]}, {"n": "4"}, True),
    ({"key": "n", "operator": "Lt", "values": ["3"]}, {"n": "x"}, False),
])
def test_match_expression_operators(expression, labels, expected):
    assert node_affinity_matches(affinity(expression), labels) is expected


def test_expressions_of_one_term_are_anded():
    spec = affinity({"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"})
    assert not node_affinity_matches(spec, {"a": "1"})


def test_terms_are_ored():
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
        {"matchExpressions": [{"key": "b", "operator": "Exists"}]}]}}}}
    assert node_affinity_matches(spec, {"b": "1"})


def test_a_term_without_expressions_matches_no_node():
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{}]}}}}
    assert not node_affinity_matches(spec, {"a": "1"})


# ---- requests -----------------------------------------------------------------------------------

def test_a_missing_request_defaults_to_the_limit():
    spec = {"containers": [{"resources": {"limits": {"cpu": "100m", "memory": "512Mi"}}}]}
    assert pod_requests(spec) == {"cpu": Fraction(1, 10), "memory": Fraction(512 * MIB)}


def test_containers_add_up_and_a_larger_init_container_wins():
    spec = {"containers": [{"resources": {"requests": {"cpu": "1"}}}, {"resources": {"requests": {"cpu": "1"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "3"}}}]}
    assert pod_requests(spec)["cpu"] == 3


def test_sidecars_add_to_the_containers():
    spec = {"containers": [{"resources": {"requests": {"cpu": "1"}}}],
            "initContainers": [{"restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}}]}
    assert pod_requests(spec)["cpu"] == Fraction(3, 2)


def test_shortfall_counts_a_pod_slot_per_pod():
    assert shortfall([{}, {}], {"pods": Fraction(1)}) == {"pods": Fraction(1)}


def test_shortfall_is_empty_when_the_pods_fit():
    assert shortfall([{"cpu": Fraction(1)}], {"cpu": Fraction(1), "pods": Fraction(1)}) == {}


# ---- nodeadm ------------------------------------------------------------------------------------

def test_max_pods_is_nodeadms_eni_formula():
    # m7i.2xlarge: 4 ENIs x (15 - 1) + 2.
    assert max_pods("m7i.2xlarge") == 58


@pytest.mark.parametrize(("millicores", "reserved"), [(1000, 60), (2000, 70), (8000, 90), (48000, 190),
                                                      (192000, 550)])
def test_kube_reserved_cpu_steps(millicores, reserved):
    assert kube_reserved_cpu_millicores(millicores) == reserved


def test_kube_reserved_memory_grows_with_max_pods():
    assert kube_reserved_memory_mib(58) == 893


def test_every_catalog_type_has_nodeadm_instance_info():
    assert set(load_catalog().instances) <= set(NODEADM_INSTANCE_INFO)


def test_allocatable_subtracts_reserved_eviction_and_hugepages():
    g = NodeGroup(name="g", instance_type="m7i.2xlarge", labels={}, taints=[], is_gpu=False,
                  capacity={"cpu": Fraction(8), "memory": Fraction(32 * 1024) * MIB, "pods": Fraction(58),
                            "hugepages-2Mi": Fraction(1024 * MIB)})
    alloc = g.base_allocatable()
    assert alloc["cpu"] == Fraction(7910, 1000)
    assert alloc["memory"] == (32 * 1024 - 893 - 100 - 1024) * MIB
