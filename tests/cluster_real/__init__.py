"""`make cluster-real`: the project's RayJob on a real kubelet node (docs/cluster-tier.md)."""
