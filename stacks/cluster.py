"""The cluster stack: EKS (aws_eks_v2), managed add-ons, system and GPU node groups, Helm add-ons."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from config import ClusterConfig
from config.k8s import GPU_TAINT, system_node_labels
from stacks.autoscaler import ClusterAutoscaler
from stacks.efa_nodegroup import EfaNodeGroup
from stacks.helm_addons import EfaDevicePlugin, KubeRayOperator, NvidiaDevicePlugin
from stacks.launch_template import system_launch_template
from stacks.observability import MetricsStack
from stacks.pod_identity import pod_identity_principal
from stacks.versions import kubectl_layer, managed_addon_version

# The CloudWatch agent's service account, as the amazon-cloudwatch-observability add-on creates it.
CLOUDWATCH_NAMESPACE = "amazon-cloudwatch"
CLOUDWATCH_SERVICE_ACCOUNT = "cloudwatch-agent"
# Managed add-on settings. The VPC CNI's network-policy agent is off by default, and without it EKS
# stores NetworkPolicies (the Ray pods' among them) but enforces none.
#
# The node monitoring agent's `dcgm-server` DaemonSet (chart 1.7.0, values.yaml `dcgmAgent.tolerations: []`)
# tolerates nothing, so it never lands on the GPU nodes' `nvidia.com/gpu=true:NoSchedule` taint. The agent then
# reports DCGM errors, AcceleratedHardwareReady turns False, and node auto-repair cordons and reboots or
# replaces every GPU node about 10 minutes after it joins (aws/containers-roadmap#2567, #2555). The agent's own
# DaemonSet already tolerates everything (`nodeAgent.tolerations: [{operator: Exists}]`).
ADDON_CONFIGURATION: dict[str, dict] = {
    "vpc-cni": {"enableNetworkPolicy": "true"},
    "eks-node-monitoring-agent": {"dcgmAgent": {"tolerations": [GPU_TAINT.toleration()]}},
}


def endpoint_access(config: ClusterConfig) -> eks.EndpointAccess:
    """API endpoint access from the file; a public endpoint is narrowed to the listed CIDRs."""
    section = config.cluster
    if section.endpoint_access == "private":
        return eks.EndpointAccess.PRIVATE
    if section.endpoint_access == "public":
        # The model refuses CIDRs other than 0.0.0.0/0 here (a public-only endpoint cannot be narrowed).
        return eks.EndpointAccess.PUBLIC
    if section.public_access_cidrs == ["0.0.0.0/0"]:
        return eks.EndpointAccess.PUBLIC_AND_PRIVATE
    return eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*section.public_access_cidrs)


class ClusterStack(cdk.Stack):
    """Everything that changes with the cluster: control plane, nodes and the add-ons on them.

    Attributes for the stacks that build on it: `cluster`, `system_nodegroup`, `gpu_nodegroups`
    (by worker-group name) and `kuberay` (anything applying Ray objects must depend on its chart).
    """

    def __init__(self, scope: Construct, id: str, *, config: ClusterConfig, vpc: ec2.IVpc, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        section = config.cluster
        self.kubernetes_version = section.kubernetes_version
        # The file's explicit choice to open the API endpoint to the internet (stacks/nag.py acknowledges it).
        self.endpoint_open_to_internet = section.endpoint_open_to_internet and (
            section.endpoint_access == "public" or "0.0.0.0/0" in section.public_access_cidrs)
        private = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)

        # Deleted with the stack (not retained): it protects only this cluster's Kubernetes Secrets in etcd, which
        # go with the cluster. KMS never deletes a key at once; `cdk destroy` schedules it for deletion after the
        # shortest waiting period (KMS ScheduleKeyDeletion: 7 to 30 days), during which it can be cancelled.
        # A retained key (CDK's default for kms.Key) outlived every teardown.
        secrets_key = kms.Key(self, "SecretsKey", enable_key_rotation=True,
                              removal_policy=cdk.RemovalPolicy.DESTROY, pending_window=cdk.Duration.days(7),
                              description=f"Envelope encryption of Kubernetes secrets in {section.name}")
        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=section.name,
            version=eks.KubernetesVersion.of(section.kubernetes_version),
            vpc=vpc,
            vpc_subnets=[private],
            # Node groups are declared below, one per group in the file. Capacity 0 because otherwise
            # aws_eks_v2 adds a default node group of its own (2 x m5.large) beside them.
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            # The managed add-ons below replace EKS's self-managed copies instead of fighting them.
            bootstrap_self_managed_addons=False,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=kubectl_layer(self, "KubectlLayer", kubernetes_version=section.kubernetes_version)),
            endpoint_access=endpoint_access(config),
            cluster_logging=[
                eks.ClusterLoggingTypes.API,
                eks.ClusterLoggingTypes.AUDIT,
                eks.ClusterLoggingTypes.AUTHENTICATOR,
                eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
                eks.ClusterLoggingTypes.SCHEDULER,
            ],
            secrets_encryption_key=secrets_key,
        )
        if section.admin_role_arn:
            self.cluster.grant_access("AdminAccess", section.admin_role_arn, [
                eks.AccessPolicy.from_access_policy_name(
                    "AmazonEKSClusterAdminPolicy", access_scope_type=eks.AccessScopeType.CLUSTER)])

        # Networking add-ons must exist before any node can turn Ready.
        self.addons: dict[str, eks.Addon] = {
            name: self._addon(name) for name in ("vpc-cni", "kube-proxy")
        }
        self.addons["eks-pod-identity-agent"] = self.cluster.eks_pod_identity_agent
        # aws_eks_v2 creates this add-on itself and has no property for its version (aws/aws-cdk#32580).
        self.cluster.eks_pod_identity_agent.node.default_child.add_property_override(
            "AddonVersion", managed_addon_version(section.kubernetes_version, "eks-pod-identity-agent"))

        system = section.system_nodes
        system_template = system_launch_template(self, "SystemLaunchTemplate", cluster=self.cluster, config=config)
        self.system_nodegroup = self.cluster.add_nodegroup_capacity(
            "System",
            instance_types=[ec2.InstanceType(system.instance_type)],
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            release_version=section.node_ami_release_version,
            # Its own launch template (not EKS's default one) to pin IMDS and encrypt the root disk.
            launch_template_spec=eks.LaunchTemplateSpec(id=system_template.ref,
                                                        version=system_template.attr_latest_version_number),
            min_size=system.nodes,
            desired_size=system.nodes,
            max_size=system.nodes,
            subnets=private,
            labels=system_node_labels(),
            enable_node_auto_repair=True,
        )
        self.gpu_nodegroups: dict[str, EfaNodeGroup] = {
            group.name: EfaNodeGroup(self, f"Workers-{group.name}", cluster=self.cluster, config=config, group=group)
            for group in section.worker_groups
        }
        for nodegroup in self.nodegroups:
            for name in ("vpc-cni", "kube-proxy"):
                nodegroup.node.add_dependency(self.addons[name])

        # CoreDNS (and the CloudWatch agent) are Deployments: their add-ons only turn ACTIVE once a
        # node can run them.
        self.addons["coredns"] = self._addon("coredns")
        self.addons["coredns"].node.add_dependency(self.system_nodegroup)
        if section.cloudwatch_observability:
            self._cloudwatch_observability()
        # The node monitoring agent reports GPU (XID, NVML), kernel, network and storage faults as node
        # conditions; node auto-repair (on every node group) acts on them.
        self.addons["eks-node-monitoring-agent"] = self._addon("eks-node-monitoring-agent")
        self.addons["eks-node-monitoring-agent"].node.add_dependency(self.system_nodegroup)

        # Operators before their users: the device plugins and KubeRay need CoreDNS and a node to
        # run on; the Ray objects that use KubeRay's CRDs are applied after this stack (cdk8s).
        self.nvidia_device_plugin = NvidiaDevicePlugin(self, "NvidiaDevicePlugin", cluster=self.cluster)
        self.efa_device_plugin = (EfaDevicePlugin(self, "EfaDevicePlugin", cluster=self.cluster, config=config)
                                  if config.nccl.transport == "efa" else None)
        self.kuberay = KubeRayOperator(self, "KubeRayOperator", cluster=self.cluster, config=config)
        self.autoscaler = (ClusterAutoscaler(self, "ClusterAutoscaler", cluster=self.cluster, config=config)
                           if config.autoscaling.enabled else None)
        if self.autoscaler:
            self.autoscaler.association.node.add_dependency(self.addons["eks-pod-identity-agent"])
        self.metrics = (MetricsStack(self, "Metrics", cluster=self.cluster, config=config)
                        if config.observability.enabled else None)
        if self.metrics and self.metrics.dcgm_chart:
            # dcgm-exporter reads the agent's nv-hostengine (dcgm-server): the add-on first.
            self.metrics.dcgm_chart.node.add_dependency(self.addons["eks-node-monitoring-agent"])
        for chart in [self.nvidia_device_plugin.chart, self.kuberay.chart,
                      *([self.efa_device_plugin.chart] if self.efa_device_plugin else []),
                      *([self.autoscaler.chart] if self.autoscaler else []),
                      *(self.metrics.charts if self.metrics else [])]:
            chart.node.add_dependency(self.system_nodegroup)
            chart.node.add_dependency(self.addons["coredns"])

        cdk.CfnOutput(self, "ClusterName", value=self.cluster.cluster_name, description="EKS cluster name.")
        cdk.CfnOutput(self, "UpdateKubeconfigCommand",
                      value=f"aws eks update-kubeconfig --region {config.region} --name {self.cluster.cluster_name}",
                      description="Points kubectl at the cluster.")
        cdk.CfnOutput(self, "GpuAvailabilityZone", value=config.gpu_availability_zone,
                      description="The AZ all GPU nodes run in.")
        cdk.CfnOutput(self, "OnDemandUsdPerHour", value=f"{config.cost_per_hour:.2f}",
                      description="List price while a job runs, USD per hour (nodes, control plane, NAT).")
        cdk.CfnOutput(self, "IdleUsdPerHour", value=f"{config.idle_cost_per_hour:.2f}",
                      description="List price with no job running, USD per hour (control plane, NAT, system nodes, "
                                  "GPU group minimums).")

    @property
    def nodegroups(self) -> list[eks.Nodegroup]:
        """Every managed node group: the system one, then one per worker group."""
        return [self.system_nodegroup, *(g.nodegroup for g in self.gpu_nodegroups.values())]

    def _addon(self, name: str) -> eks.Addon:
        """A managed add-on at its pinned version (stacks/versions.py), with its configuration values if any."""
        return eks.Addon(self, f"Addon-{name}", cluster=self.cluster, addon_name=name,
                         addon_version=managed_addon_version(self.kubernetes_version, name),
                         configuration_values=ADDON_CONFIGURATION.get(name))

    def _cloudwatch_observability(self) -> None:
        """The CloudWatch observability add-on (Container Insights with GPU and EFA metrics)."""
        role = iam.Role(self, "CloudWatchAgentRole",
                        assumed_by=pod_identity_principal(self.cluster, namespace=CLOUDWATCH_NAMESPACE,
                                                          service_account=CLOUDWATCH_SERVICE_ACCOUNT),
                        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name("CloudWatchAgentServerPolicy")])
        association = eks.CfnPodIdentityAssociation(
            self, "CloudWatchAgentIdentity", cluster_name=self.cluster.cluster_name,
            namespace=CLOUDWATCH_NAMESPACE, service_account=CLOUDWATCH_SERVICE_ACCOUNT, role_arn=role.role_arn)
        association.node.add_dependency(self.addons["eks-pod-identity-agent"])
        addon = self._addon("amazon-cloudwatch-observability")
        addon.node.add_dependency(self.system_nodegroup, association)
        self.addons["amazon-cloudwatch-observability"] = addon
        self.cloudwatch_agent_role = role
