"""Tags on a managed node group's Auto Scaling group, which EKS does not copy there itself.

The Cluster Autoscaler reads two kinds of tags from the Auto Scaling group, never from the node group:
the auto-discovery tags, and, for a group with no node yet, the `node-template` tags that tell it which
labels, taints and extended resources a new node would have (without them it cannot know that a node
of an empty group would offer `nvidia.com/gpu` or `vpc.amazonaws.com/efa`, and never scales up from
zero). EKS tags only the node group; like eksctl's `propagateASGTags`, this construct looks up the
group's ASG and writes the tags onto it with `autoscaling:CreateOrUpdateTags`.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import custom_resources as cr
from constructs import Construct

from config import ClusterConfig, WorkerGroup
from config.k8s import EFA_RESOURCE, GPU_RESOURCE, GPU_TAINT, HUGEPAGES_RESOURCE, worker_node_labels

NODE_TEMPLATE = "k8s.io/cluster-autoscaler/node-template"
_ASG_NAME_PATH = "nodegroup.resources.autoScalingGroups.0.name"


def discovery_tags(cluster_name: str) -> dict[str, str]:
    """The tags the Cluster Autoscaler's `--node-group-auto-discovery=asg:tag=...` looks for (the chart's defaults)."""
    return {"k8s.io/cluster-autoscaler/enabled": "true", f"k8s.io/cluster-autoscaler/{cluster_name}": "owned"}


def node_template_tags(config: ClusterConfig, group: WorkerGroup) -> dict[str, str]:
    """What a node of `group` will offer, as `node-template` tags: labels, the GPU taint, capacity.

    Capacity is per node: CPU and memory as the instance type has them (what the autoscaler would assume
    anyway), GPUs, EFA devices and 2 MiB huge pages as the node reserves them, and ephemeral storage on
    the disk kubelet uses (the NVMe RAID0 where there is one, else the root volume).
    """
    itype = config.instance(group)
    res = config.pod_resources[group.name]
    pods = config.pods_per_node(group)
    tags = {f"{NODE_TEMPLATE}/label/{k}": v for k, v in worker_node_labels(config, group).items()}
    tags[f"{NODE_TEMPLATE}/taint/{GPU_TAINT.key}"] = f"{GPU_TAINT.value}:{GPU_TAINT.effect}"
    resources = {
        "cpu": str(itype.vcpus),
        "memory": f"{itype.memory_gib}Gi",
        GPU_RESOURCE: str(itype.gpus),
        "ephemeral-storage": f"{itype.nvme_gib if itype.nvme_gib else group.disk_gib}Gi",
    }
    if res.efa_devices:
        resources[EFA_RESOURCE] = str(res.efa_devices * pods)
    if res.hugepages_2mi_mib:
        resources[HUGEPAGES_RESOURCE] = f"{config.nvidia_nodes_hugepages(group) * 2}Mi"
    tags.update({f"{NODE_TEMPLATE}/resources/{k}": v for k, v in resources.items()})
    return tags


class AsgTags(Construct):
    """Puts `tags` on the Auto Scaling group behind `nodegroup`, on create and whenever the tags change.

    Two SDK calls through CDK's AwsCustomResource: EKS DescribeNodegroup for the ASG's name (CloudFormation
    does not expose it), then Auto Scaling CreateOrUpdateTags. The tags are not propagated to instances;
    the ASG is deleted with the node group, so nothing is removed on delete.
    """

    def __init__(self, scope: Construct, id: str, *, cluster: eks.ICluster, nodegroup: eks.Nodegroup,
                 tags: dict[str, str], **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        stack = cdk.Stack.of(self)
        describe_call = cr.AwsSdkCall(
            service="EKS", action="describeNodegroup",
            parameters={"clusterName": cluster.cluster_name, "nodegroupName": nodegroup.nodegroup_name},
            physical_resource_id=cr.PhysicalResourceId.from_response(_ASG_NAME_PATH),
            output_paths=[_ASG_NAME_PATH])
        self.lookup = cr.AwsCustomResource(
            self, "FindAsg", on_create=describe_call, on_update=describe_call, install_latest_aws_sdk=False,
            policy=cr.AwsCustomResourcePolicy.from_statements([iam.PolicyStatement(
                actions=["eks:DescribeNodegroup"],
                resources=[stack.format_arn(service="eks", resource="nodegroup",
                                            resource_name=f"{cluster.cluster_name}/{nodegroup.nodegroup_name}/*")])]))
        self.lookup.node.add_dependency(nodegroup)
        self.asg_name = self.lookup.get_response_field(_ASG_NAME_PATH)
        tag_call = cr.AwsSdkCall(
            service="AutoScaling", action="createOrUpdateTags",
            parameters={"Tags": [{"ResourceId": self.asg_name, "ResourceType": "auto-scaling-group", "Key": k,
                                  "Value": v, "PropagateAtLaunch": False} for k, v in sorted(tags.items())]},
            physical_resource_id=cr.PhysicalResourceId.of(self.asg_name))
        self.tagger = cr.AwsCustomResource(
            self, "TagAsg", on_create=tag_call, on_update=tag_call, install_latest_aws_sdk=False,
            policy=cr.AwsCustomResourcePolicy.from_statements([iam.PolicyStatement(
                actions=["autoscaling:CreateOrUpdateTags"],
                resources=[stack.format_arn(service="autoscaling", resource="autoScalingGroup",
                                            resource_name="*", arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME)],
                # Only this node group's ASG: EKS tags it with the node group's name.
                conditions={"StringEquals": {"aws:ResourceTag/eks:nodegroup-name": nodegroup.nodegroup_name}})]))
