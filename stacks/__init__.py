"""AWS CDK stacks: network, EKS cluster with EFA GPU node groups, checkpoint storage."""

from stacks.assembly import ProjectStacks, build, stack_names

__all__ = ["ProjectStacks", "build", "stack_names"]
