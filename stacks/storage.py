"""The storage stack: the checkpoint bucket and, on EKS, the Ray service account's access to it."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from config import ClusterConfig
from config.model import S3Location, StorageConfig
from stacks.hf_token import grant_hf_token_read
from stacks.pod_identity import pod_identity_principal


def read_statements(field: str, location: S3Location) -> list[iam.PolicyStatement]:
    """Read-only access to exactly `location` (the object itself, or the objects under it as a prefix)."""
    bucket = f"arn:{cdk.Aws.PARTITION}:s3:::{location.bucket}"
    name = field.capitalize()
    return [
        iam.PolicyStatement(sid=f"ReadJob{name}", actions=["s3:GetObject"],
                            resources=[f"{bucket}/{location.key}", f"{bucket}/{location.key}/*"]),
        iam.PolicyStatement(sid=f"ListJob{name}", actions=["s3:ListBucket"], resources=[bucket],
                            conditions={"StringLike": {"s3:prefix": [location.key, f"{location.key}/*"]}}),
    ]


def grant_job_access(role: iam.Role, *, bucket: s3.IBucket, config: ClusterConfig) -> None:
    """What every Ray process needs in S3, on `role`: read/write under `storage.prefix` of the checkpoint
    bucket only, and read-only on the job's `s3://` model and dataset (`job.s3_sources`), each exactly its
    prefix; and GetSecretValue on `job.hf_token_secret` only (`stacks.hf_token`). The EKS Pod Identity role and
    the EC2 target's head and worker instance roles get the same."""
    prefix = config.storage.prefix
    role.add_to_policy(iam.PolicyStatement(
        sid="ObjectsUnderPrefix",
        actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                 "s3:ListMultipartUploadParts"],
        resources=[bucket.arn_for_objects(f"{prefix}/*")]))
    role.add_to_policy(iam.PolicyStatement(
        sid="ListPrefixOnly",
        actions=["s3:ListBucket"],
        resources=[bucket.bucket_arn],
        # IfExists: HeadBucket (pyarrow's create_dir, Ray Train's StorageContext before its first
        # write) is authorized as s3:ListBucket but carries no s3:prefix, and a plain StringLike
        # never matches a missing key, so it was denied (apache/arrow#49949). The price: a listing
        # without a prefix may see key names bucket-wide; this bucket holds only this job's prefix.
        # A listing naming another prefix is still denied; object access stays <prefix>/* (above).
        conditions={"StringLikeIfExists": {"s3:prefix": [prefix, f"{prefix}/*"]}}))
    role.add_to_policy(iam.PolicyStatement(
        sid="BucketRegion", actions=["s3:GetBucketLocation"], resources=[bucket.bucket_arn]))
    for field, location in config.job.s3_sources.items():
        for statement in read_statements(field, location):
            role.add_to_policy(statement)
    # The Hugging Face token for gated models (job.hf_token_secret): this one secret, read by the job at start.
    grant_hf_token_read(role, config.job, region=config.region)


class StorageStack(cdk.Stack):
    """A private, versioned, TLS-only bucket and a Pod Identity role limited to `storage.prefix`, plus
    read-only access to the job's `s3://` model and dataset (`s3_sources`), each exactly its prefix."""

    def __init__(self, scope: Construct, id: str, *, config: ClusterConfig, cluster: eks.ICluster | None,
                 **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        storage = config.storage
        self.prefix = storage.prefix
        destroy = storage.removal_policy == "destroy"
        # The name as cdk-nag prints it in a finding's resource (tokens as <AWS::AccountId>).
        self.bucket_name_for_findings = config.bucket_name("<AWS::AccountId>")
        if storage.existing_bucket:
            self.bucket = self._existing_bucket(config.bucket_name(cdk.Aws.ACCOUNT_ID))
        else:
            self.bucket = self._new_bucket(config.bucket_name(cdk.Aws.ACCOUNT_ID), storage, destroy=destroy)

        self.s3_sources = config.job.s3_sources
        # Pod Identity needs the EKS cluster; the EC2 target (no cluster) grants the same access to its
        # instance roles through `grant_job_access` and deploys this stack without one.
        self.role: iam.Role | None = None
        self.association: eks.CfnPodIdentityAssociation | None = None
        if cluster is not None:
            self.role = iam.Role(
                self,
                "RayPodRole",
                assumed_by=pod_identity_principal(cluster, namespace=config.ray.namespace,
                                                  service_account=config.ray.service_account),
                description=f"Ray pods in {config.ray.namespace}/{config.ray.service_account}: "
                            f"s3://<bucket>/{storage.prefix}/ only",
            )
            grant_job_access(self.role, bucket=self.bucket, config=config)
            # The service account itself is created by the cdk8s chart with the same name; the
            # association binds whatever pod runs as it, so the two deploy in either order.
            self.association = eks.CfnPodIdentityAssociation(
                self, "RayPodIdentity", cluster_name=cluster.cluster_name, namespace=config.ray.namespace,
                service_account=config.ray.service_account, role_arn=self.role.role_arn)

        cdk.CfnOutput(self, "BucketName", value=self.bucket.bucket_name, description="Checkpoint bucket.")
        cdk.CfnOutput(self, "CheckpointUri",
                      value=config.checkpoint_uri(self.bucket.bucket_name),
                      description="Ray Train storage path (expires after checkpoint_expiry_days).")
        cdk.CfnOutput(self, "ModelExportUri", value=config.export_uri(self.bucket.bucket_name),
                      description="Where the job writes the final Hugging Face model (never expires).")
        if self.role is not None:
            cdk.CfnOutput(self, "RayNamespace", value=config.ray.namespace, description="Namespace of the Ray pods.")
            cdk.CfnOutput(self, "RayServiceAccount", value=config.ray.service_account,
                          description="Service account bound to the bucket through Pod Identity.")
            cdk.CfnOutput(self, "RayPodRoleArn", value=self.role.role_arn, description="Role the Ray pods assume.")

    def _new_bucket(self, name: str, storage: StorageConfig, *, destroy: bool) -> s3.Bucket:
        """The bucket, created by this stack; kept by `cdk destroy` unless removal_policy is destroy."""
        bucket = s3.Bucket(
            self,
            "CheckpointBucket",
            bucket_name=name,
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=True,
            removal_policy=cdk.RemovalPolicy.DESTROY if destroy else cdk.RemovalPolicy.RETAIN,
            auto_delete_objects=destroy,
            lifecycle_rules=[
                # Ray rewrites checkpoints in place across runs; old versions are dead weight.
                s3.LifecycleRule(id="ExpireSupersededVersions",
                                 noncurrent_version_expiration=cdk.Duration.days(storage.noncurrent_days),
                                 abort_incomplete_multipart_upload_after=cdk.Duration.days(1)),
                # Checkpoints only: the exported model lives under a different prefix and is kept.
                s3.LifecycleRule(id="ExpireOldCheckpoints", prefix=storage.checkpoint_prefix,
                                 expiration=cdk.Duration.days(storage.checkpoint_expiry_days)),
            ],
        )
        # Kept with the bucket: a retained bucket stays TLS-only while no stack manages it.
        if not destroy:
            bucket.policy.apply_removal_policy(cdk.RemovalPolicy.RETAIN)
        return bucket

    def _existing_bucket(self, name: str) -> s3.IBucket:
        """A bucket kept by an earlier teardown, used by name: its encryption, versioning, public-access block,
        lifecycle rules and TLS-only bucket policy stay as that deploy set them.

        No AWS::S3::BucketPolicy here: the first deploy's policy is retained with the bucket (`_new_bucket`), and a
        bucket has one policy, which CloudFormation creates with PutBucketPolicy only after checking there is none
        (the stack rolls back with "Bucket Policy Already Exists"). AWS::S3::BucketPolicy's primary identifier is
        its `Bucket` (cfn-lint's provider schema, `primaryIdentifier: ["/properties/Bucket"]`), so a second one
        for the same bucket is a second resource with the same identity. `python -m config check --online` reads
        the kept policy and refuses the file if its TLS-only statement is gone (config/online.py).
        """
        return s3.Bucket.from_bucket_name(self, "CheckpointBucket", name)
