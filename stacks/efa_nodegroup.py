"""One managed GPU node group per worker group, with EFA wired up where the transport uses it."""

from __future__ import annotations

import textwrap

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from config import ClusterConfig, WorkerGroup
from config.k8s import GPU_TAINT, WORKER_GROUP_LABEL, worker_node_labels
from stacks.launch_template import metadata_options, name_tag, root_volume

LT = ec2.CfnLaunchTemplate

_CAPACITY = {
    "on_demand": eks.CapacityType.ON_DEMAND,
    "spot": eks.CapacityType.SPOT,
    "capacity_block": eks.CapacityType.CAPACITY_BLOCK,
}
_MIME_BOUNDARY = "==RAYEFA=="


def efa_network_interfaces(count: int, security_group_ids: list[str]) -> list[LT.NetworkInterfaceProperty]:
    """Launch-template interfaces for `count` EFA devices, one per network card.

    Card 0 carries the primary interface, which must also carry IP traffic (`efa`); every other
    card gets an `efa-only` interface, which takes no IP address from the subnet, so a p5's 32
    devices do not use up 31 more pod addresses per node.
    """
    return [
        LT.NetworkInterfaceProperty(
            device_index=0 if card == 0 else 1,
            network_card_index=card,
            interface_type="efa" if card == 0 else "efa-only",
            groups=security_group_ids,
            delete_on_termination=True,
        )
        for card in range(count)
    ]


def node_user_data(*, nvme: bool, hugepages: int) -> str:
    """MIME multi-part user data for AL2023 nodeadm, merged by EKS with its own bootstrap part.

    `nvme`: put containerd and kubelet on the instance-store NVMe as RAID0 (the DLC image is many
    GB; pulling it onto NVMe is faster and keeps it off the root volume). `hugepages`: 2 MiB pages
    to reserve before kubelet starts, so they show up as allocatable `hugepages-2Mi`.
    """
    parts = []
    if nvme:
        parts.append(("application/node.eks.aws", textwrap.dedent("""\
            ---
            apiVersion: node.eks.aws/v1alpha1
            kind: NodeConfig
            spec:
              instance:
                localStorage:
                  strategy: RAID0
            """)))
    if hugepages:
        # libfabric's EFA provider registers its bounce buffers in huge pages; kubelet only
        # reports pages that exist when it starts, and nodeadm starts it after this script.
        parts.append(("text/x-shellscript; charset=\"us-ascii\"", textwrap.dedent(f"""\
            #!/bin/bash
            set -euo pipefail
            echo "vm.nr_hugepages = {hugepages}" > /etc/sysctl.d/90-efa-hugepages.conf
            sysctl -w vm.nr_hugepages={hugepages}
            """)))
    if not parts:
        return ""
    body = [f"MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"{_MIME_BOUNDARY}\"\n"]
    for content_type, text in parts:
        body.append(f"--{_MIME_BOUNDARY}\nContent-Type: {content_type}\n\n{text}")
    body.append(f"--{_MIME_BOUNDARY}--\n")
    return "\n".join(body)


class EfaNodeGroup(Construct):
    """A managed node group for one worker group: AL2023 NVIDIA AMI, launch template, labels, taint.

    With EFA transport and an EFA-capable type it adds every EFA interface the catalog lists, an
    EFA security group open to itself, and a cluster placement group; with socket transport none
    of these (EKS then attaches the cluster security group itself).
    """

    def __init__(self, scope: Construct, id: str, *, cluster: eks.Cluster, config: ClusterConfig,
                 group: WorkerGroup, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        itype = config.instance(group)
        resources = config.pod_resources[group.name]
        self.efa_interfaces = resources.efa_devices * config.pods_per_node(group)
        self.security_group: ec2.SecurityGroup | None = None
        self.placement_group: ec2.CfnPlacementGroup | None = None

        data: dict = {
            "instance_type": group.instance_type,
            "block_device_mappings": [root_volume(group.disk_gib)],
            "metadata_options": metadata_options(config),
            "tag_specifications": name_tag(f"{config.cluster.name}-{group.name}"),
        }
        if self.efa_interfaces:
            self.security_group = ec2.SecurityGroup(
                self, "EfaSecurityGroup", vpc=cluster.vpc, allow_all_outbound=False,
                description=f"EFA traffic between {group.name} nodes (all traffic to and from itself)")
            # EFA's SRD transport needs every protocol open within the group, both directions.
            self.security_group.add_ingress_rule(self.security_group, ec2.Port.all_traffic(),
                                                 "EFA: all traffic from group members")
            self.security_group.add_egress_rule(self.security_group, ec2.Port.all_traffic(),
                                                "EFA: all traffic to group members")
            data["network_interfaces"] = efa_network_interfaces(
                self.efa_interfaces, [cluster.cluster_security_group_id, self.security_group.security_group_id])
            if group.capacity != "capacity_block":
                # Capacity blocks are already co-located in an UltraCluster; naming a placement
                # group the reservation is not in would fail the launch.
                self.placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")
                data["placement"] = LT.PlacementProperty(group_name=self.placement_group.ref)
        if group.capacity == "capacity_block":
            data["instance_market_options"] = LT.InstanceMarketOptionsProperty(market_type="capacity-block")
            data["capacity_reservation_specification"] = LT.CapacityReservationSpecificationProperty(
                capacity_reservation_target=LT.CapacityReservationTargetProperty(
                    capacity_reservation_id=group.capacity_reservation_id))
        user_data = node_user_data(nvme=itype.nvme_gib > 0,
                                   hugepages=config.nvidia_nodes_hugepages(group) if self.efa_interfaces else 0)
        if user_data:
            data["user_data"] = cdk.Fn.base64(user_data)

        self.launch_template = ec2.CfnLaunchTemplate(
            self, "LaunchTemplate", launch_template_data=LT.LaunchTemplateDataProperty(**data))
        self.nodegroup = eks.Nodegroup(
            self,
            "Nodegroup",
            cluster=cluster,
            # Set explicitly: with a launch template EKS cannot infer it, and the AL2 GPU AMI the
            # L2 would otherwise pick has no EFA-ready AL2023 nodeadm.
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_NVIDIA,
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.launch_template.ref, version=self.launch_template.attr_latest_version_number),
            capacity_type=_CAPACITY[group.capacity],
            min_size=group.effective_min,
            desired_size=group.nodes,
            max_size=group.effective_max,
            # One subnet, in the GPU AZ: a cluster placement group cannot span AZs.
            subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                                        availability_zones=[config.gpu_availability_zone]),
            labels=worker_node_labels(config, group),
            taints=[eks.TaintSpec(key=GPU_TAINT.key, value=GPU_TAINT.value,
                                  effect=eks.TaintEffect[GPU_TAINT.cfn_effect])],
            tags={WORKER_GROUP_LABEL: group.name},
        )
