"""Scale to zero, self-healing nodes and update behaviour, read from the synthesized templates.

Cluster Autoscaler chart and Pod Identity role, the ASG tags (auto-discovery and node-template),
GPU groups empty by default, node auto-repair and the monitoring add-on, MINIMAL updates, the
multi-card EFA layouts; and the cross-check that a Ray worker pod of every shipped variable file
fits the node-template tags of its group, so the autoscaler can place it on a node that does not
exist yet. Templates come from tests/stack_synth.py's session cache; `alt` has autoscaling off.
"""

from __future__ import annotations

import json
import re

import pytest
from aws_cdk.assertions import Match, Template
from kubernetes.utils import parse_quantity

from config.k8s import WORKER_GROUP_LABEL
from stacks.asg_tags import NODE_TEMPLATE
from tests.stack_synth import synth
from tests.test_consistency import k8s_objects

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)


def template(variant: str) -> Template:
    return Template.from_json(synth(variant).templates["cluster"])


def cluster_resources(variant: str, kind: str) -> dict[str, dict]:
    return {k: r for k, r in synth(variant).templates["cluster"]["Resources"].items() if r["Type"] == kind}


def sdk_call(props: dict) -> dict:
    """An AwsCustomResource's Create call as data: CloudFormation references become `<LogicalId>` strings."""
    def text(part) -> str:
        if isinstance(part, str):
            return part
        if "Ref" in part:
            return f"<{part['Ref']}>"
        return f"<{part['Fn::GetAtt'][0]}>"
    create = props["Create"]
    return json.loads(create if isinstance(create, str) else "".join(map(text, create["Fn::Join"][1])))


def asg_tags(variant: str) -> dict[str, dict[str, str]]:
    """Tags written onto each GPU node group's ASG, by worker-group name, following the chain in the template:
    CreateOrUpdateTags on the ASG name that DescribeNodegroup returned for that node group."""
    calls = {k: sdk_call(r["Properties"]) for k, r in cluster_resources(variant, "Custom::AWS").items()}
    nodegroups = cluster_resources(variant, "AWS::EKS::Nodegroup")
    out = {}
    for call in calls.values():
        if call["action"] != "createOrUpdateTags":
            continue
        (asg,) = {t["ResourceId"] for t in call["parameters"]["Tags"]}
        lookup = calls[asg.strip("<>")]
        assert lookup["action"] == "describeNodegroup"
        nodegroup = nodegroups[lookup["parameters"]["nodegroupName"].strip("<>")]["Properties"]
        out[nodegroup["Labels"][WORKER_GROUP_LABEL]] = {t["Key"]: t["Value"] for t in call["parameters"]["Tags"]}
    return out


def gpu_nodegroup(variant: str, group: str) -> dict:
    (props,) = [r["Properties"] for r in cluster_resources(variant, "AWS::EKS::Nodegroup").values()
                if r["Properties"]["Labels"].get(WORKER_GROUP_LABEL) == group]
    return props


# ---- Cluster Autoscaler ---------------------------------------------------------------------------

def test_autoscaler_chart_matches_the_cluster_minor_on_system_nodes():
    config = synth("default").config
    assert config.cluster.kubernetes_version == "1.34"
    template("default").has_resource_properties("Custom::AWSCDK-EKS-HelmChart", {
        "Chart": "cluster-autoscaler", "Repository": "https://kubernetes.github.io/autoscaler", "Version": "9.53.0",
        "Namespace": "kube-system",
        "Values": Match.serialized_json(Match.object_like({
            "cloudProvider": "aws", "awsRegion": config.region,
            "image": {"tag": "v1.34.2"},
            "nodeSelector": {"ray-efa.io/role": "system"},
            "rbac": {"serviceAccount": {"create": True, "name": "cluster-autoscaler"}},
        })),
    })


def test_autoscaler_discovers_this_clusters_groups_by_tag():
    template("default").has_resource_properties("Custom::AWSCDK-EKS-HelmChart", {
        "Chart": "cluster-autoscaler",
        "Values": Match.serialized_json(Match.object_like({"autoDiscovery": {
            "clusterName": "ray-efa",
            "tags": ["k8s.io/cluster-autoscaler/enabled", "k8s.io/cluster-autoscaler/ray-efa"]}})),
    })


def test_scale_down_after_the_files_minutes():
    minutes = synth("default").config.autoscaling.scale_down_minutes
    assert minutes == 10
    template("default").has_resource_properties("Custom::AWSCDK-EKS-HelmChart", {
        "Chart": "cluster-autoscaler",
        "Values": Match.serialized_json(Match.object_like({"extraArgs": Match.object_like({
            "scale-down-unneeded-time": "10m"})})),
    })


def test_autoscaler_service_account_bound_by_pod_identity():
    template("default").has_resource_properties("AWS::EKS::PodIdentityAssociation", {
        "Namespace": "kube-system", "ServiceAccount": "cluster-autoscaler",
        "RoleArn": {"Fn::GetAtt": [Match.string_like_regexp("^ClusterAutoscalerRole"), "Arn"]}})


def test_autoscaler_may_resize_only_this_clusters_asgs():
    template("default").has_resource_properties("AWS::IAM::Policy", {
        "Roles": [{"Ref": Match.string_like_regexp("^ClusterAutoscalerRole")}],
        "PolicyDocument": {"Statement": Match.array_with([Match.object_like({
            "Action": ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
            "Condition": {"StringEquals": {"aws:ResourceTag/k8s.io/cluster-autoscaler/ray-efa": "owned"}},
        })])},
    })


def test_no_autoscaler_and_fixed_groups_when_disabled():
    config = synth("alt").config
    assert config.autoscaling.enabled is False
    assert "cluster-autoscaler" not in {r["Properties"]["Chart"] for r in
                                        cluster_resources("alt", "Custom::AWSCDK-EKS-HelmChart").values()}
    template("alt").resource_count_is("Custom::AWS", 0)
    assert gpu_nodegroup("alt", "gpu-b")["ScalingConfig"] == {"MinSize": 1, "DesiredSize": 1, "MaxSize": 1}


def test_cost_outputs_idle_and_while_a_job_runs():
    config = synth("default").config
    template("default").has_output("IdleUsdPerHour", {"Value": f"{config.idle_cost_per_hour:.2f}"})
    template("default").has_output("OnDemandUsdPerHour", {"Value": f"{config.cost_per_hour:.2f}"})
    assert config.idle_cost_per_hour < config.cost_per_hour  # no GPU node while idle


# ---- node groups -----------------------------------------------------------------------------------

def test_gpu_groups_are_empty_while_idle_by_default():
    config = synth("default").config
    (group,) = config.cluster.worker_groups
    assert gpu_nodegroup("default", "gpu")["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 0, "MaxSize": group.nodes}


def test_ray_worker_replicas_still_come_from_nodes():
    config = synth("default").config
    (worker,) = next(o for o in k8s_objects("default") if o["kind"] == "RayCluster")["spec"]["workerGroupSpecs"]
    assert worker["replicas"] == config.cluster.worker_groups[0].nodes == 2


def test_capacity_block_group_starts_with_no_node():
    assert gpu_nodegroup("p5", "h100")["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 0, "MaxSize": 2}


def test_asgs_carry_the_discovery_tags():
    for tags in asg_tags("default").values():
        assert tags["k8s.io/cluster-autoscaler/enabled"] == "true"
        assert tags["k8s.io/cluster-autoscaler/ray-efa"] == "owned"


def test_node_template_tags_on_the_asg():
    tags = asg_tags("default")["gpu"]
    assert {k.removeprefix(f"{NODE_TEMPLATE}/"): v for k, v in tags.items() if k.startswith(NODE_TEMPLATE)} == {
        "label/ray-efa.io/role": "gpu", "label/ray-efa.io/worker-group": "gpu",
        "label/nvidia.com/gpu.present": "true", "label/vpc.amazonaws.com/efa.present": "true",
        "taint/nvidia.com/gpu": "true:NoSchedule",
        "resources/cpu": "48", "resources/memory": "192Gi", "resources/nvidia.com/gpu": "4",
        "resources/vpc.amazonaws.com/efa": "1", "resources/hugepages-2Mi": "5120Mi",
        "resources/ephemeral-storage": "3760Gi",  # the NVMe RAID0 kubelet runs on
    }


@pytest.mark.parametrize("variant", ["default", "alt"])
def test_node_auto_repair_on_every_node_group(variant):
    groups = cluster_resources(variant, "AWS::EKS::Nodegroup")
    assert len(groups) == 1 + len(synth(variant).config.cluster.worker_groups)
    for props in groups.values():
        assert props["Properties"]["NodeRepairConfig"] == {"Enabled": True}


def test_node_monitoring_agent_addon():
    template("default").has_resource_properties("AWS::EKS::Addon", {"AddonName": "eks-node-monitoring-agent"})


def test_gpu_groups_update_with_the_minimal_strategy():
    for variant, group in [("default", "gpu"), ("p5", "h100")]:
        assert gpu_nodegroup(variant, group)["UpdateConfig"] == {"MaxUnavailable": 1, "UpdateStrategy": "MINIMAL"}


def test_gpu_nodes_turn_on_nodeadms_fast_image_pull():
    (lt,) = [r["Properties"]["LaunchTemplateData"] for r in cluster_resources("default", "AWS::EC2::LaunchTemplate")
             .values() if r["Properties"]["LaunchTemplateData"].get("InstanceType") == "g6.12xlarge"]
    text = lt["UserData"]["Fn::Base64"]
    assert re.search(r"kind: NodeConfig\nspec:\n  featureGates:\n    FastImagePull: true\n", text)


def test_system_nodes_turn_on_fast_image_pull_without_gpu_settings():
    # The head and its submitter sidecar pull the same multi-GB image on the system nodes.
    (lt,) = [r["Properties"]["LaunchTemplateData"] for r in cluster_resources("default", "AWS::EC2::LaunchTemplate")
             .values() if "InstanceType" not in r["Properties"]["LaunchTemplateData"]]
    text = lt["UserData"]["Fn::Base64"]
    assert "FastImagePull: true" in text
    assert "nr_hugepages" not in text and "localStorage" not in text


# ---- multi-card EFA --------------------------------------------------------------------------------

def _interfaces(data: dict) -> list[tuple[int, int, str]]:
    return [(n["NetworkCardIndex"], n["DeviceIndex"], n["InterfaceType"]) for n in data["NetworkInterfaces"]]


def test_p5_48xlarge_efa_layout_interface_by_interface():
    (data,) = [r["Properties"]["LaunchTemplateData"] for r in cluster_resources("p5", "AWS::EC2::LaunchTemplate")
               .values() if r["Properties"]["LaunchTemplateData"].get("InstanceType") == "p5.48xlarge"]
    expected = [(0, 0, "interface"), (0, 1, "efa-only")] + [(card, 0, "efa-only") for card in range(1, 32)]
    assert _interfaces(data) == expected
    assert sum(kind != "interface" for _, _, kind in _interfaces(data)) == 32  # one EFA device per card


def test_p4d_24xlarge_efa_layout_interface_by_interface():
    import aws_cdk as cdk
    from aws_cdk import aws_ec2 as ec2

    from stacks.efa_nodegroup import efa_network_interfaces

    stack = cdk.Stack(cdk.App(), "P4d")
    ec2.CfnLaunchTemplate(stack, "Lt", launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
        instance_type="p4d.24xlarge", network_interfaces=efa_network_interfaces(4, ["sg-1", "sg-2"])))
    (data,) = [r["Properties"]["LaunchTemplateData"] for r in Template.from_stack(stack).to_json()["Resources"]
               .values()]
    assert _interfaces(data) == [(0, 0, "interface"), (0, 1, "efa-only"), (1, 0, "efa-only"), (2, 0, "efa-only"),
                                 (3, 0, "efa-only")]
    assert all(n["Groups"] == ["sg-1", "sg-2"] and n["DeleteOnTermination"] for n in data["NetworkInterfaces"])


# ---- the cross-check -------------------------------------------------------------------------------

SHIPPED = ["default", "p5", "socket", "single-node", "spot"]  # config/cluster.yaml and config/examples/*.yaml


@pytest.mark.parametrize("variant", SHIPPED)
def test_every_worker_pod_fits_its_groups_node_template(variant):
    """What the autoscaler needs to scale a group up from zero for a Pending Ray worker: every resource the
    pod requests, every label it selects and every taint it tolerates (and no other taint) are in the
    group's node-template tags. Synthesized CloudFormation and synthesized manifests only."""
    tags_by_group = asg_tags(variant)
    spec = next(o for o in k8s_objects(variant) if o["kind"] == "RayCluster")["spec"]
    assert spec["workerGroupSpecs"] and len(tags_by_group) == len(spec["workerGroupSpecs"])
    for worker in spec["workerGroupSpecs"]:
        pod = worker["template"]["spec"]
        matching = [g for g, tags in tags_by_group.items()
                    if all(tags.get(f"{NODE_TEMPLATE}/label/{k}") == v for k, v in pod["nodeSelector"].items())]
        assert len(matching) == 1, (worker["groupName"], pod["nodeSelector"])
        tags = tags_by_group[matching[0]]
        (container,) = pod["containers"]
        for resource, amount in container["resources"]["requests"].items():
            offered = tags.get(f"{NODE_TEMPLATE}/resources/{resource}")
            assert offered is not None, f"{variant}/{worker['groupName']}: no node-template tag for {resource}"
            assert parse_quantity(offered) >= parse_quantity(amount), (resource, offered, amount)
        taints = {k.removeprefix(f"{NODE_TEMPLATE}/taint/"): v for k, v in tags.items()
                  if k.startswith(f"{NODE_TEMPLATE}/taint/")}
        tolerated = {t["key"]: f"{t['value']}:{t['effect']}" for t in pod.get("tolerations", [])}
        assert taints == tolerated, (variant, worker["groupName"])
