"""Cluster add-ons installed as Helm charts, one small construct each (versions in `stacks.versions`)."""

from __future__ import annotations

import aws_cdk as cdk
import jsii
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct, IConstruct

from config import ClusterConfig
from config.k8s import EFA_PRESENT_LABEL, GPU_PRESENT_LABEL, GPU_TAINT, system_node_labels
from stacks.versions import EFA_DEVICE_PLUGIN, NVIDIA_DEVICE_PLUGIN, ChartPin, kuberay_operator

# aws_eks_v2's kubectl handler Lambda (it runs `helm upgrade --install`) and the custom-resource framework's
# onEvent Lambda in front of it both time out at 15 minutes (aws-cdk-lib 2.275.0, aws-eks-v2/lib/kubectl-provider.js:
# `new lambda.Function(this, "Handler", {timeout: Duration.minutes(15)})`; custom-resources provider-framework's
# onEvent function, same default). A Helm timeout equal to it (CDK's own maximum, helm-chart.js
# `HelmChartTimeoutCannotHigher`) kills both Lambdas together: nothing reports the failure, and CloudFormation
# waits out the custom resource's timeout (an hour by default) without a message.
KUBECTL_HANDLER_TIMEOUT_S = 15 * 60
# Helm gives up first, 120 s before the handler, so the handler still has time to report helm's own error.
HELM_TIMEOUT_S = KUBECTL_HANDLER_TIMEOUT_S - 120
# CloudFormation's wait for a custom resource's answer (the `ServiceTimeout` property of
# AWS::CloudFormation::CustomResource and Custom::*, 1 to 3600 s, default 3600; cfn-lint's provider schema): a
# minute past the Lambdas' own limit, so a handler that died without answering fails the stack in 16 minutes,
# not 60.
CUSTOM_RESOURCE_SERVICE_TIMEOUT_S = KUBECTL_HANDLER_TIMEOUT_S + 60


def pinned_chart(scope: Construct, cluster: eks.ICluster, pin: ChartPin, values: dict) -> eks.HelmChart:
    """`pin` installed with Helm by the cluster's kubectl handler, waiting for its resources to be ready."""
    # No `skip_crds`: aws_eks_v2 writes SkipCrds only when true (helm-chart.js `SkipCrds: skipCrds || undefined`),
    # and Helm installs a chart's crds/ directory by default, which is what the KubeRay chart's CRDs need.
    return eks.HelmChart(
        scope, "Chart", cluster=cluster, chart=pin.chart, repository=pin.repository, version=pin.version,
        release=pin.release, namespace=pin.namespace, create_namespace=True, values=values,
        wait=True, timeout=cdk.Duration.seconds(HELM_TIMEOUT_S),
    )


@jsii.implements(cdk.IAspect)
class CustomResourceServiceTimeout:
    """Gives every custom resource in the stack a `ServiceTimeout` (CUSTOM_RESOURCE_SERVICE_TIMEOUT_S) where it has
    none: the Helm charts, the kubectl manifests and CDK's own providers alike."""

    def visit(self, node: IConstruct) -> None:
        if isinstance(node, cdk.CfnResource) and (node.cfn_resource_type.startswith("Custom::")
                                                  or node.cfn_resource_type == "AWS::CloudFormation::CustomResource"):
            node.add_property_override("ServiceTimeout", CUSTOM_RESOURCE_SERVICE_TIMEOUT_S)


class NvidiaDevicePlugin(Construct):
    """NVIDIA's device plugin DaemonSet: advertises `nvidia.com/gpu` on the GPU nodes."""

    def __init__(self, scope: Construct, id: str, *, cluster: eks.ICluster, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        self.values = {
            "nodeSelector": {GPU_PRESENT_LABEL: "true"},
            "tolerations": [GPU_TAINT.toleration(), {"key": "CriticalAddonsOnly", "operator": "Exists"}],
        }
        self.chart = pinned_chart(self, cluster, NVIDIA_DEVICE_PLUGIN, self.values)


class EfaDevicePlugin(Construct):
    """The EFA device plugin DaemonSet: advertises `vpc.amazonaws.com/efa` on EFA nodes."""

    def __init__(self, scope: Construct, id: str, *, cluster: eks.ICluster, config: ClusterConfig, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        efa_types = sorted({g.instance_type for g in config.cluster.worker_groups if config.instance(g).has_efa})
        self.values = {
            "nodeSelector": {EFA_PRESENT_LABEL: "true"},
            "tolerations": [GPU_TAINT.toleration()],
            # The chart's node affinity only admits instance types on its own list; name ours so a
            # type the chart's list lags behind on still gets the plugin.
            "supportedInstanceLabels": {"keys": ["node.kubernetes.io/instance-type"], "values": efa_types},
        }
        self.chart = pinned_chart(self, cluster, EFA_DEVICE_PLUGIN, self.values)


class KubeRayOperator(Construct):
    """The KubeRay operator and its CRDs (from the chart), on the system nodes."""

    def __init__(self, scope: Construct, id: str, *, cluster: eks.ICluster, config: ClusterConfig, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        self.pin = kuberay_operator(config.ray.kuberay_version)
        self.values = {"nodeSelector": system_node_labels()}
        self.chart = pinned_chart(self, cluster, self.pin, self.values)
