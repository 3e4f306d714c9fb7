"""Read access to the job's Hugging Face token secret (`job.hf_token_secret`), for any role that runs the job.

One function for every target: the EKS storage stack calls it with the Ray pods' Pod Identity role;
an EC2 target calls it with the head's and the workers' instance-profile roles. The grantee gets
`secretsmanager:GetSecretValue` on exactly that secret and, for a secret under a customer managed
key (`job.hf_token_kms_key_arn`), `kms:Decrypt` on that key only when Secrets Manager asks for that
secret. Nothing else: no ListSecrets, no DescribeSecret, no other secret.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam

from config.hub import secret_iam_resource


def hf_token_statements(job, *, region: str) -> list[iam.PolicyStatement]:
    """The statements that let a role read `job.hf_token_secret` (none when it is not set).

    `region` is the job's region, where a secret given by name lives (an ARN carries its own).
    """
    secret = job.hf_token_secret
    if not secret:
        return []
    resource = secret_iam_resource(secret, partition=cdk.Aws.PARTITION, region=region, account=cdk.Aws.ACCOUNT_ID)
    statements = [iam.PolicyStatement(sid="ReadHfTokenSecret", actions=["secretsmanager:GetSecretValue"],
                                      resources=[resource])]
    if job.hf_token_kms_key_arn:
        secret_region = resource.split(":")[3] if secret.startswith("arn:") else region
        # Secrets Manager decrypts with the caller's permissions and the encryption context
        # {"SecretARN": <the secret's ARN>, "SecretVersionId": ...} (Secrets Manager user guide,
        # "Secret encryption and decryption"); kms:ViaService keeps the key usable only through it.
        statements.append(iam.PolicyStatement(
            sid="DecryptHfTokenSecret", actions=["kms:Decrypt"], resources=[job.hf_token_kms_key_arn],
            conditions={"StringEquals": {"kms:ViaService": f"secretsmanager.{secret_region}.amazonaws.com"},
                        "StringLike": {"kms:EncryptionContext:SecretARN": resource}}))
    return statements


def grant_hf_token_read(grantee: iam.IGrantable, job, *, region: str) -> list[iam.PolicyStatement]:
    """Let `grantee` (a Pod Identity role, an instance profile's role, ...) read the job's token secret.

    Returns the statements added to its policy (none when `job.hf_token_secret` is not set).
    """
    statements = hf_token_statements(job, region=region)
    for statement in statements:
        grantee.grant_principal.add_to_principal_policy(statement)
    return statements
