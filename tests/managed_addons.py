"""The pods of the EKS managed add-ons that ship no chart in ../shared/charts, for tests/test_placement.py.

vpc-cni, kube-proxy, eks-pod-identity-agent and coredns are installed on every cluster, and
amazon-cloudwatch-observability with `cluster.cloudwatch_observability: true` (stacks/cluster.py). EKS renders
them itself, so no chart here can be handed to helm; each entry below restates, for the add-on version pinned in
stacks/versions.py MANAGED_ADDON_VERSIONS, the fields the scheduler reads (requests and limits, tolerations,
nodeSelector, required node affinity, replicas) from the upstream source named beside it. Fields that do not
affect placement (images, probes, volumes, env) are left out. `READ_AT` is the add-on version each entry was read
for; tests/test_placement.py fails when the template pins another, so a version bump rereads the sources.

The eks-node-monitoring-agent add-on is not here: its chart is in ../shared/charts and is rendered with helm.
"""

from __future__ import annotations

from tests.placement import Workload

# The add-on build the figures below were read for (stacks/versions.py MANAGED_ADDON_VERSIONS["1.34"]).
READ_AT = {
    "vpc-cni": "v1.20.4-eksbuild.1",
    "kube-proxy": "v1.34.1-eksbuild.2",
    "eks-pod-identity-agent": "v1.3.10-eksbuild.1",
    "coredns": "v1.12.4-eksbuild.1",
    "amazon-cloudwatch-observability": "v4.10.3-eksbuild.1",
}

EXISTS = [{"operator": "Exists"}]  # tolerates every taint (`ToleratesTaint`: empty key with operator Exists)


def _node_affinity(*expressions: dict) -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": list(expressions)}]}}}


def _in(key: str, *values: str) -> dict:
    return {"key": key, "operator": "In", "values": list(values)}


def _not_in(key: str, *values: str) -> dict:
    return {"key": key, "operator": "NotIn", "values": list(values)}


LINUX = _in("kubernetes.io/os", "linux")
AMD64_ARM64 = _in("kubernetes.io/arch", "amd64", "arm64")
EC2_ONLY = _not_in("eks.amazonaws.com/compute-type", "fargate", "hybrid", "auto")


def _requests(**requests: str) -> dict:
    return {"requests": requests}


# ---- vpc-cni -------------------------------------------------------------------------------------
# aws/amazon-vpc-cni-k8s tag v1.20.4 (the add-on's image tag), charts/aws-vpc-cni/values.yaml: `resources.requests.cpu:
# 25m`, `init.resources: {}` and `nodeAgent.resources: {}`, which templates/daemonset.yaml fills with
# `default .Values.resources` (so the init container and the network policy agent `aws-eks-nodeagent`, on by
# default with `nodeAgent.enabled: true`, request 25m too; config/master/aws-k8s-cni.yaml at that tag is the same
# render); `tolerations: [{operator: Exists}]`; the affinity below. No memory request. The add-on's configuration
# here (`enableNetworkPolicy`) changes none of these.
AWS_NODE = {
    "initContainers": [{"name": "aws-vpc-cni-init", "resources": _requests(cpu="25m")}],
    "containers": [{"name": "aws-node", "resources": _requests(cpu="25m")},
                   {"name": "aws-eks-nodeagent", "resources": _requests(cpu="25m")}],
    "tolerations": EXISTS,
    "affinity": _node_affinity(LINUX, AMD64_ARM64, EC2_ONLY),
    "hostNetwork": True,
    "priorityClassName": "system-node-critical",
}

# ---- kube-proxy ----------------------------------------------------------------------------------
# No public source renders the kube-proxy add-on's DaemonSet for v1.34.1-eksbuild.2: EKS builds it from no public
# chart, and the add-on's configuration schema (`aws eks describe-addon-configuration`) lists `resources` without
# a default. The figures are those of the newest EKS kube-proxy DaemonSet published as read from a cluster:
# eksctl-io/eksctl pkg/addons/default/testdata/sample-1.25.json (commit 6ac614a57, 2023-06-21; image
# kube-proxy:v1.25.6-minimal-eksbuild.1): `requests: {cpu: 100m}`, `tolerations: [{operator: Exists}]` and the
# affinity below; every older dump there (1.15 to 1.23) has the same request and tolerations.
KUBE_PROXY = {
    "containers": [{"name": "kube-proxy", "resources": _requests(cpu="100m")}],
    "tolerations": EXISTS,
    "affinity": _node_affinity(LINUX, AMD64_ARM64, _not_in("eks.amazonaws.com/compute-type", "fargate")),
    "hostNetwork": True,
    "priorityClassName": "system-node-critical",
}

# ---- eks-pod-identity-agent ----------------------------------------------------------------------
# aws/eks-pod-identity-agent has no tag for the add-on's v1.3.10 (its tags are the image's, v0.1.x); the chart,
# charts/eks-pod-identity-agent at tag v0.1.36 (2025-11-20, the last before the add-on build became the default
# on 2025-11-24, aws/containers-roadmap#2684; unchanged at the snapshot's HEAD d4dc0f3): values.yaml
# `resources: {}` for both the init and the agent container (templates/daemonset.yaml), `tolerations:
# [{operator: Exists}]`, the affinity below; only `daemonsets.cloud` is created by default. It requests nothing
# but takes a pod slot on every node.
EKS_POD_IDENTITY_AGENT = {
    "initContainers": [{"name": "eks-pod-identity-agent-init", "resources": {}}],
    "containers": [{"name": "eks-pod-identity-agent", "resources": {}}],
    "tolerations": EXISTS,
    "affinity": _node_affinity(LINUX, AMD64_ARM64, EC2_ONLY),
    "hostNetwork": True,
    "priorityClassName": "system-node-critical",
}

# ---- coredns -------------------------------------------------------------------------------------
# The CoreDNS add-on's Deployment as an EKS 1.34 cluster runs it with image coredns:v1.12.4-eksbuild.1:
# eksctl-io/eksctl pkg/addons/default/assets/coredns-1.34.json at commit 7080053c4 (2025-10-28, dumped from a
# cluster by build/updates/dump-coredns-manifests.sh): 2 replicas, `requests: {cpu: 100m, memory: 70Mi}` and
# `limits: {memory: 170Mi}` (the EKS user guide "Manage CoreDNS" documents the same defaults), tolerations for
# `node-role.kubernetes.io/control-plane:NoSchedule` and `CriticalAddonsOnly` only (so not the GPU nodes'
# `nvidia.com/gpu` taint), required affinity on linux amd64/arm64, and a *preferred* pod anti-affinity on
# `kubernetes.io/hostname`, which lets both replicas share a node.
COREDNS_REPLICAS = 2
COREDNS = {
    "containers": [{"name": "coredns", "resources": {"requests": {"cpu": "100m", "memory": "70Mi"},
                                                     "limits": {"memory": "170Mi"}}}],
    "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
                    {"key": "CriticalAddonsOnly", "operator": "Exists"}],
    "affinity": _node_affinity(LINUX, AMD64_ARM64),
    "priorityClassName": "system-cluster-critical",
}

# ---- amazon-cloudwatch-observability -------------------------------------------------------------
# The add-on's vX.Y.Z ships chart X.Y.Z: aws-observability/helm-charts tag amazon-cloudwatch-observability-4.10.3,
# charts/amazon-cloudwatch-observability, rendered with its default values (helm template, clusterName and region
# set). The chart's own Deployment is the operator; the agent, dcgm-exporter and neuron-monitor are custom
# resources (AmazonCloudWatchAgent, DcgmExporter, NeuronMonitor) whose DaemonSets the operator
# (aws/amazon-cloudwatch-agent-operator v3.3.2, `manager.image.tag` in that values.yaml) builds with the resource's
# resources, tolerations, nodeSelector, affinity and hostNetwork copied as they are
# (internal/manifests/collector/daemonset.go, internal/manifests/dcgmexporter/daemonset.go and container.go,
# internal/manifests/neuronmonitor/). The three Windows DaemonSets select `kubernetes.io/os: windows`, which no
# node group here has, and are left out.
CLOUDWATCH_NAMESPACE = "amazon-cloudwatch"
LINUX_SELECTOR = {"kubernetes.io/os": "linux"}
NOT_FARGATE = _not_in("eks.amazonaws.com/compute-type", "fargate")
# values.yaml `dcgmExporter.affinity` (the `ml.*` SageMaker names of the same list are left out: no EKS node has
# them).
CLOUDWATCH_DCGM_INSTANCE_TYPES = (
    "g3.4xlarge g3.8xlarge g3.16xlarge g3s.xlarge g4ad.2xlarge g4ad.4xlarge g4ad.8xlarge g4ad.16xlarge g4ad.xlarge "
    "g4dn.2xlarge g4dn.4xlarge g4dn.8xlarge g4dn.12xlarge g4dn.16xlarge g4dn.metal g4dn.xlarge g5.2xlarge g5.4xlarge "
    "g5.8xlarge g5.12xlarge g5.16xlarge g5.24xlarge g5.48xlarge g5.xlarge g5g.2xlarge g5g.4xlarge g5g.8xlarge "
    "g5g.16xlarge g5g.metal g5g.xlarge g6.2xlarge g6.4xlarge g6.8xlarge g6.12xlarge g6.16xlarge g6.24xlarge "
    "g6.48xlarge g6.xlarge g6e.2xlarge g6e.4xlarge g6e.8xlarge g6e.12xlarge g6e.16xlarge g6e.24xlarge g6e.48xlarge "
    "g6e.xlarge gr6.4xlarge gr6.8xlarge p2.8xlarge p2.16xlarge p2.xlarge p3.2xlarge p3.8xlarge p3.16xlarge "
    "p3dn.24xlarge p4d.24xlarge p4de.24xlarge p5.48xlarge p5e.48xlarge p5en.48xlarge p6-b200.48xlarge "
    "p6-b300.48xlarge p6e-gb200.36xlarge").split()
# values.yaml `neuronMonitor.affinity` (Trainium and Inferentia types; `ml.*` names left out as above).
CLOUDWATCH_NEURON_INSTANCE_TYPES = (
    "trn1.2xlarge trn1.32xlarge trn1n.32xlarge trn2.3xlarge trn2.48xlarge trn2a.48xlarge trn2n.48xlarge "
    "trn2u.48xlarge inf1.xlarge inf1.2xlarge inf1.6xlarge inf1.24xlarge inf2.xlarge inf2.8xlarge inf2.24xlarge "
    "inf2.48xlarge").split()
# templates/operator-deployment.yaml with values.yaml `manager.resources` (no limits) and `nodeSelector`; no
# tolerations, so never on a tainted GPU node.
CLOUDWATCH_OPERATOR = {
    "containers": [{"name": "manager", "resources": _requests(cpu="100m", memory="64Mi")}],
    "nodeSelector": LINUX_SELECTOR,
}
# templates/linux/cloudwatch-agent-custom-resource.yaml with values.yaml `agent.resources`: requests 250m/128Mi,
# limits 500m/512Mi; `hostNetwork: true` is written into the template itself (since chart 2.0.0,
# aws-observability/helm-charts 0595aa2 "Add hostNetwork: true for cloudwatch agent pod on linux"), so the agent
# reaches IMDS from the node (stacks/launch_template.py).
CLOUDWATCH_AGENT = {
    "containers": [{"name": "cloudwatch-agent", "resources": {"requests": {"cpu": "250m", "memory": "128Mi"},
                                                              "limits": {"cpu": "500m", "memory": "512Mi"}}}],
    "tolerations": EXISTS,
    "nodeSelector": LINUX_SELECTOR,
    "affinity": _node_affinity(NOT_FARGATE),
    "hostNetwork": True,
    "priorityClassName": "system-node-critical",
}
# templates/linux/fluent-bit-daemonset.yaml with values.yaml `containerLogs.fluentBit.resources`: requests 50m/25Mi,
# limits 500m/250Mi.
CLOUDWATCH_FLUENT_BIT = {
    "containers": [{"name": "fluent-bit", "resources": {"requests": {"cpu": "50m", "memory": "25Mi"},
                                                        "limits": {"cpu": "500m", "memory": "250Mi"}}}],
    "tolerations": EXISTS,
    "nodeSelector": LINUX_SELECTOR,
    "affinity": _node_affinity(NOT_FARGATE),
    "hostNetwork": True,
    "priorityClassName": "system-node-critical",
}
# templates/linux/dcgm-exporter-daemonset.yaml (a DcgmExporter resource) with values.yaml `dcgmExporter.resources`:
# requests 250m/128Mi, limits 500m/750Mi. Besides the project's own dcgm-exporter when `observability.dcgm_exporter`
# is on (another namespace; both on every GPU node).
CLOUDWATCH_DCGM_EXPORTER = {
    "containers": [{"name": "dcgm-exporter", "resources": {"requests": {"cpu": "250m", "memory": "128Mi"},
                                                           "limits": {"cpu": "500m", "memory": "750Mi"}}}],
    "tolerations": EXISTS,
    "nodeSelector": LINUX_SELECTOR,
    "affinity": _node_affinity(_in("node.kubernetes.io/instance-type", *CLOUDWATCH_DCGM_INSTANCE_TYPES), NOT_FARGATE),
}
# templates/linux/neuron-monitor-daemonset.yaml (a NeuronMonitor resource) with values.yaml
# `neuronMonitor.resources`: requests 256m/128Mi, limits 500m/500Mi.
CLOUDWATCH_NEURON_MONITOR = {
    "containers": [{"name": "neuron-monitor", "resources": {"requests": {"cpu": "256m", "memory": "128Mi"},
                                                            "limits": {"cpu": "500m", "memory": "500Mi"}}}],
    "tolerations": EXISTS,
    "nodeSelector": LINUX_SELECTOR,
    "affinity": _node_affinity(_in("node.kubernetes.io/instance-type", *CLOUDWATCH_NEURON_INSTANCE_TYPES),
                               NOT_FARGATE),
}


def _workload(addon: str, kind: str, namespace: str, name: str, pod_spec: dict) -> Workload:
    # Keyed `<namespace>/<name>`: the CloudWatch add-on's dcgm-exporter shares its name with the metrics stack's.
    return Workload(source=f"add-on {addon} {READ_AT[addon]}", kind=kind, name=f"{namespace}/{name}",
                    pod_spec=pod_spec)


ADDON_WORKLOADS: dict[str, list[Workload]] = {
    "vpc-cni": [_workload("vpc-cni", "DaemonSet", "kube-system", "aws-node", AWS_NODE)],
    "kube-proxy": [_workload("kube-proxy", "DaemonSet", "kube-system", "kube-proxy", KUBE_PROXY)],
    "eks-pod-identity-agent": [_workload("eks-pod-identity-agent", "DaemonSet", "kube-system",
                                         "eks-pod-identity-agent", EKS_POD_IDENTITY_AGENT)],
    "coredns": [_workload("coredns", "Deployment", "kube-system", "coredns", COREDNS)],
    "amazon-cloudwatch-observability": [
        _workload("amazon-cloudwatch-observability", "Deployment", CLOUDWATCH_NAMESPACE,
                  "amazon-cloudwatch-observability-controller-manager", CLOUDWATCH_OPERATOR),
        _workload("amazon-cloudwatch-observability", "DaemonSet", CLOUDWATCH_NAMESPACE, "cloudwatch-agent",
                  CLOUDWATCH_AGENT),
        _workload("amazon-cloudwatch-observability", "DaemonSet", CLOUDWATCH_NAMESPACE, "fluent-bit",
                  CLOUDWATCH_FLUENT_BIT),
        _workload("amazon-cloudwatch-observability", "DaemonSet", CLOUDWATCH_NAMESPACE, "dcgm-exporter",
                  CLOUDWATCH_DCGM_EXPORTER),
        _workload("amazon-cloudwatch-observability", "DaemonSet", CLOUDWATCH_NAMESPACE, "neuron-monitor",
                  CLOUDWATCH_NEURON_MONITOR),
    ],
}
# Deployments' replicas (the add-on's default; the scheduler places each replica as one pod).
REPLICAS = {"Deployment/kube-system/coredns": COREDNS_REPLICAS,
            f"Deployment/{CLOUDWATCH_NAMESPACE}/amazon-cloudwatch-observability-controller-manager": 1}
