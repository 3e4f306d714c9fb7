"""The nodeadm NodeConfig and root volumes in the synthesized launch templates (issue 17, points 5 and 6).

The user data is read back out of the templates and parsed as nodeadm parses it (MIME, then YAML).
The AMI's own values it must keep are those of awslabs/amazon-eks-ami v20260724
(nodeadm/internal/containerd/base-runtime-spec.json), cited in stacks/launch_template.py.
"""

from __future__ import annotations

import email
import json

import pytest
import yaml

from config.k8s import ROLE_LABEL, WORKER_GROUP_LABEL
from stacks.launch_template import cloudwatch_agent_on_host_network
from stacks.versions import MANAGED_ADDON_VERSIONS
from tests.helpers import EXAMPLES
from tests.managed_addons import CLOUDWATCH_AGENT, READ_AT
from tests.stack_synth import synth

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)


def _launch_templates(variant: str) -> dict[str, dict]:
    """Launch-template data by the role of its node group: "system" or the worker group's name."""
    template = synth(variant).templates["cluster"]["Resources"]
    out = {}
    for group in (r["Properties"] for r in template.values() if r["Type"] == "AWS::EKS::Nodegroup"):
        data = template[group["LaunchTemplate"]["Id"]["Ref"]]["Properties"]["LaunchTemplateData"]
        labels = group["Labels"]
        out["system" if labels.get(ROLE_LABEL) == "system" else labels[WORKER_GROUP_LABEL]] = data
    return out


def _node_config(data: dict) -> dict:
    message = email.message_from_string(data["UserData"]["Fn::Base64"])
    (part,) = [p for p in message.walk() if p.get_content_type() == "application/node.eks.aws"]
    return yaml.safe_load(part.get_payload())


def _rlimits(data: dict) -> list[dict] | None:
    spec = _node_config(data)["spec"].get("containerd", {}).get("baseRuntimeSpec")
    return spec["process"]["rlimits"] if spec else None


@pytest.mark.parametrize("variant", ["default", "p5"])
def test_efa_nodes_raise_memlock_and_keep_the_amis_nofile(variant):
    for name, data in _launch_templates(variant).items():
        if name == "system":
            continue
        by_type = {r["type"]: r for r in _rlimits(data)}
        # The AMI's RLIMIT_NOFILE, repeated: nodeadm's merge replaces the whole list.
        assert by_type["RLIMIT_NOFILE"] == {"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 1048576}
        assert by_type["RLIMIT_MEMLOCK"]["soft"] == by_type["RLIMIT_MEMLOCK"]["hard"] >= 2**40
        assert set(by_type) == {"RLIMIT_NOFILE", "RLIMIT_MEMLOCK"}


def test_memlock_survives_nodeadms_float64_round_trip():
    # nodeadm decodes the spec into interface{} (float64) and encodes it again; the value must come
    # out as the same integer, below 2**64 (the OCI spec's uint64).
    (data,) = [d for n, d in _launch_templates("default").items() if n != "system"]
    for rlimit in _rlimits(data):
        for key in ("soft", "hard"):
            value = rlimit[key]
            assert int(float(value)) == value < 2**64
            assert json.loads(json.dumps(float(value))) == value


def test_socket_transport_leaves_the_runtime_spec_alone():
    for data in _launch_templates("socket").values():
        assert _rlimits(data) is None


def test_system_nodes_leave_the_runtime_spec_alone():
    assert _rlimits(_launch_templates("default")["system"]) is None


@pytest.mark.parametrize("variant", ["default", "p5", "socket", "alt"])
def test_fast_image_pull_is_on_every_node_group(variant):
    for data in _launch_templates(variant).values():
        assert _node_config(data)["spec"]["featureGates"] == {"FastImagePull": True}


@pytest.mark.parametrize("variant", ["default", "p5", "socket", "alt"])
def test_system_root_volume_has_the_throughput_fast_image_pull_wants(variant):
    (mapping,) = _launch_templates(variant)["system"]["BlockDeviceMappings"]
    assert mapping["Ebs"]["Throughput"] >= 600  # nodeadm/doc/examples.md: "at least 600MiB/s"


def test_gpu_nodes_on_nvme_keep_the_baseline_root_throughput():
    # containerd lives on the instance-store RAID0 there; the root volume does not carry the pull.
    for name, data in _launch_templates("default").items():
        if name != "system":
            assert _node_config(data)["spec"]["instance"]["localStorage"]["strategy"] == "RAID0"
            assert "Throughput" not in data["BlockDeviceMappings"][0]["Ebs"]


# ---- IMDS hop limit (issue 17, point 6) ---------------------------------------------------------
# config/cluster.yaml and every example as shipped (tests/stack_synth.py's "socket" variant changes only the
# endpoint and the bucket).
SHIPPED = ["default", *sorted(p.stem for p in EXAMPLES.glob("*.yaml"))]


def _hop_limits(variant: str) -> set[int]:
    return {d["MetadataOptions"]["HttpPutResponseHopLimit"] for d in _launch_templates(variant).values()}


@pytest.mark.parametrize("variant", SHIPPED)
def test_every_shipped_file_keeps_pods_off_imds(variant):
    assert not synth(variant).config.cluster.cloudwatch_observability
    assert _hop_limits(variant) == {1}


def test_cloudwatch_add_on_keeps_the_hop_limit_at_one():
    """The "alt" variant turns `cluster.cloudwatch_observability` on: the pinned add-on's agent and fluent-bit run
    on the host network (stacks/launch_template.py), so no pod needs IMDS."""
    assert synth("alt").config.cluster.cloudwatch_observability
    assert _hop_limits("alt") == {1}


def test_hop_limit_rule_agrees_with_the_pinned_cloudwatch_agent_pod():
    """The placement model's CloudWatch agent pod (tests/managed_addons.py, read from the pinned chart) is on the
    host network, as the hop limit rule assumes for the pinned version."""
    version = MANAGED_ADDON_VERSIONS["1.34"]["amazon-cloudwatch-observability"]
    assert READ_AT["amazon-cloudwatch-observability"] == version
    assert CLOUDWATCH_AGENT["hostNetwork"] is cloudwatch_agent_on_host_network("1.34") is True
