"""Launch-template pieces every node group shares: IMDS settings and the encrypted root volume,
and the system node group's own launch template."""

from __future__ import annotations

import json
import re
import textwrap

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from config import ClusterConfig
from stacks.versions import managed_addon_version

LT = ec2.CfnLaunchTemplate

# AL2023 EKS AMIs boot from /dev/xvda.
ROOT_DEVICE = "/dev/xvda"
_MIME_BOUNDARY = "==RAYEFA=="
# A pod's packets to IMDS cross one more hop (the pod's veth) than the node's own: with a limit of
# 1 the answer never reaches a pod, so no pod can read the node role's credentials. The CloudWatch
# agent of the amazon-cloudwatch-observability add-on reads IMDS too, and runs on the host network
# from chart 2.0.0 (aws-observability/helm-charts 0595aa2 "Add hostNetwork: true for cloudwatch agent
# pod on linux", released in c7a51ba "Release 2.0.0"): `hostNetwork: true` is written into the
# agent's template itself, templates/linux/cloudwatch-agent-custom-resource.yaml at tags 4.8.0,
# 4.10.3 and 5.4.0 (6.2.0, ffea3d4, only turned it into the value `agent.hostNetwork`, default true),
# and the operator copies it into the agent's DaemonSet (aws/amazon-cloudwatch-agent-operator v3.3.2,
# the one chart 4.10.3 installs: internal/manifests/collector/daemonset.go `HostNetwork`). Its
# fluent-bit DaemonSet is on the host network too. So its requests are the node's own and 1 is
# enough; only an add-on older than 2.0.0 (add-on vX.Y.Z ships chart X.Y.Z) would need 2.
IMDS_HOP_LIMIT = 1
IMDS_HOP_LIMIT_POD_AGENT = 2
CLOUDWATCH_HOST_NETWORK_SINCE = (2, 0, 0)


def cloudwatch_agent_on_host_network(kubernetes_version: str) -> bool:
    """Whether the pinned amazon-cloudwatch-observability add-on runs its agent on the host network."""
    version = managed_addon_version(kubernetes_version, "amazon-cloudwatch-observability")
    return tuple(int(n) for n in re.findall(r"\d+", version)[:3]) >= CLOUDWATCH_HOST_NETWORK_SINCE


def imds_hop_limit(config: ClusterConfig) -> int:
    """1 (the node only), unless the CloudWatch add-on is on and its pinned version runs the agent in a pod."""
    if config.cluster.cloudwatch_observability and not cloudwatch_agent_on_host_network(
            config.cluster.kubernetes_version):
        return IMDS_HOP_LIMIT_POD_AGENT
    return IMDS_HOP_LIMIT

# nodeadm's FastImagePull wants "at least 600MiB/s throughput" on the root volume, up to 1000 MiB/s
# (awslabs/amazon-eks-ami v20260724, nodeadm/doc/examples.md "Enabling fast image pull"). gp3's
# baseline is 125 MiB/s and 3000 IOPS; 600 MiB/s needs 2400 IOPS (0.25 MiB/s per IOPS), within it.
FAST_PULL_THROUGHPUT_MIBPS = 600

# The containerd base runtime spec nodeadm writes for every container (awslabs/amazon-eks-ami
# v20260724, nodeadm/internal/containerd/base-runtime-spec.json) sets one rlimit, RLIMIT_NOFILE
# 65536 soft / 1048576 hard; every other limit is inherited from containerd, whose unit sets no
# LimitMEMLOCK. A NodeConfig `baseRuntimeSpec` is merged over that file with mergo.WithOverride
# (nodeadm/internal/containerd/base_runtime_spec.go, internal/util/merge.go), which replaces a list
# outright: the rlimits below must repeat the AMI's RLIMIT_NOFILE or containers lose it.
AMI_NOFILE = {"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 1048576}
# "Unlimited" is RLIM_INFINITY (2**64 - 1) in an OCI spec, but nodeadm's merge decodes the JSON into
# map[string]interface{} (float64) and re-encodes it: 2**64 - 1 comes out as 18446744073709551616,
# which overflows the spec's uint64 and containerd would refuse the base spec. 2**53 bytes (8 PiB) is
# the largest integer a float64 holds exactly, survives the round trip unchanged and is far above any
# instance's memory: in effect unlimited for libfabric's memory registration, which checks the limit
# only against what it pins (the preflight accepts >= 1 TiB).
MEMLOCK_BYTES = 2**53
EFA_MEMLOCK = {"type": "RLIMIT_MEMLOCK", "soft": MEMLOCK_BYTES, "hard": MEMLOCK_BYTES}


def metadata_options(config: ClusterConfig) -> LT.MetadataOptionsProperty:
    """IMDSv2 only (session tokens required), with the hop limit above; workload pods use Pod Identity."""
    return LT.MetadataOptionsProperty(http_tokens="required", http_put_response_hop_limit=imds_hop_limit(config),
                                      http_endpoint="enabled")


def root_volume(size_gib: int, *, fast_pull: bool = False) -> LT.BlockDeviceMappingProperty:
    """An encrypted gp3 root volume of `size_gib` GiB, deleted with the instance.

    `fast_pull`: containerd pulls onto this volume (no NVMe), so give it the throughput FastImagePull wants.
    """
    return LT.BlockDeviceMappingProperty(
        device_name=ROOT_DEVICE,
        ebs=LT.EbsProperty(volume_size=size_gib, volume_type="gp3", encrypted=True, delete_on_termination=True,
                           throughput=FAST_PULL_THROUGHPUT_MIBPS if fast_pull else None))


def name_tag(name: str) -> list[LT.TagSpecificationProperty]:
    """Instance `Name` tag (what the EC2 console lists the nodes by)."""
    return [LT.TagSpecificationProperty(resource_type="instance", tags=[cdk.CfnTag(key="Name", value=name)])]


def node_user_data(*, nvme: bool, hugepages: int, efa: bool = False) -> str:
    """MIME multi-part user data for AL2023 nodeadm, merged by EKS with its own bootstrap part.

    Always nodeadm's `FastImagePull` feature gate (experimental in the EKS AMI): containerd pulls
    through the SOCI snapshotter in parallel mode, an image's layers downloading over several
    connections and unpacking concurrently instead of one after another. It is not lazy loading
    (a container still starts only once its whole image is pulled; no SOCI index is needed), and
    nodeadm ignores it on instances below its CPU/memory threshold.
    `nvme`: put containerd and kubelet on the instance-store NVMe as RAID0 (the DLC image is many
    GB; pulling it onto NVMe is faster and keeps it off the root volume). `hugepages`: 2 MiB pages
    to reserve before kubelet starts, so they show up as allocatable `hugepages-2Mi`. `efa`: containers
    get the memlock limit above (with the AMI's RLIMIT_NOFILE kept), so libfabric can pin NCCL's buffers.
    """
    node_config = ("---\napiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n"
                   "  featureGates:\n    FastImagePull: true\n")
    if nvme:
        node_config += "  instance:\n    localStorage:\n      strategy: RAID0\n"
    if efa:
        # JSON flow style is valid YAML and keeps the integers exact.
        spec = json.dumps({"process": {"rlimits": [AMI_NOFILE, EFA_MEMLOCK]}})
        node_config += f"  containerd:\n    baseRuntimeSpec: {spec}\n"
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
    """The system node group's launch template: IMDSv2 and hop limit, encrypted root disk with FastImagePull's
    throughput (containerd stays on it: no NVMe on these types), cluster SG, FastImagePull.

    With a launch template EKS no longer adds the cluster security group itself, and the disk size
    cannot be given on the node group: both are here.
    """
    system = config.cluster.system_nodes
    return LT(scope, id, launch_template_data=LT.LaunchTemplateDataProperty(
        block_device_mappings=[root_volume(system.disk_gib, fast_pull=True)],
        metadata_options=metadata_options(config),
        security_group_ids=[cluster.cluster_security_group_id],
        tag_specifications=name_tag(f"{config.cluster.name}-system"),
        # The Ray head (and the RayJob's submitter sidecar) pull the multi-GB image here too.
        user_data=cdk.Fn.base64(node_user_data(nvme=False, hugepages=0)),
    ))
