"""One managed GPU node group per worker group, with EFA wired up where the transport uses it."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from config import ClusterConfig, WorkerGroup
from config.efa import efa_interface_layout
from config.k8s import GPU_TAINT, WORKER_GROUP_LABEL, worker_node_labels
from stacks.launch_template import metadata_options, name_tag, node_user_data, root_volume
from stacks.node_template import node_template_tags

LT = ec2.CfnLaunchTemplate

_CAPACITY = {
    "on_demand": eks.CapacityType.ON_DEMAND,
    "spot": eks.CapacityType.SPOT,
    "capacity_block": eks.CapacityType.CAPACITY_BLOCK,
}


# Cluster Autoscaler's AWS provider names this its GPU label (kubernetes/autoscaler cluster-autoscaler-1.34.2,
# cluster-autoscaler/cloudprovider/aws/aws_cloud_provider.go `GPULabel`). Its GPU processor
# (processors/customresources/gpu_processor.go, `FilterOutNodesWithUnreadyResources`) treats a node that carries
# the label but does not yet advertise `nvidia.com/gpu` as unready instead of as a node without GPUs, so while
# the device plugin starts the autoscaler waits instead of adding more nodes for the still-Pending Ray workers.
ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"


def accelerator_label(gpu_model: str) -> str:
    """The accelerator label's value for a catalog GPU model, in the provider's spelling (its
    `availableGPUTypes`: "nvidia-tesla-t4", "nvidia-a10g"): `L4` -> `nvidia-l4`, `A100-40GB` -> `nvidia-a100`."""
    return "nvidia-" + gpu_model.split("-")[0].lower()


def efa_network_interfaces(count: int, security_group_ids: list[str]) -> list[LT.NetworkInterfaceProperty]:
    """Launch-template interfaces for `count` EFA devices, laid out by `config.efa.efa_interface_layout`
    (the same layout the EC2 target's launcher YAML uses)."""
    return [LT.NetworkInterfaceProperty(device_index=i.device, network_card_index=i.card, interface_type=i.kind,
                                        groups=security_group_ids, delete_on_termination=True)
            for i in efa_interface_layout(count)]


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
            # Without NVMe containerd pulls the image onto the root volume.
            "block_device_mappings": [root_volume(group.disk_gib, fast_pull=itype.nvme_gib == 0)],
            "metadata_options": metadata_options(config),
            "tag_specifications": name_tag(f"{config.cluster.name}-{group.name}"),
        }
        if self.efa_interfaces:
            # allow_all_outbound=False keeps this group's own rules to what EFA needs (no 0.0.0.0/0 egress rule in
            # it), but it does not limit the nodes' egress: every interface also carries the cluster security group,
            # whose egress allows everything, and EC2 evaluates all the groups of an interface together, allowing
            # what any of them allows (VPC User Guide, "Security groups": "the rules from all the security groups
            # ... are aggregated"). The nodes reach ECR, S3 and the Hugging Face Hub through that one.
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
        data["user_data"] = cdk.Fn.base64(node_user_data(
            nvme=itype.nvme_gib > 0, hugepages=config.nvidia_nodes_hugepages(group) if self.efa_interfaces else 0,
            efa=bool(self.efa_interfaces)))

        self.launch_template = ec2.CfnLaunchTemplate(
            self, "LaunchTemplate", launch_template_data=LT.LaunchTemplateDataProperty(**data))
        self.nodegroup = eks.Nodegroup(
            self,
            "Nodegroup",
            cluster=cluster,
            # Set explicitly: with a launch template EKS cannot infer it, and the AL2 GPU AMI the
            # L2 would otherwise pick has no EFA-ready AL2023 nodeadm.
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_NVIDIA,
            # None: EKS picks the newest AMI release at creation and no later deploy changes it.
            release_version=config.cluster.node_ami_release_version,
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.launch_template.ref, version=self.launch_template.attr_latest_version_number),
            capacity_type=_CAPACITY[group.capacity],
            # Under the autoscaler: empty while idle (min 0 by default), up to `nodes` for a job.
            min_size=config.group_min(group),
            desired_size=config.group_desired(group),
            max_size=config.group_max(group),
            # EKS replaces a node the monitoring agent reports unhealthy (e.g. AcceleratedHardwareReady
            # false after a GPU XID error, NetworkingReady false).
            enable_node_auto_repair=True,
            max_unavailable=1,
            # One subnet, in the GPU AZ: a cluster placement group cannot span AZs.
            subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                                        availability_zones=[config.gpu_availability_zone]),
            labels={**worker_node_labels(config, group), ACCELERATOR_LABEL: accelerator_label(itype.gpu_model)},
            taints=[eks.TaintSpec(key=GPU_TAINT.key, value=GPU_TAINT.value,
                                  effect=eks.TaintEffect[GPU_TAINT.cfn_effect])],
            # The Cluster Autoscaler reads the labels, the taint and these tags through DescribeNodegroup to
            # imagine a node of the group while it is empty (stacks/node_template.py).
            tags={WORKER_GROUP_LABEL: group.name, **node_template_tags(config, group)},
        )
        # MINIMAL: a launch-template or AMI update terminates a node before launching its replacement,
        # so it never needs a spare GPU instance (a capacity block or a full placement group has none).
        # aws_eks_v2's Nodegroup has no property for the strategy, hence the override.
        cfn = self.nodegroup.node.default_child
        cfn.add_property_override("UpdateConfig.UpdateStrategy", "MINIMAL")
        if group.deployed and (config.autoscaling.enabled or group.capacity == "capacity_block"):
            # The Cluster Autoscaler owns the size of an existing group (or, for a capacity block without it, the
            # person who scales it by hand once the block starts: docs/deploying.md "Capacity blocks"). EKS resizes
            # a group to DesiredSize whenever that property changes, terminating nodes if it is below the running
            # count, and "when
            # using CloudFormation, no action occurs if you remove this parameter from your CFN template" (EKS API
            # Reference, NodegroupScalingConfig.desiredSize; the same text in the CloudFormation template reference,
            # AWS::EKS::Nodegroup ScalingConfig). aws_eks_v2's Nodegroup always writes it (desiredSize ?? minSize),
            # hence the escape hatch. Creating a group needs it ("When creating a node group, you must specify all
            # or none of the properties", same page; "none" would leave the sizes to EKS's defaults, not the file's),
            # so a group not yet deployed (`deployed: false`) keeps it, at the group minimum;
            # tests/test_lifecycle_templates.py checks both templates. The flag is the user's to flip, and a wrong one
            # costs a resize or a failed creation: `config check --online` compares it with the node groups EKS has
            # (config/online.py `check_node_groups`).
            cfn.add_property_deletion_override("ScalingConfig.DesiredSize")
