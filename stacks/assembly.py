"""Builds the project's three stacks from one loaded variable file."""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from config import ClusterConfig
from stacks.cluster import ClusterStack
from stacks.nag import acknowledge_findings
from stacks.network import NetworkStack
from stacks.storage import StorageStack


@dataclass(frozen=True, kw_only=True)
class ProjectStacks:
    """The stacks, split by what changes together."""

    network: NetworkStack
    cluster: ClusterStack
    storage: StorageStack


def stack_names(config: ClusterConfig) -> dict[str, str]:
    """CloudFormation stack names (also the template file names in cdk.out)."""
    name = config.cluster.name
    return {"network": f"{name}-network", "cluster": f"{name}-cluster", "storage": f"{name}-storage"}


def build(app: cdk.App, config: ClusterConfig, *, nag: bool = False) -> ProjectStacks:
    """Add the network, cluster and storage stacks for `config` to `app`.

    Region-only environment: synthesis needs no account or credentials, and the AZs come from the
    file. `nag` adds cdk-nag's AwsSolutions checks as a policy-validation plugin.
    """
    env = cdk.Environment(region=config.region)
    names = stack_names(config)
    network = NetworkStack(app, names["network"], config=config, env=env,
                           description=f"{config.cluster.name}: VPC, NAT and S3 endpoint")
    cluster = ClusterStack(app, names["cluster"], config=config, vpc=network.vpc, env=env,
                           description=f"{config.cluster.name}: EKS, EFA GPU node groups, device plugins, KubeRay")
    storage = StorageStack(app, names["storage"], config=config, cluster=cluster.cluster, env=env,
                           description=f"{config.cluster.name}: checkpoint bucket and Ray Pod Identity")
    stacks = ProjectStacks(network=network, cluster=cluster, storage=storage)
    acknowledge_findings(network=network, cluster_stack=cluster, storage=storage)
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return stacks
