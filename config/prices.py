"""On-demand cost of the cluster: idle and while a job runs (instance prices from the catalog)."""

from __future__ import annotations

from functools import cached_property

EKS_CONTROL_PLANE_USD_PER_HOUR = 0.10
NAT_GATEWAY_USD_PER_HOUR = 0.045


class CostsMixin:
    """`ClusterConfig`'s costs (needs the topology: `instance`, `system_instance`, `group_min`)."""

    @cached_property
    def idle_cost_per_hour(self) -> float:
        """On-demand cost with no job running, USD per hour: control plane, NAT, system nodes and each GPU group's
        minimum (0 nodes under the autoscaler by default)."""
        fixed = self.system_instance.usd_per_hour * self.cluster.system_nodes.nodes
        fixed += EKS_CONTROL_PLANE_USD_PER_HOUR + NAT_GATEWAY_USD_PER_HOUR * self.network.nat_gateways
        return fixed + sum(self.instance(g).usd_per_hour * self.group_min(g) for g in self.cluster.worker_groups)

    @cached_property
    def cost_per_hour(self) -> float:
        """On-demand cost while a job runs, USD per hour: the idle cost plus each GPU group up to `nodes`."""
        extra = sum(self.instance(g).usd_per_hour * max(0, g.nodes - self.group_min(g))
                    for g in self.cluster.worker_groups)
        return self.idle_cost_per_hour + extra
