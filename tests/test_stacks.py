"""The synthesized CloudFormation, checked with aws_cdk.assertions: one behaviour per test.

Numbered as in the issue: 1 network, 2 cluster, 3 system nodes, 4 GPU node groups, 5 Helm add-ons,
6 storage and identity, 7 outputs. Templates come from the real app (`stacks.build`), synthesized
once per variable-file variant (tests/stack_synth.py).
"""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match, Template

from config.k8s import EFA_PRESENT_LABEL, GPU_PRESENT_LABEL, GPU_TAINT, ROLE_LABEL, WORKER_GROUP_LABEL
from tests.stack_synth import ADMIN_ROLE, PUBLIC_CIDRS, synth

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)


def template(variant: str, stack: str) -> Template:
    return Template.from_json(synth(variant).templates[stack])


def resources(variant: str, stack: str, kind: str) -> dict[str, dict]:
    return {k: r for k, r in synth(variant).templates[stack]["Resources"].items() if r["Type"] == kind}


def launch_template_data(variant: str, group_name: str) -> dict:
    (data,) = [r["Properties"]["LaunchTemplateData"]
               for k, r in resources(variant, "cluster", "AWS::EC2::LaunchTemplate").items()
               if k.startswith(f"Workers{group_name.replace('-', '')}")]
    return data


def gpu_nodegroups(variant: str) -> dict[str, dict]:
    return {r["Properties"]["Labels"][WORKER_GROUP_LABEL]: r["Properties"]
            for r in resources(variant, "cluster", "AWS::EKS::Nodegroup").values()
            if r["Properties"]["Labels"].get(ROLE_LABEL) == "gpu"}


def helm_chart(variant: str, chart: str) -> dict:
    (props,) = [r["Properties"] for r in resources(variant, "cluster", "Custom::AWSCDK-EKS-HelmChart").values()
                if r["Properties"]["Chart"] == chart]
    return props


def user_data(variant: str, group: str) -> str:
    data = launch_template_data(variant, group).get("UserData")
    return data["Fn::Base64"] if data else ""


# ---- 1. network ---------------------------------------------------------------------------------

def test_vpc_uses_the_file_cidr():
    template("default", "network").has_resource_properties("AWS::EC2::VPC", {
        "CidrBlock": synth("default").config.network.vpc_cidr, "EnableDnsHostnames": True})


def test_public_and_private_subnet_in_each_az_including_the_gpu_az():
    config = synth("default").config
    subnets = resources("default", "network", "AWS::EC2::Subnet").values()
    by_az: dict[str, set[bool]] = {}
    for s in subnets:
        by_az.setdefault(s["Properties"]["AvailabilityZone"], set()).add(s["Properties"]["MapPublicIpOnLaunch"])
    assert sorted(by_az) == sorted(config.availability_zones)
    assert config.gpu_availability_zone in by_az and len(by_az) >= 2
    assert all(kinds == {True, False} for kinds in by_az.values())


def test_one_nat_gateway_by_default():
    template("default", "network").resource_count_is("AWS::EC2::NatGateway", 1)


def test_nat_gateway_count_and_azs_follow_the_file():
    template("alt", "network").resource_count_is("AWS::EC2::NatGateway", 2)
    azs = {s["Properties"]["AvailabilityZone"] for s in resources("alt", "network", "AWS::EC2::Subnet").values()}
    assert len(azs) == 3


def test_s3_gateway_endpoint_keeps_checkpoint_traffic_off_the_nat():
    template("default", "network").has_resource_properties("AWS::EC2::VPCEndpoint", {
        "VpcEndpointType": "Gateway",
        "ServiceName": Match.object_like({"Fn::Join": Match.array_with([Match.array_with([".s3"])])}),
    })


# ---- 2. cluster ---------------------------------------------------------------------------------

def test_native_eks_cluster_with_the_file_version_and_name():
    config = synth("default").config
    template("default", "cluster").has_resource_properties("AWS::EKS::Cluster", {
        "Name": config.cluster.name, "Version": config.cluster.kubernetes_version})
    template("default", "cluster").resource_count_is("Custom::AWSCDK-EKS-Cluster", 0)


def test_no_default_capacity_only_declared_node_groups():
    config = synth("alt").config
    template("alt", "cluster").resource_count_is("AWS::EKS::Nodegroup", 1 + len(config.cluster.worker_groups))
    template("alt", "cluster").resource_count_is("AWS::AutoScaling::AutoScalingGroup", 0)


def test_kubectl_provider_uses_the_matching_kubectl_layer():
    from aws_cdk.lambda_layer_kubectl_v34 import KubectlV34Layer

    result = synth("default")
    assert result.config.cluster.kubernetes_version == "1.34"
    layer = result.stacks.cluster.node.find_child("KubectlLayer")
    assert isinstance(layer, KubectlV34Layer)
    # The layer in the template ships kubectl 1.34.x (its description comes from the layer package) ...
    layer_id = result.stacks.cluster.get_logical_id(layer.node.default_child)
    description = result.templates["cluster"]["Resources"][layer_id]["Properties"]["Description"]
    assert description.startswith("/opt/kubectl/kubectl 1.34."), description
    # ... and is the one the kubectl provider's handler runs with.
    handlers = [r["Properties"] for r in resources("default", "cluster", "AWS::Lambda::Function").values()
                if {"Ref": layer_id} in r["Properties"].get("Layers", [])]
    assert len(handlers) == 1 and "kubectl" in handlers[0]["Description"].lower()


def test_public_endpoint_restricted_to_listed_cidrs_with_private_access():
    template("alt", "cluster").has_resource_properties("AWS::EKS::Cluster", {"ResourcesVpcConfig": Match.object_like({
        "EndpointPublicAccess": True, "EndpointPrivateAccess": True, "PublicAccessCidrs": PUBLIC_CIDRS})})


def test_kubectl_provider_runs_inside_the_vpc_when_the_endpoint_is_narrowed():
    # Outside the VPC it could not reach an endpoint limited to the listed CIDRs.
    template("alt", "cluster").has_resource_properties("AWS::Lambda::Function", {
        "Description": Match.string_like_regexp("kubectl"), "VpcConfig": Match.object_like({
            "SubnetIds": Match.any_value()})})


def test_private_endpoint_has_no_public_access():
    template("socket", "cluster").has_resource_properties("AWS::EKS::Cluster", {
        "ResourcesVpcConfig": Match.object_like({"EndpointPublicAccess": False, "EndpointPrivateAccess": True})})


def test_control_plane_logging_all_types():
    template("default", "cluster").has_resource_properties("AWS::EKS::Cluster", {"Logging": {"ClusterLogging": {
        "EnabledTypes": Match.array_equals([{"Type": t} for t in
                                            ("api", "audit", "authenticator", "controllerManager", "scheduler")])}}})


def test_secrets_envelope_encrypted_with_a_rotating_kms_key():
    t = template("default", "cluster")
    t.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})
    t.has_resource_properties("AWS::EKS::Cluster", {"EncryptionConfig": [
        {"Provider": {"KeyArn": Match.any_value()}, "Resources": ["secrets"]}]})


def test_access_entry_grants_cluster_admin_to_the_file_role():
    template("alt", "cluster").has_resource_properties("AWS::EKS::AccessEntry", {
        "PrincipalArn": ADMIN_ROLE, "AccessPolicies": [Match.object_like({"AccessScope": {"Type": "cluster"}})]})
    (entry,) = [r for r in resources("alt", "cluster", "AWS::EKS::AccessEntry").values()
                if r["Properties"]["PrincipalArn"] == ADMIN_ROLE]
    assert ":cluster-access-policy/AmazonEKSClusterAdminPolicy" in json.dumps(entry["Properties"]["AccessPolicies"])


def test_no_admin_access_entry_without_a_role_in_the_file():
    entries = resources("default", "cluster", "AWS::EKS::AccessEntry").values()
    assert all(ADMIN_ROLE != e["Properties"]["PrincipalArn"] for e in entries)
    # Only the kubectl provider's own entry remains.
    assert len(entries) == 1


def test_managed_addons():
    names = {r["Properties"]["AddonName"] for r in resources("default", "cluster", "AWS::EKS::Addon").values()}
    assert names == {"vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent", "eks-node-monitoring-agent"}


def test_cloudwatch_observability_addon_is_optional_and_bound_by_pod_identity():
    names = {r["Properties"]["AddonName"] for r in resources("alt", "cluster", "AWS::EKS::Addon").values()}
    assert "amazon-cloudwatch-observability" in names
    template("alt", "cluster").has_resource_properties("AWS::EKS::PodIdentityAssociation", {
        "Namespace": "amazon-cloudwatch", "ServiceAccount": "cloudwatch-agent"})


def test_nodes_wait_for_the_networking_addons():
    addon_ids = {r["Properties"]["AddonName"]: k for k, r in resources("default", "cluster", "AWS::EKS::Addon").items()}
    for nodegroup in resources("default", "cluster", "AWS::EKS::Nodegroup").values():
        assert {addon_ids["vpc-cni"], addon_ids["kube-proxy"]} <= set(nodegroup["DependsOn"])


# ---- 3. system node group -----------------------------------------------------------------------

def test_system_node_group_from_the_file_and_labelled_for_the_head():
    system = synth("default").config.cluster.system_nodes
    template("default", "cluster").has_resource_properties("AWS::EKS::Nodegroup", {
        "InstanceTypes": [system.instance_type],
        "ScalingConfig": {"MinSize": system.nodes, "DesiredSize": system.nodes, "MaxSize": system.nodes},
        "DiskSize": Match.absent(),  # in its launch template (tests/test_security_stacks.py)
        "LaunchTemplate": Match.object_like({"Id": Match.any_value()}),
        "Labels": {ROLE_LABEL: "system"},
        "Taints": Match.absent(),
    })


# ---- 4. GPU node groups -------------------------------------------------------------------------

def test_one_gpu_node_group_per_worker_group():
    assert set(gpu_nodegroups("alt")) == {g.name for g in synth("alt").config.cluster.worker_groups}


def test_gpu_node_group_uses_al2023_nvidia_ami():
    assert {ng["AmiType"] for ng in gpu_nodegroups("default").values()} == {"AL2023_x86_64_NVIDIA"}


def test_g6_12xlarge_has_one_efa_interface_on_card_0():
    data = launch_template_data("default", "gpu")
    assert data["InstanceType"] == "g6.12xlarge"
    (nic,) = data["NetworkInterfaces"]
    assert (nic["InterfaceType"], nic["DeviceIndex"], nic["NetworkCardIndex"]) == ("efa", 0, 0)


def test_p5_48xlarge_has_32_efa_devices_one_per_network_card():
    nics = launch_template_data("p5", "h100")["NetworkInterfaces"]
    efa = [n for n in nics if n["InterfaceType"] != "interface"]
    assert len(efa) == 32 and sorted(n["NetworkCardIndex"] for n in efa) == list(range(32))


def test_efa_interfaces_carry_cluster_and_self_referencing_efa_security_groups():
    nic = launch_template_data("default", "gpu")["NetworkInterfaces"][0]
    cluster_sg, efa_sg = nic["Groups"]
    eks_cluster, attribute = cluster_sg["Fn::GetAtt"]
    assert attribute == "ClusterSecurityGroupId"
    assert synth("default").templates["cluster"]["Resources"][eks_cluster]["Type"] == "AWS::EKS::Cluster"
    sg_id = efa_sg["Fn::GetAtt"][0]
    t = template("default", "cluster")
    for kind, peer in (("AWS::EC2::SecurityGroupIngress", "SourceSecurityGroupId"),
                       ("AWS::EC2::SecurityGroupEgress", "DestinationSecurityGroupId")):
        t.has_resource_properties(kind, {"GroupId": {"Fn::GetAtt": [sg_id, "GroupId"]},
                                         peer: {"Fn::GetAtt": [sg_id, "GroupId"]}, "IpProtocol": "-1"})
    (sg,) = [r for k, r in resources("default", "cluster", "AWS::EC2::SecurityGroup").items() if k == sg_id]
    # No rule to the world: the cluster security group on the same interface carries normal egress.
    assert "0.0.0.0/0" not in json.dumps(sg["Properties"].get("SecurityGroupEgress", []))
    assert "SecurityGroupIngress" not in sg["Properties"]


def test_efa_group_runs_in_a_cluster_placement_group():
    t = template("default", "cluster")
    t.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
    assert launch_template_data("default", "gpu")["Placement"]["GroupName"]["Ref"].startswith("Workersgpu")


def test_gpu_node_group_sits_in_one_subnet_in_the_gpu_az():
    config = synth("default").config
    (subnet_ref,) = gpu_nodegroups("default")["gpu"]["Subnets"]
    export = subnet_ref["Fn::ImportValue"].split(":")[1]
    network = synth("default").templates["network"]
    (logical,) = [o["Value"]["Ref"] for o in network["Outputs"].values()
                  if o.get("Export", {}).get("Name", "").endswith(export)]
    assert network["Resources"][logical]["Properties"]["AvailabilityZone"] == config.gpu_availability_zone
    assert network["Resources"][logical]["Properties"]["MapPublicIpOnLaunch"] is False


def test_root_volume_encrypted_gp3_sized_from_the_file():
    (mapping,) = launch_template_data("default", "gpu")["BlockDeviceMappings"]
    group = synth("default").config.cluster.worker_groups[0]
    assert mapping["Ebs"] == {"VolumeSize": group.disk_gib, "VolumeType": "gp3", "Encrypted": True,
                              "DeleteOnTermination": True}


def test_imdsv2_required():
    assert launch_template_data("default", "gpu")["MetadataOptions"]["HttpTokens"] == "required"


def test_user_data_puts_containerd_on_nvme_raid0():
    text = user_data("default", "gpu")
    assert "kind: NodeConfig" in text and "strategy: RAID0" in text
    assert "Content-Type: application/node.eks.aws" in text


def test_efa_user_data_reserves_the_derived_hugepages():
    config = synth("default").config
    pages = config.nvidia_nodes_hugepages(config.cluster.worker_groups[0])
    assert pages > 0 and f"vm.nr_hugepages={pages}" in user_data("default", "gpu")


def test_gpu_labels_let_the_device_plugins_schedule():
    labels = gpu_nodegroups("default")["gpu"]["Labels"]
    assert labels[GPU_PRESENT_LABEL] == "true" and labels[EFA_PRESENT_LABEL] == "true"
    assert labels[ROLE_LABEL] == "gpu"


def test_gpu_taint():
    assert gpu_nodegroups("default")["gpu"]["Taints"] == [
        {"Key": GPU_TAINT.key, "Value": GPU_TAINT.value, "Effect": "NO_SCHEDULE"}]


@pytest.mark.parametrize(("variant", "group", "capacity"), [
    ("default", "gpu", "ON_DEMAND"), ("alt", "gpu", "SPOT"), ("p5", "h100", "CAPACITY_BLOCK")])
def test_capacity_type_from_the_file(variant, group, capacity):
    assert gpu_nodegroups(variant)[group]["CapacityType"] == capacity


def test_capacity_block_targets_the_reservation():
    data = launch_template_data("p5", "h100")
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"]["CapacityReservationTarget"]["CapacityReservationId"] == \
        synth("p5").config.cluster.worker_groups[0].capacity_reservation_id


def test_scaling_min_desired_max_from_the_file():
    assert gpu_nodegroups("alt")["gpu"]["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 2, "MaxSize": 4}
    assert gpu_nodegroups("alt")["gpu-b"]["ScalingConfig"] == {"MinSize": 1, "DesiredSize": 1, "MaxSize": 1}


def test_socket_group_has_no_efa_interface_placement_group_or_rdma_settings():
    data = launch_template_data("socket", "gpu")
    assert "NetworkInterfaces" not in data and "Placement" not in data
    assert "nr_hugepages" not in user_data("socket", "gpu")
    template("socket", "cluster").resource_count_is("AWS::EC2::PlacementGroup", 0)
    assert EFA_PRESENT_LABEL not in gpu_nodegroups("socket")["gpu"]["Labels"]


# ---- 5. Helm add-ons ----------------------------------------------------------------------------

def tolerates_the_gpu_node_groups(tolerations: list[dict], variant: str = "default") -> bool:
    """Whether one of `tolerations` matches the taint every GPU node group carries in the template."""
    effects = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
    taints = [taint for ng in gpu_nodegroups(variant).values() for taint in ng["Taints"]]
    assert taints
    return all(any(t["key"] == taint["Key"] and t["effect"] == effects[taint["Effect"]]
                   and (t["operator"] == "Exists" or t.get("value") == taint["Value"]) for t in tolerations)
               for taint in taints)


def test_nvidia_device_plugin_pinned():
    props = helm_chart("default", "nvidia-device-plugin")
    assert (props["Version"], props["Repository"]) == ("0.20.0", "https://nvidia.github.io/k8s-device-plugin")
    values = json.loads(props["Values"])
    assert values["nodeSelector"] == {GPU_PRESENT_LABEL: "true"}
    assert tolerates_the_gpu_node_groups(values["tolerations"])


def test_efa_device_plugin_tolerates_gpus_and_selects_efa_nodes():
    props = helm_chart("default", "aws-efa-k8s-device-plugin")
    assert props["Repository"] == "https://aws.github.io/eks-charts"
    # v0.5.30: the newest in the eks-charts index (see stacks/versions.py); v0.5.32 was never published.
    assert props["Version"] == "v0.5.30"
    values = json.loads(props["Values"])
    assert values["nodeSelector"] == {EFA_PRESENT_LABEL: "true"}
    assert tolerates_the_gpu_node_groups(values["tolerations"])
    assert "g6.12xlarge" in values["supportedInstanceLabels"]["values"]


def test_no_efa_device_plugin_with_socket_transport():
    charts = {r["Properties"]["Chart"] for r in resources("socket", "cluster", "Custom::AWSCDK-EKS-HelmChart").values()}
    assert charts == {"nvidia-device-plugin", "kuberay-operator", "cluster-autoscaler", "kube-prometheus-stack",
                      "dcgm-exporter"}


def test_kuberay_operator_pinned_with_crds_on_system_nodes():
    props = helm_chart("default", "kuberay-operator")
    assert props["Version"] == synth("default").config.ray.kuberay_version == "1.7.0"
    assert props["Repository"] == "https://ray-project.github.io/kuberay-helm/"
    assert props.get("SkipCrds", False) is False
    assert json.loads(props["Values"])["nodeSelector"] == {ROLE_LABEL: "system"}


def test_operators_install_after_nodes_and_dns_they_run_on():
    cluster = synth("default").templates["cluster"]["Resources"]
    system_ng = next(k for k, r in cluster.items() if r["Type"] == "AWS::EKS::Nodegroup"
                     and r["Properties"]["Labels"].get(ROLE_LABEL) == "system")
    coredns = next(k for k, r in cluster.items() if r["Type"] == "AWS::EKS::Addon"
                   and r["Properties"]["AddonName"] == "coredns")
    assert system_ng in cluster[coredns]["DependsOn"]
    for chart in resources("default", "cluster", "Custom::AWSCDK-EKS-HelmChart").values():
        assert {system_ng, coredns} <= set(chart["DependsOn"])


# ---- 6. storage and identity --------------------------------------------------------------------

def test_bucket_encrypted_private_versioned():
    template("default", "storage").has_resource_properties("AWS::S3::Bucket", {
        "BucketEncryption": {"ServerSideEncryptionConfiguration": [
            {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]},
        "PublicAccessBlockConfiguration": {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                                           "IgnorePublicAcls": True, "RestrictPublicBuckets": True},
        "VersioningConfiguration": {"Status": "Enabled"},
    })


def test_bucket_policy_denies_non_tls():
    template("default", "storage").has_resource_properties("AWS::S3::BucketPolicy", {"PolicyDocument": {
        "Statement": Match.array_with([Match.object_like({
            "Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})])}})


def test_lifecycle_expires_old_checkpoints_only_and_superseded_versions():
    storage = synth("default").config.storage
    template("default", "storage").has_resource_properties("AWS::S3::Bucket", {"LifecycleConfiguration": {"Rules":
        Match.array_with([
            Match.object_like({"NoncurrentVersionExpiration": {"NoncurrentDays": storage.noncurrent_days},
                               "Prefix": Match.absent()}),
            Match.object_like({"Prefix": storage.checkpoint_prefix, "ExpirationInDays": storage.checkpoint_expiry_days,
                               "Status": "Enabled"}),
        ])}})
    assert not storage.export_prefix.startswith(storage.checkpoint_prefix)


@pytest.mark.parametrize(("variant", "policy"), [("default", "Retain"), ("alt", "Delete")])
def test_bucket_removal_policy_from_the_file(variant, policy):
    template(variant, "storage").has_resource("AWS::S3::Bucket", {"DeletionPolicy": policy})


def test_bucket_name_from_the_file_pattern():
    (bucket,) = resources("default", "storage", "AWS::S3::Bucket").values()
    assert bucket["Properties"]["BucketName"] == {"Fn::Join": ["", ["ray-efa-ckpt-", {"Ref": "AWS::AccountId"},
                                                                    "-us-east-2"]]}


def test_ray_service_account_bound_by_pod_identity():
    ray = synth("default").config.ray
    template("default", "storage").has_resource_properties("AWS::EKS::PodIdentityAssociation", {
        "Namespace": ray.namespace, "ServiceAccount": ray.service_account,
        "ClusterName": {"Fn::ImportValue": Match.string_like_regexp("ray-efa-cluster:")}})
    template("default", "storage").has_resource_properties("AWS::IAM::Role", {"AssumeRolePolicyDocument": {
        "Statement": [Match.object_like({"Action": ["sts:AssumeRole", "sts:TagSession"],
                                         "Principal": {"Service": "pods.eks.amazonaws.com"}})]}})


def test_pod_role_reaches_only_the_bucket_prefix():
    prefix = synth("default").config.storage.prefix
    (policy,) = resources("default", "storage", "AWS::IAM::Policy").values()
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    bucket = next(iter(resources("default", "storage", "AWS::S3::Bucket")))
    for st in statements:
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        assert all(a.startswith("s3:") and "*" not in a for a in actions)
        resource = json.dumps(st["Resource"])
        assert bucket in resource
        if "s3:GetObject" in actions:
            assert resource.endswith(f'"/{prefix}/*"]]}}') or f"/{prefix}/*" in resource
        if "s3:ListBucket" in actions:
            # IfExists: HeadBucket carries no s3:prefix and must not be denied (apache/arrow#49949).
            assert st["Condition"] == {"StringLikeIfExists": {"s3:prefix": [prefix, f"{prefix}/*"]}}
    assert not resources("default", "storage", "AWS::IAM::ManagedPolicy")


# ---- 7. outputs ---------------------------------------------------------------------------------

def test_outputs():
    config = synth("default").config
    cluster = template("default", "cluster")
    cluster.has_output("ClusterName", {"Value": {"Ref": Match.string_like_regexp("^Cluster")}})
    cluster.has_output("UpdateKubeconfigCommand", {"Value": {"Fn::Join": ["", [
        f"aws eks update-kubeconfig --region {config.region} --name ", {"Ref": Match.any_value()}]]}})
    cluster.has_output("GpuAvailabilityZone", {"Value": config.gpu_availability_zone})
    storage = template("default", "storage")
    storage.has_output("BucketName", {"Value": {"Ref": Match.any_value()}})
    storage.has_output("RayNamespace", {"Value": config.ray.namespace})
    storage.has_output("RayServiceAccount", {"Value": config.ray.service_account})


def test_user_data_is_valid_mime_for_nodeadm():
    # EKS merges its own part into ours; it only accepts a well-formed multipart/mixed document.
    import email

    message = email.message_from_string(user_data("p5", "h100"))
    assert message.is_multipart()
    types = [part.get_content_type() for part in message.walk()][1:]
    assert types == ["application/node.eks.aws", "text/x-shellscript"]
    assert set(launch_template_data("p5", "h100")["UserData"]) == {"Fn::Base64"}  # EC2 takes it base64-encoded


# ---- refusals -----------------------------------------------------------------------------------

def test_public_only_endpoint_cannot_be_narrowed(tmp_path):
    from config import ConfigError
    from tests.helpers import load_variant

    with pytest.raises(ConfigError, match=r"cluster\.public_access_cidrs: a public-only endpoint"):
        load_variant(tmp_path, {"cluster": {"endpoint_access": "public", "public_access_cidrs": PUBLIC_CIDRS}})
