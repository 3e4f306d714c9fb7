"""EFA network-interface layout per instance: pure data, shared by the EKS launch template
(stacks/efa_nodegroup.py) and the EC2 cluster-launcher YAML (ops/launcher.py)."""

from __future__ import annotations

from dataclasses import dataclass

# The InterfaceType values EC2's RunInstances and launch templates accept (EC2 API reference,
# InstanceNetworkInterfaceSpecification.InterfaceType). botocore's model types the field as a free
# string, so nothing upstream of the launch would catch a typo: `interface_type_problem` does.
INTERFACE_TYPES = frozenset({"interface", "efa", "efa-only"})


@dataclass(frozen=True, kw_only=True)
class EfaInterface:
    """One network interface of a node: its network card, its device index on that card, its type."""

    card: int
    device: int
    kind: str


def efa_interface_layout(count: int) -> list[EfaInterface]:
    """Interfaces for `count` EFA devices, one per network card.

    One card (g6.12xlarge): a single `efa` interface (EFA with ENA) at card 0 / device 0, which also
    carries the node's IP traffic.

    Several cards (p4d.24xlarge: 4, p5en.48xlarge: 16, p5.48xlarge: 32) as the current EC2 guide lays
    them out ("Maximize network bandwidth on Amazon EC2 instances with multiple network cards",
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html): the primary interface
    at card 0 / device 0 is a plain ENA `interface` (an EFA-only interface cannot be primary); card 0's
    EFA is an `efa-only` interface at device 1; every further card gets an `efa-only` interface at
    device 0. `efa-only` interfaces take no subnet address, so the 32 devices of a p5 do not use up
    subnet IPs; the node has `count` EFA devices and one ENA interface.
    """
    if count < 1:
        raise ValueError(f"an EFA layout needs at least one EFA device, got {count}")
    if count == 1:
        return [EfaInterface(card=0, device=0, kind="efa")]
    return [EfaInterface(card=0, device=0, kind="interface"), EfaInterface(card=0, device=1, kind="efa-only"),
            *(EfaInterface(card=card, device=0, kind="efa-only") for card in range(1, count))]
