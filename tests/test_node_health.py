"""GPU node health: the node monitoring agent's configuration against the add-on's own schema, pinned add-on
versions, and the accelerator label Cluster Autoscaler's GPU processor waits on. (Where the agent's DaemonSets
land is checked on the rendered chart in tests/test_placement.py.)"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jsonschema
import pytest
from aws_cdk.assertions import Match, Template

from config.k8s import GPU_TAINT, ROLE_LABEL, WORKER_GROUP_LABEL
from stacks.efa_nodegroup import ACCELERATOR_LABEL, accelerator_label
from stacks.versions import MANAGED_ADDON_VERSIONS, managed_addon_version
from tests.stack_synth import synth
from tests.vendored import ChartsUnavailable, file_path

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)

SCHEMA = "eks-node-monitoring-agent-1.7.0.configuration.schema.json"
# Every add-on the stacks create with some file: "alt" turns the CloudWatch add-on on.
ALL_ADDONS = {"vpc-cni", "kube-proxy", "coredns", "eks-pod-identity-agent", "eks-node-monitoring-agent",
              "amazon-cloudwatch-observability"}


def addons(name: str) -> dict[str, dict]:
    return {r["Properties"]["AddonName"]: r["Properties"]
            for r in synth(name).templates["cluster"]["Resources"].values() if r["Type"] == "AWS::EKS::Addon"}


def schema_validator():
    try:
        path = file_path(SCHEMA)
    except ChartsUnavailable as exc:
        pytest.skip(str(exc))
    schema = json.loads(path.read_text())
    return jsonschema.validators.validator_for(schema)(schema)


def agent_configuration(name: str) -> dict:
    return json.loads(addons(name)["eks-node-monitoring-agent"]["ConfigurationValues"])


# ---- the node monitoring agent's configuration --------------------------------------------------

@pytest.mark.parametrize("name", ["default", "p5", "alt"])
def test_node_monitoring_configuration_is_valid_for_the_addon_schema(name):
    errors = [e.message for e in schema_validator().iter_errors(agent_configuration(name))]
    assert not errors


def test_addon_schema_refuses_a_chart_only_value():
    """The add-on accepts only its schema's subset of the chart values (`additionalProperties: false`)."""
    assert not schema_validator().is_valid({"dcgmAgent": {"image": {"tag": "v1"}}})


def test_dcgm_server_tolerates_exactly_the_gpu_taint():
    Template.from_json(synth("default").templates["cluster"]).has_resource_properties("AWS::EKS::Addon", {
        "AddonName": "eks-node-monitoring-agent",
        "ConfigurationValues": Match.serialized_json({"dcgmAgent": {"tolerations": [GPU_TAINT.toleration()]}}),
    })


# ---- pinned add-on versions ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["default", "alt"])
def test_every_managed_addon_is_pinned_to_its_version_for_the_clusters_kubernetes(name):
    version = synth(name).config.cluster.kubernetes_version
    assert {a: p.get("AddonVersion") for a, p in addons(name).items()} == {
        a: MANAGED_ADDON_VERSIONS[version][a] for a in addons(name)}


def test_stacks_create_no_addon_without_a_pin():
    assert set(addons("alt")) == ALL_ADDONS


def _installed_layer_minors() -> set[str]:
    spec = importlib.util.find_spec("aws_cdk")
    return {f"1.{p.name.rpartition('_v')[2]}" for loc in spec.submodule_search_locations
            for p in Path(loc).glob("lambda_layer_kubectl_v*") if (p / "__init__.py").is_file()}


def test_every_kubernetes_minor_config_check_accepts_has_every_addon_pinned():
    """`python -m config check` refuses a minor with no kubectl layer installed, so the installed layers' minors
    are the ones a file can use; each needs all its add-on versions here."""
    minors = _installed_layer_minors()
    assert minors and all(set(MANAGED_ADDON_VERSIONS.get(m, {})) == ALL_ADDONS for m in minors)


def test_an_unpinned_kubernetes_minor_is_refused_with_the_fix():
    with pytest.raises(KeyError, match=r"no coredns add-on version pinned for Kubernetes 1\.99; add one to "
                                       r"MANAGED_ADDON_VERSIONS in config/versions.py"):
        managed_addon_version("1.99", "coredns")


# ---- the accelerator label ----------------------------------------------------------------------

@pytest.mark.parametrize(("name", "value"), [("default", "nvidia-l4"), ("p5", "nvidia-h100")])
def test_gpu_node_groups_carry_the_accelerator_label(name, value):
    labels = [r["Properties"]["Labels"] for r in synth(name).templates["cluster"]["Resources"].values()
              if r["Type"] == "AWS::EKS::Nodegroup" and WORKER_GROUP_LABEL in r["Properties"]["Labels"]]
    assert labels and all(label[ACCELERATOR_LABEL] == value for label in labels)


def test_system_node_group_has_no_accelerator_label():
    (labels,) = [r["Properties"]["Labels"] for r in synth("default").templates["cluster"]["Resources"].values()
                 if r["Type"] == "AWS::EKS::Nodegroup" and r["Properties"]["Labels"].get(ROLE_LABEL) == "system"]
    assert ACCELERATOR_LABEL not in labels


@pytest.mark.parametrize(("model", "value"), [("L4", "nvidia-l4"), ("A10G", "nvidia-a10g"), ("L40S", "nvidia-l40s"),
                                              ("A100-40GB", "nvidia-a100"), ("H200", "nvidia-h200")])
def test_accelerator_value_is_spelled_like_the_autoscalers_gpu_types(model, value):
    assert accelerator_label(model) == value
