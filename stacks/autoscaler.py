"""Cluster Autoscaler: GPU node groups empty while idle, grown when Ray worker pods are Pending.

The kubernetes/autoscaler project's chart at the release for the cluster's Kubernetes minor, on the
system nodes, with an EKS Pod Identity role that may resize only this cluster's Auto Scaling groups.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from config import ClusterConfig
from config.k8s import system_node_labels
from stacks.helm_addons import pinned_chart
from stacks.node_template import discovery_tags
from stacks.pod_identity import pod_identity_principal
from stacks.versions import CLUSTER_AUTOSCALER_SERVICE_ACCOUNT, cluster_autoscaler

# Read-only calls the autoscaler makes to build its view of the groups; none of them supports
# resource-level permissions, so they are granted on "*".
_DESCRIBE_ACTIONS = [
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeAutoScalingInstances",
    "autoscaling:DescribeLaunchConfigurations",
    "autoscaling:DescribeScalingActivities",
    "autoscaling:DescribeTags",
    "ec2:DescribeImages",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplateVersions",
    "ec2:GetInstanceTypesFromInstanceRequirements",
]


def autoscaler_values(config: ClusterConfig, image_tag: str) -> dict:
    """Helm values: AWS provider, discovery by this cluster's tags, scale-down delay from the file."""
    minutes = f"{config.autoscaling.scale_down_minutes}m"
    return {
        "cloudProvider": "aws",
        "awsRegion": config.region,
        "autoDiscovery": {"clusterName": config.cluster.name, "tags": list(discovery_tags(config.cluster.name))},
        "image": {"tag": image_tag},
        "fullnameOverride": "cluster-autoscaler",
        "rbac": {"serviceAccount": {"create": True, "name": CLUSTER_AUTOSCALER_SERVICE_ACCOUNT}},
        "nodeSelector": system_node_labels(),
        "extraArgs": {
            # A GPU node with no Ray pod goes after this long, so a RayJob retry (KubeRay recreates its Ray
            # cluster at once) finds its nodes still there; and none is removed sooner than this after a
            # scale-up, while the new nodes pull the image and the pods start.
            "scale-down-unneeded-time": minutes,
            "scale-down-delay-after-add": minutes,
            # The one pod that matters is a Ray worker; pick the group that wastes least of the node.
            "expander": "least-waste",
            # Ray pods have a memory-backed /dev/shm (emptyDir): kept true, a node with a running Ray pod is never
            # drained by the autoscaler, whatever its utilisation.
            "skip-nodes-with-local-storage": "true",
        },
    }


class ClusterAutoscaler(Construct):
    """The chart, its service account's Pod Identity role (scoped to this cluster's ASGs) and the association."""

    def __init__(self, scope: Construct, id: str, *, cluster: eks.ICluster, config: ClusterConfig, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        stack = cdk.Stack.of(self)
        self.cluster_name = config.cluster.name
        self.pin, image_tag = cluster_autoscaler(config.cluster.kubernetes_version)
        self.role = iam.Role(
            self, "Role", assumed_by=pod_identity_principal(cluster, namespace=self.pin.namespace,
                                                            service_account=CLUSTER_AUTOSCALER_SERVICE_ACCOUNT),
            description=f"Cluster Autoscaler of {config.cluster.name}: resize that cluster's node groups only")
        self.role.add_to_policy(iam.PolicyStatement(sid="Describe", actions=_DESCRIBE_ACTIONS, resources=["*"]))
        cluster_tag = next(k for k in discovery_tags(config.cluster.name) if k.endswith(config.cluster.name))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ResizeThisClustersGroups",
            actions=["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
            resources=[stack.format_arn(service="autoscaling", resource="autoScalingGroup", resource_name="*",
                                        arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME)],
            # EKS tags every managed node group's ASG with the discovery tags; another cluster's ASGs carry
            # their own cluster name there.
            conditions={"StringEquals": {f"aws:ResourceTag/{cluster_tag}": "owned"}}))
        # For a managed node group at zero the autoscaler also asks EKS for its labels and taints.
        self.role.add_to_policy(iam.PolicyStatement(
            sid="DescribeThisClustersNodegroups", actions=["eks:DescribeNodegroup"],
            resources=[stack.format_arn(service="eks", resource="nodegroup",
                                        resource_name=f"{config.cluster.name}/*/*")]))
        self.association = eks.CfnPodIdentityAssociation(
            self, "Identity", cluster_name=cluster.cluster_name, namespace=self.pin.namespace,
            service_account=CLUSTER_AUTOSCALER_SERVICE_ACCOUNT, role_arn=self.role.role_arn)
        self.values = autoscaler_values(config, image_tag)
        self.chart = pinned_chart(self, cluster, self.pin, self.values)
        # Credentials must be bindable before the pod starts, or its first AWS calls fail.
        self.chart.node.add_dependency(self.association)
