"""The trust policy every EKS Pod Identity role of the stacks shares."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam


def pod_identity_principal(cluster: eks.ICluster, *, namespace: str, service_account: str) -> iam.IPrincipal:
    """EKS Pod Identity, for one service account of one cluster of this account only.

    Pod Identity assumes the role with session tags naming the cluster, namespace and service
    account (EKS user guide: pod-id-role, pod-id-abac); without conditions on them any Pod Identity
    association in the account could hand this role to any pod. SessionTagsPrincipal adds
    sts:TagSession, which those tags need.
    """
    conditions = {"StringEquals": {
        "aws:SourceAccount": cdk.Aws.ACCOUNT_ID,
        "aws:RequestTag/eks-cluster-arn": cluster.cluster_arn,
        "aws:RequestTag/kubernetes-namespace": namespace,
        "aws:RequestTag/kubernetes-service-account": service_account,
    }}
    return iam.SessionTagsPrincipal(iam.ServicePrincipal("pods.eks.amazonaws.com").with_conditions(conditions))
