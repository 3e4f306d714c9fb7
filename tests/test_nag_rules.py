"""The project's own cdk-nag rules for AWS::EKS::Cluster (stacks/nag.py): each fires on a cluster that breaks it, and
none on one that keeps all three. The project's stacks pass them in tests/test_stacks_compliance.py, where every
variant is synthesized with them on."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow  # synthesizes (jsii's Node.js process)

GOOD = {
    "ResourcesVpcConfig": {"SubnetIds": ["subnet-1", "subnet-2"], "EndpointPublicAccess": True,
                           "EndpointPrivateAccess": True, "PublicAccessCidrs": ["203.0.113.7/32"]},
    "Logging": {"ClusterLogging": {"EnabledTypes": [{"Type": t} for t in
                                                    ("api", "audit", "authenticator", "controllerManager",
                                                     "scheduler")]}},
    "EncryptionConfig": [{"Resources": ["secrets"],
                          "Provider": {"KeyArn": "arn:aws:kms:us-east-2:123456789012:key/abcd"}}],
}


def _violations(tmp_path, properties: dict) -> list[str]:
    """Synthesize one AWS::EKS::Cluster (an L1, as a template would carry it) with the project's pack on."""
    import aws_cdk as cdk
    from aws_cdk import aws_eks

    from stacks.nag import project_checks
    from tests.helpers import cdk_app

    app = cdk_app(outdir=str(tmp_path), context={"@aws-cdk/core:validationReportJson": True})
    stack = cdk.Stack(app, "Bad")
    vpc = properties.get("ResourcesVpcConfig", {})
    logging = properties.get("Logging", {}).get("ClusterLogging", {}).get("EnabledTypes")
    aws_eks.CfnCluster(
        stack, "Cluster", role_arn="arn:aws:iam::123456789012:role/eks",
        resources_vpc_config=aws_eks.CfnCluster.ResourcesVpcConfigProperty(
            subnet_ids=vpc["SubnetIds"], endpoint_public_access=vpc.get("EndpointPublicAccess"),
            endpoint_private_access=vpc.get("EndpointPrivateAccess"), public_access_cidrs=vpc.get("PublicAccessCidrs")),
        logging=aws_eks.CfnCluster.LoggingProperty(cluster_logging=aws_eks.CfnCluster.ClusterLoggingProperty(
            enabled_types=[aws_eks.CfnCluster.LoggingTypeConfigProperty(type=t["Type"]) for t in logging]))
        if logging else None,
        encryption_config=[aws_eks.CfnCluster.EncryptionConfigProperty(
            resources=e["Resources"], provider=aws_eks.CfnCluster.ProviderProperty(key_arn=e["Provider"]["KeyArn"]))
            for e in properties.get("EncryptionConfig", [])] or None)
    cdk.Validations.of(app).add_plugins(project_checks(app))
    try:
        app.synth()
    except Exception:  # noqa: BLE001, S110 - jsii raises a generic error for a failed validation; the report says why
        pass
    report = json.loads((tmp_path / "policy-validation-report.json").read_text())
    return sorted(v["ruleName"] for p in report["pluginReports"] for v in p["violations"])


def _with(**changes) -> dict:
    out = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if value is None:
            out.pop(key)
        else:
            out[key] = value
    return out


def test_a_cluster_that_keeps_every_rule_passes(tmp_path):
    assert _violations(tmp_path, GOOD) == []


def test_an_endpoint_open_to_everyone_fires(tmp_path):
    vpc = {**GOOD["ResourcesVpcConfig"], "PublicAccessCidrs": ["0.0.0.0/0"]}
    assert _violations(tmp_path, _with(ResourcesVpcConfig=vpc)) == ["RayEfa-EKSPublicEndpoint"]


def test_an_endpoint_left_at_the_eks_defaults_fires(tmp_path):
    # No EndpointPublicAccess, no PublicAccessCidrs: EKS makes it public to 0.0.0.0/0.
    assert _violations(tmp_path, _with(ResourcesVpcConfig={"SubnetIds": ["subnet-1"]})) == ["RayEfa-EKSPublicEndpoint"]


def test_a_private_endpoint_passes(tmp_path):
    vpc = {"SubnetIds": ["subnet-1"], "EndpointPublicAccess": False, "EndpointPrivateAccess": True}
    assert _violations(tmp_path, _with(ResourcesVpcConfig=vpc)) == []


def test_missing_control_plane_logs_fire(tmp_path):
    logging = {"ClusterLogging": {"EnabledTypes": [{"Type": "api"}, {"Type": "audit"}]}}
    assert _violations(tmp_path, _with(Logging=logging)) == ["RayEfa-EKSControlPlaneLogging"]


def test_unencrypted_secrets_fire(tmp_path):
    assert _violations(tmp_path, _with(EncryptionConfig=None)) == ["RayEfa-EKSSecretsEncryption"]


def test_the_rules_find_the_aws_eks_v2_cluster_by_its_type():
    # aws_eks_v2 writes a plain AWS::EKS::Cluster, which the rules match by CloudFormation type (cdk-nag's
    # AwsSolutions-EKS1/EKS2 look only for the old module's Custom::AWSCDK-EKS-Cluster).
    from stacks.nag import cluster_properties, eks_endpoint_problem, eks_logging_problem, eks_secrets_problem
    from tests.stack_synth import synth

    cluster = synth("default").stacks.cluster.cluster.node.default_child
    assert cluster.cfn_resource_type == "AWS::EKS::Cluster"
    properties = cluster_properties(cluster)
    assert properties["ResourcesVpcConfig"]["EndpointPublicAccess"] is False
    assert [eks_endpoint_problem(properties), eks_logging_problem(properties), eks_secrets_problem(properties)] == \
        [None, None, None]


def test_an_endpoint_the_file_opens_on_purpose_is_acknowledged_with_its_reason(tmp_path):
    from config import load_config
    from stacks import build
    from tests.helpers import cdk_app, write_variant

    path = write_variant(tmp_path, {"cluster": {"endpoint_access": "public_and_private",
                                                "public_access_cidrs": ["0.0.0.0/0"],
                                                "endpoint_open_to_internet": True}})
    out = tmp_path / "out"
    app = cdk_app(outdir=str(out), context={"@aws-cdk/core:validationReportJson": True})
    build(app, load_config(path), nag=True)
    app.synth()  # raises on an unacknowledged finding
    report = json.loads((out / "policy-validation-report.json").read_text())
    assert not [v for p in report["pluginReports"] for v in p["violations"]]
    recorded = "".join(path.read_text() for path in out.glob("*.json"))
    assert "RayEfa-EKSPublicEndpoint" in recorded and "cluster.endpoint_open_to_internet: true" in recorded
