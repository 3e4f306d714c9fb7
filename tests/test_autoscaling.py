"""Scale to zero, self-healing nodes and update behaviour, read from the synthesized templates.

Cluster Autoscaler chart and Pod Identity role, what the autoscaler reads about an empty node group (the node
group's labels, taints and node-template tags, through DescribeNodegroup: stacks/node_template.py), GPU groups
empty by default, node auto-repair and the monitoring add-on, MINIMAL updates, the multi-card EFA layouts; and
the cross-check that a Ray worker pod of every shipped variable file fits the node Cluster Autoscaler 1.34's
`buildNodeFromTemplate` imagines for its group (tests/autoscaler_model.py), so the autoscaler scales it up from
zero. Templates come from tests/stack_synth.py's session cache; `alt` has autoscaling off.
"""

from __future__ import annotations

import json
import re

import pytest
from aws_cdk.assertions import Match, Template

from config.k8s import EFA_PRESENT_LABEL, ROLE_LABEL, WORKER_GROUP_LABEL
from stacks.node_template import NODE_TEMPLATE_RESOURCES
from tests import autoscaler_model as ca
from tests.helpers import cdk_app
from tests.stack_synth import VARIANTS, synth
from tests.test_consistency import k8s_objects

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)
SHIPPED = ["default", "p5", "socket", "single-node", "spot"]  # config/cluster.yaml and config/examples/*.yaml


def template(variant: str) -> Template:
    return Template.from_json(synth(variant).templates["cluster"])


def cluster_resources(variant: str, kind: str) -> dict[str, dict]:
    return {k: r for k, r in synth(variant).templates["cluster"]["Resources"].items() if r["Type"] == kind}


def gpu_nodegroup(variant: str, group: str) -> dict:
    (props,) = [r["Properties"] for r in cluster_resources(variant, "AWS::EKS::Nodegroup").values()
                if r["Properties"]["Labels"].get(WORKER_GROUP_LABEL) == group]
    return props


def imagined_nodes(variant: str) -> dict[str, ca.Node]:
    """The node the autoscaler imagines for each node group of the variant while it is empty, by the group's
    `ray-efa.io/worker-group` label (`system` for the system group): CA 1.34's buildNodeFromTemplate fed with the
    ASG tags EKS writes plus any the templates write, and DescribeNodegroup as the template defines the group."""
    result = synth(variant)
    config = result.config
    extra_asg_tags = ca.project_asg_tags(list(result.templates.values()))
    groups = {g.name: g for g in config.cluster.worker_groups}
    nodes = {}
    for logical_id, res in cluster_resources(variant, "AWS::EKS::Nodegroup").items():
        props = res["Properties"]
        name = props["Labels"].get(WORKER_GROUP_LABEL, "system")
        itype = config.instance(groups[name]) if name in groups else config.system_instance
        instance_type = groups[name].instance_type if name in groups else config.cluster.system_nodes.instance_type
        asg_tags = {**ca.eks_asg_tags(config.cluster.name, logical_id),
                    **{t["Key"]: t["Value"] for t in extra_asg_tags}}
        nodes[name] = ca.build_node_from_template(
            vcpus=itype.vcpus, memory_mib=itype.memory_gib * 1024, gpus=itype.gpus, instance_type=instance_type,
            zone=config.gpu_availability_zone, asg_tags=asg_tags,
            nodegroup=ca.describe_nodegroup(props, name=logical_id,
                                            kubernetes_version=config.cluster.kubernetes_version))
    return nodes


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


@pytest.mark.parametrize("variant", VARIANTS)
def test_nothing_writes_tags_onto_an_auto_scaling_group(variant):
    """ASG tags written with CreateOrUpdateTags are never deleted; all the autoscaler needs is on the node group."""
    templates = synth(variant).templates.values()
    assert ca.project_asg_tags(list(templates)) == []
    assert not [k for t in templates for k, r in t["Resources"].items() if r["Type"] == "Custom::AWS"]
    assert "autoscaling:CreateOrUpdateTags" not in json.dumps(list(templates))


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_node_group_name_is_taken_from_its_ref(variant):
    """`Ref` of an AWS::EKS::Nodegroup is `<cluster>/<nodegroup>`, not a name EKS accepts (aws/aws-cdk#22442)."""
    for template_ in synth(variant).templates.values():
        nodegroup_ids = {k for k, r in template_["Resources"].items() if r["Type"] == "AWS::EKS::Nodegroup"}
        refs = set(re.findall(r'\{"Ref": "([^"]+)"\}', json.dumps(template_)))
        assert not refs & nodegroup_ids


def test_nodegroup_name_attribute_is_the_bare_name():
    """With @aws-cdk/aws-eks:nodegroupNameAttribute (cdk.json) `Nodegroup.nodegroup_name` is the NodegroupName
    attribute, as aws-cdk-lib 2.275's aws-eks-v2/lib/managed-nodegroup.js returns it when the flag is on."""
    import aws_cdk as cdk

    nodegroup = synth("default").stacks.cluster.gpu_nodegroups["gpu"].nodegroup
    stack = cdk.Stack.of(nodegroup)
    logical_id = stack.get_logical_id(nodegroup.node.default_child)
    assert stack.resolve(nodegroup.nodegroup_name) == {"Fn::GetAtt": [logical_id, "NodegroupName"]}


def test_node_template_tags_on_the_node_group():
    tags = gpu_nodegroup("default", "gpu")["Tags"]
    assert {k.removeprefix(NODE_TEMPLATE_RESOURCES): v for k, v in tags.items()
            if k.startswith(NODE_TEMPLATE_RESOURCES)} == {
        "vpc.amazonaws.com/efa": "1", "hugepages-2Mi": "5120Mi",
        "ephemeral-storage": "3760Gi",  # the NVMe RAID0 kubelet runs on
    }


def test_imagined_gpu_node_of_the_default_file():
    node = imagined_nodes("default")["gpu"]
    assert {k: str(v) for k, v in node.allocatable.items()} == {
        "pods": "110", "cpu": "48", "memory": str(192 * 2**30), "nvidia.com/gpu": "4",
        "vpc.amazonaws.com/efa": "1", "hugepages-2Mi": str(5120 * 2**20), "ephemeral-storage": str(3760 * 2**30)}
    assert node.taints == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    assert {ROLE_LABEL: "gpu", WORKER_GROUP_LABEL: "gpu", EFA_PRESENT_LABEL: "true",
            "k8s.amazonaws.com/accelerator": "nvidia-l4"}.items() <= node.labels.items()


@pytest.mark.parametrize("variant", SHIPPED)
def test_node_group_tags_within_ekss_limits(variant):
    """EKS TagResource: at most 50 tags, keys up to 128 and values up to 256 characters (botocore's eks model,
    TagMap / TagKey / TagValue), from the characters it documents (letters, digits, space, + - = . _ : / @)."""
    from botocore.session import get_session

    shapes = get_session().get_service_model("eks").shape_for("TagMap")
    for props in [r["Properties"] for r in cluster_resources(variant, "AWS::EKS::Nodegroup").values()]:
        tags = props.get("Tags", {})
        assert len(tags) <= shapes.metadata["max"]
        for key, value in tags.items():
            assert len(key) <= shapes.key.metadata["max"] and len(value) <= shapes.value.metadata["max"], key
            assert re.fullmatch(r"[\w +\-=.:/@]+", key) and not key.lower().startswith("aws:"), key


def test_a_label_dropped_from_the_file_is_gone_from_what_the_autoscaler_reads():
    """The default file with socket transport drops the EFA label (and EFA devices, huge pages): it is gone from the
    node group's labels and tags, from any ASG tag the templates write, and so from the imagined node."""
    before, after = imagined_nodes("default")["gpu"], imagined_nodes("default-socket")["gpu"]
    assert before.labels[EFA_PRESENT_LABEL] == "true"
    assert EFA_PRESENT_LABEL not in after.labels
    assert "vpc.amazonaws.com/efa" in before.allocatable and "vpc.amazonaws.com/efa" not in after.allocatable
    assert "hugepages-2Mi" not in after.allocatable
    props = gpu_nodegroup("default-socket", "gpu")
    everything_read = json.dumps([props["Labels"], props.get("Tags", {}), props.get("Taints", []),
                                  ca.project_asg_tags(list(synth("default-socket").templates.values()))])
    assert EFA_PRESENT_LABEL not in everything_read and "vpc.amazonaws.com/efa" not in everything_read


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

    stack = cdk.Stack(cdk_app(), "P4d")
    ec2.CfnLaunchTemplate(stack, "Lt", launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
        instance_type="p4d.24xlarge", network_interfaces=efa_network_interfaces(4, ["sg-1", "sg-2"])))
    (data,) = [r["Properties"]["LaunchTemplateData"] for r in Template.from_stack(stack).to_json()["Resources"]
               .values()]
    assert _interfaces(data) == [(0, 0, "interface"), (0, 1, "efa-only"), (1, 0, "efa-only"), (2, 0, "efa-only"),
                                 (3, 0, "efa-only")]
    assert all(n["Groups"] == ["sg-1", "sg-2"] and n["DeleteOnTermination"] for n in data["NetworkInterfaces"])


# ---- the cross-check -------------------------------------------------------------------------------

def _worker_pods(variant: str) -> list[tuple[str, dict]]:
    spec = next(o for o in k8s_objects(variant) if o["kind"] == "RayCluster")["spec"]
    return [(w["groupName"], w["template"]["spec"]) for w in spec["workerGroupSpecs"]]


@pytest.mark.parametrize("variant", SHIPPED)
def test_every_worker_pod_fits_the_node_the_autoscaler_imagines_for_its_group(variant):
    """What the autoscaler needs to scale a group up from zero for a Pending Ray worker: the node it imagines
    from the node group (and any ASG tags) offers every resource the pod requests, has every label it
    selects, and no taint it does not tolerate. Synthesized CloudFormation and synthesized manifests only."""
    nodes = imagined_nodes(variant)
    pods = _worker_pods(variant)
    assert pods and len(pods) == len(synth(variant).config.cluster.worker_groups)
    for group, pod in pods:
        fitting = [name for name, node in nodes.items() if not ca.misfits(pod, node)]
        assert fitting == [group], (variant, group, {name: ca.misfits(pod, node) for name, node in nodes.items()})


def test_the_fit_check_sees_a_missing_resource_label_or_toleration():
    (_, pod), node = _worker_pods("default")[0], imagined_nodes("default")["gpu"]
    assert ca.misfits(pod, node) == []
    more_efa = json.loads(json.dumps(pod))
    more_efa["containers"][0]["resources"]["requests"]["vpc.amazonaws.com/efa"] = "2"
    assert ca.misfits(more_efa, node) == ["vpc.amazonaws.com/efa: requests 2, node offers 1"]
    no_toleration = {**pod, "tolerations": []}
    assert ca.misfits(no_toleration, node) == ["taint nvidia.com/gpu=true:NoSchedule not tolerated"]
    other_group = {**pod, "nodeSelector": {WORKER_GROUP_LABEL: "other"}}
    assert ca.misfits(other_group, node) == [f"nodeSelector {WORKER_GROUP_LABEL}=other: node has 'gpu'"]
