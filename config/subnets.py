"""The subnets CDK's `ec2.Vpc` carves from the VPC block, computed the way CDK does, so a VPC too small (or
carved past its end) is refused by `config check` rather than by `cdk synth` or CloudFormation.

stacks/network.py asks for one public /24 per AZ, then one private subnet per AZ with no mask (they share
the rest). aws-cdk-lib 2.275.0, aws-ec2/lib/ip-addresses.js `Cidr.allocateSubnetsCidr` allocates the
subnets with a mask first, in order, then gives the others `NetworkBuilder.maskForRemainingSubnets(n)`:
`32 - floor(log2(floor(remaining / n)))`; aws-ec2/lib/network-util.js `NetworkBuilder.addSubnets` throws
for a mask outside /16../28 or when `count` blocks from the next free address pass the end of the VPC,
and `CidrBlock(ip, mask)` starts a block at the first multiple of its size at or after the next free
address (the space check above does not see that alignment, so a block can still end past the VPC: we
refuse that too, since EC2 refuses such a subnet at deploy time).
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

PUBLIC_MASK = 24
SUBNET_MASK_MIN, SUBNET_MASK_MAX = 16, 28


@dataclass(frozen=True, kw_only=True)
class SubnetPlan:
    """The carved blocks (public then private, one each per AZ), or why CDK or EC2 would refuse them."""

    public: list[ipaddress.IPv4Network]
    private: list[ipaddress.IPv4Network]
    problem: str | None


def carve(vpc_cidr: str, azs: int) -> SubnetPlan:
    """The subnets `ec2.Vpc` makes from `vpc_cidr` over `azs` AZs (see the module docstring)."""
    vpc = ipaddress.IPv4Network(vpc_cidr)
    end = int(vpc.broadcast_address)
    state = {"next": int(vpc.network_address)}
    public: list[ipaddress.IPv4Network] = []
    private: list[ipaddress.IPv4Network] = []

    def add(mask: float, into: list) -> str | None:
        if not SUBNET_MASK_MIN <= mask <= SUBNET_MASK_MAX:
            shown = "an empty block" if math.isinf(mask) else f"/{int(mask)}"
            return f"leaves {shown} for each private subnet (CDK needs /{SUBNET_MASK_MIN} to /{SUBNET_MASK_MAX})"
        size = 2 ** (32 - int(mask))
        if state["next"] + size - 1 > end:
            return f"has no room for another /{int(mask)} subnet"
        start = -(-state["next"] // size) * size  # CidrBlock(ip, mask): the first aligned block at or after ip
        if start + size - 1 > end:
            return f"puts a /{int(mask)} subnet past its end once aligned"
        into.append(ipaddress.IPv4Network((start, int(mask))))
        state["next"] = start + size
        return None

    for _ in range(azs):
        if problem := add(PUBLIC_MASK, public):
            return SubnetPlan(public=public, private=private, problem=problem)
    remaining = end - state["next"] + 1
    per_subnet = remaining // azs
    mask = 32 - math.floor(math.log2(per_subnet)) if per_subnet > 0 else math.inf
    for _ in range(azs):
        if problem := add(mask, private):
            return SubnetPlan(public=public, private=private, problem=problem)
    return SubnetPlan(public=public, private=private, problem=None)
