"""The EC2 target's stack: what Ray's cluster launcher (`ray up`) cannot make for an EFA cluster.

A cluster placement group in the GPU AZ, one security group open to itself (EFA's SRD and Ray's
ports), the head's and the workers' instance profiles with least privilege, the Ray token in Secrets
Manager, and the current AL2023 GPU DLAMI resolved from its public SSM parameter. The VPC comes from
the network stack and the bucket from the storage stack (deployed without the EKS cluster). The
launcher YAML is rendered from this stack's outputs by `python -m ops.launcher render`.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from config import ClusterConfig
from config.ec2 import DLAMI_SSM_PARAMETER, HEAD_AMI_SSM_PARAMETER, RAY_CLUSTER_TAG, STACK_OUTPUTS
from stacks.nag import acknowledge, checkov_skip, finding_partition, managed_policy
from stacks.storage import grant_job_access

# Ray's default key pair name is `ray-autoscaler_<region>` (ray/autoscaler/_private/aws/config.py key_pair,
# ray 2.58.0); `ray up` creates it from the user's machine, the head only names it in RunInstances.
_KEY_PAIR_PATTERN = "ray-autoscaler_*"


class Ec2ClusterStack(cdk.Stack):
    """Placement group, security group, instance profiles and token secret for a `ray up` cluster."""

    def __init__(self, scope: Construct, id: str, *, config: ClusterConfig, vpc: ec2.IVpc, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        name = config.cluster.name
        self.cluster_name = name
        az = config.gpu_availability_zone
        # The network stack's GPU subnet (it outputs it as GpuSubnetId for the launcher YAML).
        self.subnet_id = vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                                            availability_zones=[az]).subnet_ids[0]

        self.placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")
        self.security_group = ec2.SecurityGroup(
            self, "NodeSecurityGroup", vpc=vpc, allow_all_outbound=False,
            description=f"{name} Ray nodes: all traffic among themselves (EFA SRD, Ray), HTTPS out")
        # EFA's SRD transport needs every protocol open within the group, both directions; Ray's GCS,
        # object manager and the head's SSH to the workers ride on the same rule.
        self.security_group.add_ingress_rule(self.security_group, ec2.Port.all_traffic(), "EFA and Ray: group members")
        self.security_group.add_egress_rule(self.security_group, ec2.Port.all_traffic(), "EFA and Ray: group members")
        # Image pulls (ECR Public), pip, S3 and Secrets Manager, SSM Session Manager: all HTTPS through the NAT
        # gateway or the S3 gateway endpoint. DNS and NTP go to the VPC resolver, which security groups never filter.
        self.security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS: images, pip, AWS APIs")
        if config.ec2.access == "ssh":
            self.security_group.add_ingress_rule(ec2.Peer.ipv4(config.network.vpc_cidr), ec2.Port.tcp(22),
                                                 "ray up over SSH from inside the VPC only")

        self.image = ec2.MachineImage.from_ssm_parameter(DLAMI_SSM_PARAMETER, os=ec2.OperatingSystemType.LINUX)
        self.image_id = self.image.get_image(self).image_id
        # The head trains nothing: plain AL2023, not the GPU DLAMI (config/ec2.py HEAD_AMI_SSM_PARAMETER).
        self.head_image_id = ec2.MachineImage.from_ssm_parameter(
            HEAD_AMI_SSM_PARAMETER, os=ec2.OperatingSystemType.LINUX).get_image(self).image_id

        self.secret: secretsmanager.Secret | None = None
        if config.ray.auth == "token":
            self.secret = secretsmanager.Secret(
                self, "RayAuthToken", description=f"{name}: Ray token (RAY_AUTH_TOKEN) of the head, workers and users",
                generate_secret_string=secretsmanager.SecretStringGenerator(exclude_punctuation=True,
                                                                            password_length=64))
            acknowledge(self.secret, "AwsSolutions-SMG4",
                        "The Ray token lives as long as the cluster; rotating it would need every Ray process "
                        "restarted, so it is replaced by recreating the stack (docs/ec2.md).")
            checkov_skip(self.secret, "CKV_AWS_149",
                         "Encrypted with Secrets Manager's AWS-managed key; only this stack's two instance roles may "
                         "read it (GetSecretValue on this ARN), which a customer-managed key's policy would repeat.")

        bucket = s3.Bucket.from_bucket_name(self, "CheckpointBucket", config.bucket_name(cdk.Aws.ACCOUNT_ID))
        self.worker_role = self._node_role("WorkerRole", f"{name} Ray workers: checkpoint prefix, Ray token",
                                           config=config, bucket=bucket)
        self.head_role = self._node_role("HeadRole", f"{name} Ray head: launches and ends only {name}'s workers",
                                         config=config, bucket=bucket)
        self._grant_autoscaler(config)
        if config.ec2.access == "ssm":
            self.head_role.add_managed_policy(iam.ManagedPolicy.from_aws_managed_policy_name(
                "AmazonSSMManagedInstanceCore"))
            acknowledge(self.head_role, managed_policy("AmazonSSMManagedInstanceCore"),
                        "The policy AWS documents for the SSM agent, so `ray up` reaches the head through Session "
                        "Manager with no port open; the head only, never the workers.")
        self.worker_profile = iam.InstanceProfile(self, "WorkerInstanceProfile", role=self.worker_role)
        self.head_profile = iam.InstanceProfile(self, "HeadInstanceProfile", role=self.head_role)

        outputs = {
            "HeadInstanceProfileArn": self.head_profile.instance_profile_arn,
            "WorkerInstanceProfileArn": self.worker_profile.instance_profile_arn,
            "WorkerRoleArn": self.worker_role.role_arn,
            "SecurityGroupId": self.security_group.security_group_id,
            "AvailabilityZone": az,
            "PlacementGroupName": self.placement_group.ref,
            "ImageId": self.image_id,
            "HeadImageId": self.head_image_id,
            "AuthTokenSecretArn": self.secret.secret_arn if self.secret else "none",
            "BucketName": bucket.bucket_name,
            "CheckpointUri": config.checkpoint_uri(bucket.bucket_name),
        }
        for key in STACK_OUTPUTS:
            cdk.CfnOutput(self, key, value=outputs[key])

    def _node_role(self, id: str, description: str, *, config: ClusterConfig, bucket: s3.IBucket) -> iam.Role:
        """An EC2 instance role with the job's S3 access (as the EKS Pod Identity role) and the Ray token."""
        role = iam.Role(self, id, assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"), description=description)
        grant_job_access(role, bucket=bucket, config=config)
        prefix = f"arn:{finding_partition(self)}:s3:::{config.bucket_name('<AWS::AccountId>')}"
        acknowledge(role, f"AwsSolutions-IAM5[Resource::{prefix}/{config.storage.prefix}/*]",
                    "The wildcard is the object keys under the job's own prefix: Ray Train names its checkpoint "
                    "shards at run time, so this is the narrowest grant that lets it write them.")
        for field, location in config.job.s3_sources.items():
            acknowledge(role, f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{location.bucket}/"
                        f"{location.key}/*]",
                        f"Read-only (s3:GetObject) on the objects under job.{field}'s own s3:// prefix.")
        if self.secret is not None:
            self.secret.grant_read(role)
        return role

    @staticmethod
    def _has_spot(config: ClusterConfig) -> bool:
        return any(group.capacity == "spot" for group in config.cluster.worker_groups)

    def _grant_autoscaler(self, config: ClusterConfig) -> None:
        """What Ray's autoscaler on the head calls (ray/autoscaler/_private/aws/node_provider.py, ray 2.58.0:
        describe_instances, create_instances with TagSpecifications, create_tags, terminate_instances), scoped
        to instances tagged ray-cluster-name=<cluster.name>; iam:PassRole for the worker role only."""
        name = self.cluster_name
        arn = f"arn:{cdk.Aws.PARTITION}:ec2:{cdk.Aws.REGION}:{cdk.Aws.ACCOUNT_ID}"
        instances = f"{arn}:instance/*"
        tagged = {"StringEquals": {f"aws:RequestTag/{RAY_CLUSTER_TAG}": name}}
        owned = {"StringEquals": {f"ec2:ResourceTag/{RAY_CLUSTER_TAG}": name}}
        statements = [
            iam.PolicyStatement(sid="Describe", resources=["*"], actions=[
                "ec2:DescribeInstances", "ec2:DescribeInstanceStatus", "ec2:DescribeInstanceTypes",
                "ec2:DescribeImages", "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups", "ec2:DescribeKeyPairs"]),
            # The new instance itself: only with this cluster's tag in the request (Ray always sends it).
            iam.PolicyStatement(sid="LaunchTaggedInstances", actions=["ec2:RunInstances"], resources=[instances],
                                conditions=tagged),
            # What the launch uses or creates alongside: this subnet, group, placement group and AMI only.
            iam.PolicyStatement(sid="LaunchWith", actions=["ec2:RunInstances"], resources=[
                f"{arn}:subnet/{self.subnet_id}",
                f"{arn}:security-group/{self.security_group.security_group_id}",
                f"{arn}:placement-group/{self.placement_group.ref}",
                f"arn:{cdk.Aws.PARTITION}:ec2:{cdk.Aws.REGION}::image/{self.image_id}",
                f"{arn}:key-pair/{_KEY_PAIR_PATTERN}",
                f"{arn}:network-interface/*",
                f"{arn}:volume/*",
                # A spot group's RunInstances (InstanceMarketOptions: spot) also creates a spot instance request,
                # which IAM authorizes as its own resource (EC2 API reference, "Actions, resources, and condition
                # keys for Amazon EC2": RunInstances, spot-instances-request); without it the launch is denied.
                *([f"{arn}:spot-instances-request/*"] if self._has_spot(config) else []),
            ]),
            iam.PolicyStatement(sid="TagOnLaunch", actions=["ec2:CreateTags"], resources=[instances],
                                conditions={"StringEquals": {"ec2:CreateAction": "RunInstances",
                                                             f"aws:RequestTag/{RAY_CLUSTER_TAG}": name}}),
            # Ray rewrites its status tags (ray-node-status, ...) on its own instances; never the cluster tag.
            iam.PolicyStatement(sid="RetagOwnInstances", actions=["ec2:CreateTags"], resources=[instances],
                                conditions={**owned,
                                            "ForAllValues:StringLike": {"aws:TagKeys": ["ray-*", "Name"]},
                                            "ForAllValues:StringNotEquals": {"aws:TagKeys": [RAY_CLUSTER_TAG]}}),
            iam.PolicyStatement(sid="EndOwnInstances", resources=[instances], conditions=owned,
                                actions=["ec2:TerminateInstances", "ec2:StopInstances", "ec2:StartInstances"]),
            iam.PolicyStatement(sid="PassWorkerRoleOnly", actions=["iam:PassRole"],
                                resources=[self.worker_role.role_arn],
                                conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}),
        ]
        for statement in statements:
            self.head_role.add_to_policy(statement)
        acknowledge(self.head_role, "AwsSolutions-IAM5[Resource::*]",
                    "EC2 Describe calls only; none supports resource-level permissions.")
        region = "arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>"
        for resource, why in (
                ("instance/*", "RunInstances only with ray-cluster-name=<cluster> in the request; CreateTags, "
                 "Terminate/Stop/Start only on instances already carrying that tag (aws:RequestTag / "
                 "ec2:ResourceTag conditions): EC2 names instances at launch."),
                (f"key-pair/{_KEY_PAIR_PATTERN}", "Ray's own key pair names (ray-autoscaler_<region>[_N]), "
                 "created by `ray up` on the user's machine."),
                ("network-interface/*", "The EFA and ENA interfaces RunInstances creates for the worker; EC2 names "
                 "them at launch."),
                ("volume/*", "The root volume RunInstances creates for the worker; EC2 names it at launch."),
                *((("spot-instances-request/*", "The spot request RunInstances creates for a spot worker; EC2 "
                    "names it at launch."),) if self._has_spot(config) else ())):
            acknowledge(self.head_role, f"AwsSolutions-IAM5[Resource::{region}:{resource}]", why)
