"""Security settings in the synthesized CloudFormation (issue 12): network-policy enforcement in the VPC
CNI, IMDS hop limits, the system node group's launch template, the Pod Identity trust conditions and
the read-only grants for an s3:// model and dataset.

`default` has CloudWatch observability off and no S3 inputs; `alt` (tests/stack_synth.py) has the
CloudWatch add-on on and reads its model and dataset from S3.
"""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match

from config.k8s import ROLE_LABEL
from stacks.launch_template import IMDS_HOP_LIMIT, cloudwatch_agent_on_host_network
from tests.stack_synth import synth
from tests.test_stacks import resources, template

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)


def _launch_templates(variant: str) -> dict[str, dict]:
    return {k: r["Properties"]["LaunchTemplateData"]
            for k, r in resources(variant, "cluster", "AWS::EC2::LaunchTemplate").items()}


def _system_nodegroup(variant: str) -> dict:
    (group,) = [r["Properties"] for r in resources(variant, "cluster", "AWS::EKS::Nodegroup").values()
                if r["Properties"]["Labels"].get(ROLE_LABEL) == "system"]
    return group


def _role(variant: str, stack: str, name_part: str) -> dict:
    (role,) = [r["Properties"] for k, r in resources(variant, stack, "AWS::IAM::Role").items() if name_part in k]
    return role


def _pod_role_statements(variant: str) -> list[dict]:
    (policy,) = [r["Properties"] for r in resources(variant, "storage", "AWS::IAM::Policy").values()
                 if "RayPodRole" in json.dumps(r["Properties"]["Roles"])]
    return policy["PolicyDocument"]["Statement"]


def _text(value) -> str:
    """A CloudFormation value with `{"Ref": "AWS::Partition"}` written as `aws`, joined."""
    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join(_text(p) for p in parts)
    if value == {"Ref": "AWS::Partition"}:
        return "aws"
    return value if isinstance(value, str) else json.dumps(value)


@pytest.mark.parametrize("variant", ["default", "alt"])
def test_vpc_cni_enforces_network_policies(variant):
    template(variant, "cluster").has_resource_properties("AWS::EKS::Addon", {
        "AddonName": "vpc-cni",
        "ConfigurationValues": Match.serialized_json({"enableNetworkPolicy": "true"})})


def test_only_the_vpc_cni_and_the_node_monitoring_agent_are_configured():
    """The agent's configuration only adds the GPU taint toleration to dcgm-server (tests/test_node_health.py)."""
    configured = {r["Properties"]["AddonName"] for r in resources("default", "cluster", "AWS::EKS::Addon").values()
                  if "ConfigurationValues" in r["Properties"]}
    assert configured == {"vpc-cni", "eks-node-monitoring-agent"}


@pytest.mark.parametrize("variant", ["default", "alt", "p5", "socket"])
def test_imds_hop_limit_is_one_unless_the_pinned_cloudwatch_agent_runs_in_a_pod(variant):
    config = synth(variant).config
    in_pod = config.cluster.cloudwatch_observability and not cloudwatch_agent_on_host_network(
        config.cluster.kubernetes_version)
    templates = _launch_templates(variant)
    # Every node group has a launch template of its own: the system one and one per worker group.
    assert len(templates) == 1 + len(config.cluster.worker_groups)
    for data in templates.values():
        assert data["MetadataOptions"] == {"HttpTokens": "required", "HttpPutResponseHopLimit": 2 if in_pod else 1,
                                           "HttpEndpoint": "enabled"}


@pytest.mark.parametrize(("pin", "host_network"), [("v1.9.0-eksbuild.1", False), ("v2.0.0-eksbuild.1", True),
                                                    ("v4.10.3-eksbuild.1", True), ("v6.2.0-eksbuild.1", True)])
def test_cloudwatch_agent_on_host_network_from_chart_2_0(monkeypatch, pin, host_network):
    import stacks.versions as versions

    monkeypatch.setitem(versions.MANAGED_ADDON_VERSIONS, "1.34",
                        {**versions.MANAGED_ADDON_VERSIONS["1.34"], "amazon-cloudwatch-observability": pin})
    assert cloudwatch_agent_on_host_network("1.34") is host_network


def test_default_hop_limit_keeps_pods_off_imds():
    assert IMDS_HOP_LIMIT == 1


def test_system_node_group_has_its_own_launch_template_with_disk_and_cluster_sg():
    group = _system_nodegroup("default")
    system = synth("default").config.cluster.system_nodes
    logical = group["LaunchTemplate"]["Id"]["Ref"]
    data = _launch_templates("default")[logical]
    assert "DiskSize" not in group  # EKS refuses a disk size beside a launch template
    assert data["BlockDeviceMappings"] == [{"DeviceName": "/dev/xvda", "Ebs": {
        "VolumeSize": system.disk_gib, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True,
        "Throughput": 600}}]
    (cluster_id,) = resources("default", "cluster", "AWS::EKS::Cluster")
    assert data["SecurityGroupIds"] == [{"Fn::GetAtt": [cluster_id, "ClusterSecurityGroupId"]}]
    assert group["LaunchTemplate"]["Version"] == {"Fn::GetAtt": [logical, "LatestVersionNumber"]}


def test_pod_identity_trust_is_pinned_to_cluster_namespace_and_service_account():
    ray = synth("default").config.ray
    role = _role("default", "storage", "RayPodRole")
    (statement,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert statement["Action"] == ["sts:AssumeRole", "sts:TagSession"]
    equals = statement["Condition"]["StringEquals"]
    assert equals["aws:SourceAccount"] == {"Ref": "AWS::AccountId"}
    assert equals["aws:RequestTag/kubernetes-namespace"] == ray.namespace
    assert equals["aws:RequestTag/kubernetes-service-account"] == ray.service_account
    # The cluster's ARN (GetAtt Arn of the AWS::EKS::Cluster), exported by the cluster stack.
    (cluster_id,) = resources("default", "cluster", "AWS::EKS::Cluster")
    export = equals["aws:RequestTag/eks-cluster-arn"]["Fn::ImportValue"]
    (output,) = [o for o in synth("default").templates["cluster"]["Outputs"].values()
                 if o.get("Export", {}).get("Name") == export]
    assert output["Value"] == {"Fn::GetAtt": [cluster_id, "Arn"]}


@pytest.mark.parametrize(("variant", "role_part", "namespace", "service_account"), [
    ("default", "ClusterAutoscalerRole", "kube-system", "cluster-autoscaler"),
    ("alt", "CloudWatchAgentRole", "amazon-cloudwatch", "cloudwatch-agent"),
])
def test_add_on_pod_identity_roles_are_pinned_too(variant, role_part, namespace, service_account):
    (statement,) = _role(variant, "cluster", role_part)["AssumeRolePolicyDocument"]["Statement"]
    equals = statement["Condition"]["StringEquals"]
    assert equals["aws:SourceAccount"] == {"Ref": "AWS::AccountId"}
    assert equals["aws:RequestTag/kubernetes-namespace"] == namespace
    assert equals["aws:RequestTag/kubernetes-service-account"] == service_account
    (cluster_id,) = resources(variant, "cluster", "AWS::EKS::Cluster")
    assert equals["aws:RequestTag/eks-cluster-arn"] == {"Fn::GetAtt": [cluster_id, "Arn"]}


def test_no_reads_outside_the_job_prefix_without_s3_inputs():
    sids = {st.get("Sid") for st in _pod_role_statements("default")}
    assert sids == {"ObjectsUnderPrefix", "ListPrefixOnly", "BucketRegion"}


@pytest.mark.parametrize(("field", "bucket", "key"), [("model", "my-models", "qwen/Qwen2.5-1.5B"),
                                                      ("dataset", "my-data", "alpaca/train.jsonl")])
def test_s3_model_and_dataset_get_read_only_grants_scoped_to_their_prefix(field, bucket, key):
    assert getattr(synth("alt").config.job, field) == f"s3://{bucket}/{key}"
    by_sid = {st["Sid"]: st for st in _pod_role_statements("alt")}
    read, listing = by_sid[f"ReadJob{field.capitalize()}"], by_sid[f"ListJob{field.capitalize()}"]
    assert read["Action"] == "s3:GetObject"
    assert sorted(_text(r) for r in read["Resource"]) == [f"arn:aws:s3:::{bucket}/{key}",
                                                          f"arn:aws:s3:::{bucket}/{key}/*"]
    assert listing["Action"] == "s3:ListBucket"
    assert _text(listing["Resource"]) == f"arn:aws:s3:::{bucket}"
    assert listing["Condition"] == {"StringLike": {"s3:prefix": [key, f"{key}/*"]}}


def test_s3_input_grants_are_read_only():
    extra = [st for st in _pod_role_statements("alt") if st["Sid"].startswith(("ReadJob", "ListJob"))]
    assert len(extra) == 4
    assert {st["Action"] for st in extra} == {"s3:GetObject", "s3:ListBucket"}


def _checkov_skips(variant: str) -> dict[tuple[str, str], str]:
    """(resource type, logical id) -> {check: reason} from Metadata.checkov.skip, every stack."""
    found = {}
    for template_ in synth(variant).templates.values():
        for logical, res in template_["Resources"].items():
            for skip in ((res.get("Metadata") or {}).get("checkov") or {}).get("skip", []):
                assert skip["comment"].strip(), (logical, skip)
                found.setdefault((res["Type"], logical), set()).add(skip["id"])
    return found


@pytest.mark.parametrize("variant", ["default", "alt"])
def test_checkov_acknowledgments_are_scoped_and_explained(variant):
    skips = _checkov_skips(variant)
    by_type = {}
    for (kind, _), checks in skips.items():
        by_type.setdefault(kind, set()).update(checks)
    assert by_type["AWS::S3::Bucket"] == {"CKV_AWS_18"}
    assert by_type["AWS::Logs::LogGroup"] == {"CKV_AWS_158"}
    # Only CDK's own Lambdas (the kubectl provider; the one that empties the VPC's default security group, from
    # @aws-cdk/aws-ec2:restrictDefaultSecurityGroup; with removal_policy: destroy the auto-delete provider).
    lambdas = [logical for kind, logical in skips if kind == "AWS::Lambda::Function"]
    cdk_own = ("KubectlProvider", "AutoDelete", "VpcRestrictDefaultSG")
    assert lambdas and all(any(part in name for part in cdk_own) for name in lambdas)
    # Every Lambda in the templates is CDK's and carries its acknowledgments (none is left to fail checkov).
    functions = {logical for t in synth(variant).templates.values() for logical, res in t["Resources"].items()
                 if res["Type"] == "AWS::Lambda::Function"}
    assert functions == set(lambdas)
    assert set(by_type) == {"AWS::S3::Bucket", "AWS::Logs::LogGroup", "AWS::Lambda::Function"}
