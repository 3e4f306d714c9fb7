"""The network stack: VPC, subnets over the file's AZs, NAT gateways and the S3 gateway endpoint."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from config import ClusterConfig


class NetworkStack(cdk.Stack):
    """A VPC with public and private subnets in `config.availability_zones` (the GPU AZ first)."""

    def __init__(self, scope: Construct, id: str, *, config: ClusterConfig, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        net = config.network
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(net.vpc_cidr),
            # Explicit AZs (not max_azs) so the GPU AZ is always one of them and synthesis needs
            # no account lookup. With one NAT gateway it lands in the first AZ, the GPU AZ, so
            # image pulls from GPU nodes do not pay cross-AZ transfer.
            availability_zones=config.availability_zones,
            nat_gateways=net.nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                # No mask: the private subnets share the rest of the block. The VPC CNI gives every
                # pod a VPC address, so these need the space.
                ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            ],
            enable_dns_hostnames=True,
            enable_dns_support=True,
        )
        # Checkpoints and model exports go to S3 in the same region: through the gateway endpoint
        # they are free, through the NAT gateway they are charged per GB.
        self.vpc.add_gateway_endpoint("S3Endpoint", service=ec2.GatewayVpcEndpointAwsService.S3)
        # Rejected flows only: cheap, and the first place to look when EFA traffic is blocked by a
        # security group.
        self.flow_logs = logs.LogGroup(self, "FlowLogs", retention=logs.RetentionDays.ONE_MONTH,
                                       removal_policy=cdk.RemovalPolicy.DESTROY)
        self.vpc.add_flow_log(
            "RejectedFlows",
            traffic_type=ec2.FlowLogTrafficType.REJECT,
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_logs),
        )
        cdk.CfnOutput(self, "VpcId", value=self.vpc.vpc_id, description="VPC of the cluster.")
        # Where the GPU nodes live; the EC2 target's launcher YAML reads it from here (an output of the EC2 stack
        # that only re-exported it would be an output of an import, cfn-lint W6001).
        self.gpu_subnet_id = self.vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                                                     availability_zones=[config.gpu_availability_zone]).subnet_ids[0]
        cdk.CfnOutput(self, "GpuSubnetId", value=self.gpu_subnet_id,
                      description="Private subnet in gpu_availability_zone (the EC2 target's nodes).")
