"""Builds the project's stacks from one loaded variable file: network, storage and either the EKS cluster
(`target: eks`) or the EC2 launcher stack (`target: ec2`)."""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from config import ClusterConfig
from stacks.cluster import ClusterStack
from stacks.ec2 import Ec2ClusterStack
from stacks.helm_addons import CustomResourceServiceTimeout
from stacks.nag import acknowledge_findings, project_checks
from stacks.network import NetworkStack
from stacks.storage import StorageStack


@dataclass(frozen=True, kw_only=True)
class ProjectStacks:
    """The stacks, split by what changes together."""

    network: NetworkStack
    cluster: ClusterStack | None
    storage: StorageStack
    ec2: Ec2ClusterStack | None = None


def stack_names(config: ClusterConfig) -> dict[str, str]:
    """CloudFormation stack names of `config.target`'s stacks (also the template file names in cdk.out)."""
    name = config.cluster.name
    third = "ec2" if config.target == "ec2" else "cluster"
    return {"network": f"{name}-network", third: f"{name}-{third}", "storage": f"{name}-storage"}


def build(app: cdk.App, config: ClusterConfig, *, nag: bool = False) -> ProjectStacks:
    """Add the network, storage and cluster (EKS) or EC2 stacks for `config` to `app`.

    Region-only environment: synthesis needs no account or credentials, and the AZs come from the
    file. `nag` adds cdk-nag's AwsSolutions checks as a policy-validation plugin.
    """
    env = cdk.Environment(region=config.region)
    names = stack_names(config)
    network = NetworkStack(app, names["network"], config=config, env=env,
                           description=f"{config.cluster.name}: VPC, NAT and S3 endpoint")
    if config.target == "ec2":
        # No Kubernetes: the bucket without Pod Identity, and Ray's cluster launcher's prerequisites.
        storage = StorageStack(app, names["storage"], config=config, cluster=None, env=env,
                               description=f"{config.cluster.name}: checkpoint bucket")
        ec2_stack = Ec2ClusterStack(app, names["ec2"], config=config, vpc=network.vpc, env=env,
                                    description=f"{config.cluster.name}: placement group, security group, instance "
                                                "profiles and Ray token for `ray up` on EC2")
        ec2_stack.add_stack_dependency(storage, "the instance roles reach the checkpoint bucket by name")
        stacks = ProjectStacks(network=network, cluster=None, storage=storage, ec2=ec2_stack)
        acknowledge_findings(network=network, cluster_stack=None, storage=storage)
    else:
        cluster = ClusterStack(app, names["cluster"], config=config, vpc=network.vpc, env=env,
                               description=f"{config.cluster.name}: EKS, EFA GPU node groups, device plugins, KubeRay")
        storage = StorageStack(app, names["storage"], config=config, cluster=cluster.cluster, env=env,
                               description=f"{config.cluster.name}: checkpoint bucket and Ray Pod Identity")
        stacks = ProjectStacks(network=network, cluster=cluster, storage=storage)
        acknowledge_findings(network=network, cluster_stack=cluster, storage=storage)
    for stack in (network, stacks.cluster, storage, stacks.ec2):
        if stack is not None:
            cdk.Aspects.of(stack).add(CustomResourceServiceTimeout())
    if nag:
        # AwsSolutions, and the project's own AWS::EKS::Cluster rules (stacks/nag.py), which AwsSolutions lacks.
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app), project_checks(app))
    return stacks
