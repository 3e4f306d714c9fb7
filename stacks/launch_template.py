"""Launch-template pieces every node group shares: IMDS settings and the encrypted root volume,
and the system node group's own launch template."""

from __future__ import annotations

import textwrap

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from config import ClusterConfig

LT = ec2.CfnLaunchTemplate

# AL2023 EKS AMIs boot from /dev/xvda.
ROOT_DEVICE = "/dev/xvda"
_MIME_BOUNDARY = "==RAYEFA=="
# A pod's packets to IMDS cross one more hop (the pod's veth) than the node's own: with a limit of
# 1 the answer never reaches a pod, so no pod can read the node role's credentials. The CloudWatch
# agent (optional add-on) reads instance metadata from a pod and needs 2.
IMDS_HOP_LIMIT = 1
IMDS_HOP_LIMIT_CLOUDWATCH = 2


def imds_hop_limit(config: ClusterConfig) -> int:
    """IMDS PUT response hop limit: 1 (node only) unless the CloudWatch agent must reach IMDS from its pod."""
    return IMDS_HOP_LIMIT_CLOUDWATCH if config.cluster.cloudwatch_observability else IMDS_HOP_LIMIT


def metadata_options(config: ClusterConfig) -> LT.MetadataOptionsProperty:
    """IMDSv2 only (session tokens required), with the hop limit above; workload pods use Pod Identity."""
    return LT.MetadataOptionsProperty(http_tokens="required", http_put_response_hop_limit=imds_hop_limit(config),
                                      http_endpoint="enabled")


def root_volume(size_gib: int) -> LT.BlockDeviceMappingProperty:
    """An encrypted gp3 root volume of `size_gib` GiB, deleted with the instance."""
    return LT.BlockDeviceMappingProperty(
        device_name=ROOT_DEVICE,
        ebs=LT.EbsProperty(volume_size=size_gib, volume_type="gp3", encrypted=True, delete_on_termination=True))


def name_tag(name: str) -> list[LT.TagSpecificationProperty]:
    """Instance `Name` tag (what the EC2 console lists the nodes by)."""
    return [LT.TagSpecificationProperty(resource_type="instance", tags=[cdk.CfnTag(key="Name", value=name)])]


def node_user_data(*, nvme: bool, hugepages: int) -> str:
    """MIME multi-part user data for AL2023 nodeadm, merged by EKS with its own bootstrap part.

    Always nodeadm's `FastImagePull` feature gate (experimental in the EKS AMI): containerd pulls
    through the SOCI snapshotter in parallel mode, an image's layers downloading over several
    connections and unpacking concurrently instead of one after another. It is not lazy loading
    (a container still starts only once its whole image is pulled; no SOCI index is needed), and
    nodeadm ignores it on instances below its CPU/memory threshold.
    `nvme`: put containerd and kubelet on the instance-store NVMe as RAID0 (the DLC image is many
    GB; pulling it onto NVMe is faster and keeps it off the root volume). `hugepages`: 2 MiB pages
    to reserve before kubelet starts, so they show up as allocatable `hugepages-2Mi`.
    """
    node_config = ("---\napiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n"
                   "  featureGates:\n    FastImagePull: true\n")
    if nvme:
        node_config += "  instance:\n    localStorage:\n      strategy: RAID0\n"
    parts = [("application/node.eks.aws", node_config)]
    if hugepages:
        # libfabric's EFA provider registers its bounce buffers in huge pages; kubelet only
        # reports pages that exist when it starts, and nodeadm starts it after this script.
        parts.append(("text/x-shellscript; charset=\"us-ascii\"", textwrap.dedent(f"""\
            #!/bin/bash
            set -euo pipefail
            echo "vm.nr_hugepages = {hugepages}" > /etc/sysctl.d/90-efa-hugepages.conf
            sysctl -w vm.nr_hugepages={hugepages}
            """)))
    body = [f"MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"{_MIME_BOUNDARY}\"\n"]
    for content_type, text in parts:
        body.append(f"--{_MIME_BOUNDARY}\nContent-Type: {content_type}\n\n{text}")
    body.append(f"--{_MIME_BOUNDARY}--\n")
    return "\n".join(body)


def system_launch_template(scope: Construct, id: str, *, cluster: eks.Cluster, config: ClusterConfig) -> LT:
    """The system node group's launch template: IMDSv2 and hop limit, encrypted root disk, cluster SG, FastImagePull.

    With a launch template EKS no longer adds the cluster security group itself, and the disk size
    cannot be given on the node group: both are here.
    """
    system = config.cluster.system_nodes
    return LT(scope, id, launch_template_data=LT.LaunchTemplateDataProperty(
        block_device_mappings=[root_volume(system.disk_gib)],
        metadata_options=metadata_options(config),
        security_group_ids=[cluster.cluster_security_group_id],
        tag_specifications=name_tag(f"{config.cluster.name}-system"),
        # The Ray head (and the RayJob's submitter sidecar) pull the multi-GB image here too.
        user_data=cdk.Fn.base64(node_user_data(nvme=False, hugepages=0)),
    ))
