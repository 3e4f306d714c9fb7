"""cdk-nag (AwsSolutions) and checkov acknowledgments: each scoped to the resource it concerns, each with
its reason.

cdk-nag 3 reports one finding per rule and resource (e.g. one per managed policy), and each must be
acknowledged by its full id; nothing is acknowledged stack-wide. checkov reads `Metadata.checkov.skip`
on the CloudFormation resource itself.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import aws_cdk as cdk
import jsii
from constructs import IConstruct

if TYPE_CHECKING:
    from stacks.cluster import ClusterStack
    from stacks.network import NetworkStack
    from stacks.storage import StorageStack

_PACK = "AwsSolutions"
_NODE_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryReadOnly")


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge one AwsSolutions finding (`rule`, e.g. `AwsSolutions-S1`) on `scope` and below."""
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=f"{_PACK}::{rule}", reason=reason))


def checkov_skip(construct: IConstruct, check: str, reason: str) -> None:
    """Acknowledge checkov's `check` (e.g. `CKV_AWS_18`) on `construct`'s CloudFormation resource."""
    resource = construct if isinstance(construct, cdk.CfnResource) else construct.node.default_child
    skips = (resource.get_metadata("checkov") or {}).get("skip", [])
    resource.add_metadata("checkov", {"skip": [*skips, {"id": check, "comment": reason}]})


def managed_policy(name: str) -> str:
    """The finding id cdk-nag gives an AWS managed policy attached to a role."""
    return f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"


def finding_partition(stack: cdk.Stack) -> str:
    """The partition as cdk-nag writes it in a finding id: a literal (`aws`) where the stack's region is known, as
    `@aws-cdk/core:enablePartitionLiterals` (cdk.json) makes `Stack.partition` render it, else the pseudo parameter."""
    partition = stack.partition
    return "<AWS::Partition>" if cdk.Token.is_unresolved(partition) else partition


def _logical_id(construct: IConstruct) -> str:
    return cdk.Stack.of(construct).get_logical_id(construct.node.default_child)


def acknowledge_findings(*, network: NetworkStack, cluster_stack: ClusterStack | None,
                         storage: StorageStack) -> None:
    """Acknowledge the AwsSolutions findings this design accepts, resource by resource (no cluster: the EC2
    target, whose own stack acknowledges its findings in stacks/ec2.py)."""
    if cluster_stack is not None:
        cluster = cluster_stack.cluster
        acknowledge(cluster.role, managed_policy("AmazonEKSClusterPolicy"),
                    "EKS requires its control-plane role to carry AmazonEKSClusterPolicy; AWS keeps it current "
                    "as EKS needs change.")
        for nodegroup in cluster_stack.nodegroups:
            for policy in _NODE_POLICIES:
                acknowledge(nodegroup.role, managed_policy(policy),
                            f"{policy} is one of the three policies EKS documents for managed node group roles; "
                            "pods get their own AWS access through Pod Identity, not through the node role.")
        _acknowledge_kubectl_provider(cluster_stack)
        if cluster_stack.endpoint_open_to_internet:
            cdk.Validations.of(cluster).acknowledge(cdk.Acknowledgment(
                id=f"{PROJECT_PACK}::{PROJECT_PACK}-EKSPublicEndpoint",
                reason="The variable file opens the API endpoint to the internet on purpose "
                       "(cluster.endpoint_open_to_internet: true); IAM authentication still guards it."))
        _acknowledge_autoscaling(cluster_stack)

        if cluster_stack.node.try_find_child("CloudWatchAgentRole"):
            acknowledge(cluster_stack.cloudwatch_agent_role, managed_policy("CloudWatchAgentServerPolicy"),
                        "The policy AWS documents for the amazon-cloudwatch-observability add-on's agent; bound to "
                        "that agent's service account only, through Pod Identity.")

    access_logs = ("Holds only this job's checkpoints and model exports, written by one role; server access logs "
                   "would need a second bucket for little audit value (use CloudTrail S3 data events if required).")
    if storage.bucket.node.default_child is not None:  # created by the stack (not storage.existing_bucket)
        acknowledge(storage.bucket, "AwsSolutions-S1", access_logs)
        checkov_skip(storage.bucket, "CKV_AWS_18", access_logs)
        bucket_arn = f"<{_logical_id(storage.bucket)}.Arn>"
    else:
        bucket_arn = f"arn:{finding_partition(storage)}:s3:::{storage.bucket_name_for_findings}"
    checkov_skip(network.flow_logs, "CKV_AWS_158",
                 "Rejected-flow records only (addresses and ports, no payload), encrypted at rest by CloudWatch "
                 "Logs; a customer-managed key would add cost and a key policy for metadata of this VPC.")
    if storage.role is not None:  # the Pod Identity role (target: eks)
        acknowledge(storage.role, f"AwsSolutions-IAM5[Resource::{bucket_arn}/{storage.prefix}/*]",
                    "The wildcard is the object keys under the job's own prefix: Ray Train names its checkpoint "
                    "shards at run time, so this is the narrowest grant that lets it write them.")
        for field, location in storage.s3_sources.items():
            acknowledge(storage.role, f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{location.bucket}/"
                        f"{location.key}/*]",
                        f"Read-only (s3:GetObject) on the objects under job.{field}'s own s3:// prefix; the files "
                        "there are only known at run time.")
    _acknowledge_restrict_default_security_group(network)
    auto_delete = storage.node.try_find_child("Custom::S3AutoDeleteObjectsCustomResourceProvider")
    if auto_delete is not None:
        for check in ("CKV_AWS_115", "CKV_AWS_116", "CKV_AWS_117"):
            checkov_skip(auto_delete.node.find_child("Handler"), check,
                         "CDK's bucket auto-delete Lambda (removal_policy: destroy); CDK defines it without reserved "
                         "concurrency, dead-letter queue or VPC, and it runs once, at stack deletion.")
        acknowledge(auto_delete, "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
                    "AWSLambdaBasicExecutionRole]",
                    "CDK's bucket auto-delete provider (removal_policy: destroy) logs through the basic Lambda "
                    "execution policy.")


def _acknowledge_autoscaling(cluster_stack: ClusterStack) -> None:
    """The Cluster Autoscaler's role (only with autoscaling on)."""
    autoscaler = cluster_stack.autoscaler
    if autoscaler is None:
        return
    partition = finding_partition(cluster_stack)
    asg_arn = f"arn:{partition}:autoscaling:{cluster_stack.region}:<AWS::AccountId>:autoScalingGroup:*"
    acknowledge(autoscaler.role, "AwsSolutions-IAM5[Resource::*]",
                "Describe/Get calls only (Auto Scaling groups, instances, tags, scaling activities; EC2 instance "
                "types, images, launch template versions): none supports resource-level permissions.")
    acknowledge(autoscaler.role, f"AwsSolutions-IAM5[Resource::{asg_arn}]",
                "SetDesiredCapacity and TerminateInstanceInAutoScalingGroup on any ASG whose tag "
                "k8s.io/cluster-autoscaler/<this cluster> is 'owned' (an aws:ResourceTag condition); EKS names the "
                "node groups' ASGs at creation, so no name can be written here.")
    acknowledge(autoscaler.role, f"AwsSolutions-IAM5[Resource::arn:{partition}:eks:{cluster_stack.region}:"
                f"<AWS::AccountId>:nodegroup/{autoscaler.cluster_name}/*/*]",
                "eks:DescribeNodegroup on this cluster's node groups only (the wildcards are node group name and "
                "its generated id): the autoscaler reads a group's labels, taints and node-template tags when it "
                "has no node.")


def _acknowledge_restrict_default_security_group(network: NetworkStack) -> None:
    """@aws-cdk/aws-ec2:restrictDefaultSecurityGroup (cdk.json): CDK's custom resource that removes every rule from
    the VPC's default security group (which nothing here uses), through a Lambda CDK defines."""
    provider = network.node.try_find_child("Custom::VpcRestrictDefaultSGCustomResourceProvider")
    if provider is None:
        return
    for check, what in (("CKV_AWS_115", "a reserved concurrency"), ("CKV_AWS_116", "a dead-letter queue"),
                        ("CKV_AWS_117", "a VPC")):
        checkov_skip(provider.node.find_child("Handler"), check,
                     f"CDK's Lambda that empties the VPC's default security group (restrictDefaultSecurityGroup); "
                     f"CDK defines it without {what}; it runs only during deployments, where a failure fails the "
                     "stack update.")


def _acknowledge_kubectl_provider(cluster_stack: ClusterStack) -> None:
    """The kubectl provider is CDK's own Lambda that installs the Helm charts; its IAM is CDK's."""
    provider = cluster_stack.cluster.kubectl_provider
    reason = ("Part of aws_eks_v2's kubectl provider (a CDK-maintained Lambda that runs helm and kubectl); "
              "its execution roles are defined by CDK and scoped by it.")
    for policy in ("service-role/AWSLambdaBasicExecutionRole", "service-role/AWSLambdaVPCAccessExecutionRole",
                   "AmazonEC2ContainerRegistryReadOnly"):
        acknowledge(provider, managed_policy(policy), reason)
    handler = provider.node.find_child("Handler")
    condition = next(c for c in handler.node.children if isinstance(c, cdk.CfnCondition))
    ecr_public = {"Fn::If": [cdk.Stack.of(handler).get_logical_id(condition),
                             {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"},
                                                ":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly"]]},
                             {"Ref": "AWS::NoValue"}]}
    acknowledge(provider, f"AwsSolutions-IAM4[Policy::{json.dumps(ecr_public, separators=(',', ':'))}]", reason)
    acknowledge(provider, f"AwsSolutions-IAM5[Resource::<{_logical_id(handler)}.Arn>:*]",
                "CDK's custom-resource framework invokes any version of the kubectl handler it created.")
    for function in (handler, provider.node.find_child("Provider").node.find_child("framework-onEvent")):
        for check, what in (("CKV_AWS_115", "a reserved concurrency"), ("CKV_AWS_116", "a dead-letter queue"),
                            ("CKV_AWS_173", "a customer-managed key for its environment")):
            checkov_skip(function, check, f"CDK's kubectl provider Lambda (aws_eks_v2); CDK defines it without "
                         f"{what}; it runs only during deployments, where a failure fails the stack update.")
        # With @aws-cdk/aws-lambda:useCdkManagedLogGroup (cdk.json) CDK creates each function's log group itself,
        # with a retention, instead of Lambda creating one that never expires.
        log_group = function.node.try_find_child("LogGroup")
        if log_group is not None:
            checkov_skip(log_group, "CKV_AWS_158",
                         "Log group of CDK's kubectl provider Lambda (helm and kubectl output during deployments), "
                         "encrypted at rest by CloudWatch Logs; CDK creates it without a KMS key, and a key here "
                         "would need a key policy for the Logs service of this one group.")
    acknowledge(handler, "AwsSolutions-L1",
                "CDK picks the handler's Python runtime (the newest it knows for the region) and the kubectl "
                "layer pins the tools; bumping aws-cdk-lib moves it forward.")


# ---- the project's own rules for AWS::EKS::Cluster -------------------------------------------------------------
# cdk-nag's AwsSolutions-EKS1 (public endpoint) and EKS2 (control-plane logging) look only at the custom resource the
# old aws_eks module deploys (`Custom::AWSCDK-EKS-Cluster`), so they never see the `AWS::EKS::Cluster` that
# aws_eks_v2 writes; and no AwsSolutions rule checks secrets encryption. These match the CloudFormation type itself,
# read the properties as the template will carry them, and run wherever AwsSolutionsChecks runs (`cdk synth -c
# nag=true`, and every synthesis in the tests: tests/stack_synth.py).

# EKS's control-plane log types (AWS::EKS::Cluster Logging.ClusterLogging.EnabledTypes[].Type; the CloudFormation
# template reference lists api, audit, authenticator, controllerManager, scheduler).
EKS_LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")


def eks_endpoint_problem(properties: dict) -> str | None:
    """A public endpoint open to every address. EKS's defaults when the template says nothing: public access on,
    PublicAccessCidrs 0.0.0.0/0 (EKS API Reference, VpcConfigRequest: endpointPublicAccess "default value is true",
    publicAccessCidrs "default value is 0.0.0.0/0")."""
    vpc = properties.get("ResourcesVpcConfig", {})
    if vpc.get("EndpointPublicAccess", True) is False:
        return None
    cidrs = vpc.get("PublicAccessCidrs") or ["0.0.0.0/0"]
    if any(str(c).endswith("/0") for c in cidrs):
        return "the public API endpoint accepts every address (PublicAccessCidrs 0.0.0.0/0 or unset)"
    return None


def eks_logging_problem(properties: dict) -> str | None:
    """Every control-plane log type enabled."""
    types = properties.get("Logging", {}).get("ClusterLogging", {}).get("EnabledTypes", [])
    missing = [t for t in EKS_LOG_TYPES if t not in {entry.get("Type") for entry in types if isinstance(entry, dict)}]
    return f"control-plane log types not enabled: {', '.join(missing)}" if missing else None


def eks_secrets_problem(properties: dict) -> str | None:
    """Kubernetes Secrets envelope-encrypted with a KMS key (EncryptionConfig with Resources [secrets])."""
    for entry in properties.get("EncryptionConfig", []) or []:
        if "secrets" in (entry.get("Resources") or []) and (entry.get("Provider") or {}).get("KeyArn"):
            return None
    return "Kubernetes Secrets are not envelope-encrypted with a KMS key (no EncryptionConfig for secrets)"


CLUSTER_RULES = {
    "EKSPublicEndpoint": (eks_endpoint_problem, "The EKS API endpoint is open to the internet.",
                          "Set cluster.endpoint_access: private, or public_and_private with public_access_cidrs "
                          "naming your addresses."),
    "EKSControlPlaneLogging": (eks_logging_problem, "EKS control-plane logging is incomplete.",
                               "Enable api, audit, authenticator, controllerManager and scheduler logs."),
    "EKSSecretsEncryption": (eks_secrets_problem, "EKS Secrets are not encrypted with a KMS key.",
                             "Set EncryptionConfig with Resources [secrets] and a KMS key."),
}
PROJECT_PACK = "RayEfa"


def cluster_properties(node: cdk.CfnResource) -> dict:
    """The resource's properties as CloudFormation names them, resolved (L1 attributes; not raw overrides)."""
    return cdk.Stack.of(node).resolve(node._render_properties(node._cfn_properties))


def _make_rule(node: cdk.CfnResource, name: str):
    """cdk-nag's IApplyRule for rule `name` on `node` (jsii reads its members as properties)."""
    from cdk_nag import IApplyRule, NagMessageLevel, NagRuleCompliance

    check, info, explanation = CLUSTER_RULES[name]

    @jsii.implements(IApplyRule)
    class Rule:
        node = property(lambda self: node)
        info = property(lambda self: info)
        explanation = property(lambda self: explanation)
        level = property(lambda self: NagMessageLevel.ERROR)
        rule_suffix_override = property(lambda self: name)

        def rule(self, target: cdk.CfnResource):
            if target.cfn_resource_type != "AWS::EKS::Cluster":
                return NagRuleCompliance.NOT_APPLICABLE
            problem = check(cluster_properties(target))
            return NagRuleCompliance.NON_COMPLIANT if problem else NagRuleCompliance.COMPLIANT

    return Rule()


def project_checks(scope: IConstruct):
    """The project's NagPack ("RayEfa"): the three AWS::EKS::Cluster rules above."""
    from cdk_nag import NagPack

    class ProjectChecks(NagPack):
        def __init__(self, scope):
            super().__init__(scope)
            self._pack_name = PROJECT_PACK

        @property
        def name(self) -> str:
            return PROJECT_PACK

        def _check_resource(self, node: cdk.CfnResource) -> None:
            if node.cfn_resource_type != "AWS::EKS::Cluster":
                return
            for name in CLUSTER_RULES:
                self._apply_rule(_make_rule(node, name))

    return ProjectChecks(scope)
