"""What the Cluster Autoscaler must be told about a worker group's nodes before any exists: tags on the node group.

The Cluster Autoscaler (1.34, AWS provider) imagines a node of an empty managed node group in
`AwsManager.buildNodeFromTemplate` (cluster-autoscaler/cloudprovider/aws/aws_manager.go, tag
cluster-autoscaler-1.34.2, lines 263-337):

- CPU, memory and `nvidia.com/gpu` from the instance type (its EC2 instance-type table or
  DescribeInstanceTypes), `pods` = 110;
- labels and taints from two places: the ASG's `node-template/label|taint` tags, and, when the ASG
  carries EKS's own `eks:cluster-name` and `eks:nodegroup-name` tags (every managed node group's ASG
  does), EKS DescribeNodegroup: the node group's `Labels` (winning over ASG tags), `Taints` (added to
  the ASG's), plus `eks.amazonaws.com/nodegroup`, `eks.amazonaws.com/capacityType`, `amiType`,
  `k8sVersion` (`getManagedNodegroupInfo`, aws_wrapper.go lines 60-135);
- further resources from `k8s.io/cluster-autoscaler/node-template/resources/<name>` tags, read both
  from the ASG and from the node group's own `Tags` in the same DescribeNodegroup answer, the node
  group's winning (`extractAllocatableResourcesFromTags`, aws_manager.go lines 322-333).

So everything the autoscaler needs can sit on the `AWS::EKS::Nodegroup` itself: labels and the GPU
taint are its `Labels` and `Taints` already, and the resources an instance type does not reveal
(EFA devices, 2 MiB huge pages, the disk kubelet runs on) are node-group `Tags`, built here.
CloudFormation keeps all three in step with the variable file: a label, taint or tag dropped from the
file is removed from the node group on the next deploy (`Labels`, `Taints` and `Tags` are updatable,
`tagging.tagUpdatable` with eks:UntagResource in the resource schema cfn-lint ships), whereas tags
copied onto the ASG with CreateOrUpdateTags would linger there, since nothing ever deletes them.
Hence no ASG tags and no custom resource: EKS itself puts the auto-discovery tags
(`k8s.io/cluster-autoscaler/enabled`, `k8s.io/cluster-autoscaler/<cluster>`) and the two `eks:` tags on
the ASG it creates (EKS user guide, "Managed node groups": nodes "are automatically tagged for
auto-discovery by the Kubernetes Cluster Autoscaler"; the CA proposal
cluster-autoscaler/proposals/circumvent-tag-limit-aws.md: "we automatically add them to every managed
nodegroup").

Limit, from the same README (cloudprovider/aws/README.md, "eks:DescribeNodegroup"): the autoscaler asks
DescribeNodegroup only while it has never seen a node of the group since it started; afterwards it
uses a copy of a real node, which carries the same labels, taints and resources.
"""

from __future__ import annotations

from config import ClusterConfig, WorkerGroup
from config.k8s import EFA_RESOURCE, HUGEPAGES_RESOURCE

NODE_TEMPLATE_RESOURCES = "k8s.io/cluster-autoscaler/node-template/resources/"
"""Prefix of the tags the autoscaler reads extra node capacity from (aws_manager.go,
`extractAllocatableResourcesFromTags`)."""


def discovery_tags(cluster_name: str) -> dict[str, str]:
    """The tags the Cluster Autoscaler's `--node-group-auto-discovery=asg:tag=...` looks for (the chart's
    defaults); EKS puts them on every managed node group's ASG."""
    return {"k8s.io/cluster-autoscaler/enabled": "true", f"k8s.io/cluster-autoscaler/{cluster_name}": "owned"}


def node_template_tags(config: ClusterConfig, group: WorkerGroup) -> dict[str, str]:
    """Node-group tags for the capacity a node of `group` offers beyond what its instance type tells the
    autoscaler: EFA devices and 2 MiB huge pages as the node reserves them, and ephemeral storage on the
    disk kubelet uses (the NVMe RAID0 where there is one, else the root volume).

    CPU, memory and GPUs are left to the instance type (the autoscaler's figures for every type in the
    shipped files equal the catalog's: ec2_instance_types.go at cluster-autoscaler-1.34.2).
    """
    itype = config.instance(group)
    res = config.pod_resources[group.name]
    resources = {"ephemeral-storage": f"{itype.nvme_gib if itype.nvme_gib else group.disk_gib}Gi"}
    if res.efa_devices:
        resources[EFA_RESOURCE] = str(res.efa_devices * config.pods_per_node(group))
    if res.hugepages_2mi_mib:
        resources[HUGEPAGES_RESOURCE] = f"{config.nvidia_nodes_hugepages(group) * 2}Mi"
    return {f"{NODE_TEMPLATE_RESOURCES}{k}": v for k, v in resources.items()}
