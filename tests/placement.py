"""Where Kubernetes would place a pod, by its own rules, on the nodes the synthesized stacks create.

Reusable by any test: give it rendered objects (tests/helm.py renders the pinned charts with the values of the
synthesized template) and the node groups read from that template, and it answers whether a pod can be placed
on a node group and what is left of the node once the DaemonSets that land there take their share.

The rules follow the upstream sources, Kubernetes v1.34:
- taints and tolerations: `k8s.io/api/core/v1/toleration.go` `ToleratesTaint` (an empty effect matches every
  effect; an empty key with operator `Exists` matches every taint; operator `Exists` ignores the value, `Equal`,
  the default, compares it) and `pkg/scheduler/framework/plugins/tainttoleration` (only `NoSchedule` and
  `NoExecute` taints filter; `PreferNoSchedule` only scores);
- `nodeSelector` and required node affinity: `k8s.io/component-helpers/scheduling/corev1/nodeaffinity`
  (`nodeSelectorTerms` are ORed, the expressions of one term ANDed, a term without expressions matches no node;
  `NotIn` and `DoesNotExist` match a node without the label; `Gt`/`Lt` compare integers);
- requests: `k8s.io/component-helpers/resource/helpers.go` `PodRequests` (the containers' sum, sidecars
  (init containers with `restartPolicy: Always`) added, at least the largest regular init container together
  with the sidecars started before it, plus `overhead`), with API defaulting of a missing request to its limit
  (`pkg/apis/core/v1/defaults.go` `SetDefaults_Container`), checked by `noderesources.Fit` against allocatable
  minus the requests of the pods already on the node, one pod slot each.

A DaemonSet's pods go to every node their template's tolerations and node affinity allow (the DaemonSet
controller's `NodeShouldRunDaemonPod`); the tolerations that controller adds itself (`node.kubernetes.io/*`
conditions) match none of the taints this project sets, so they are left out.

Allocatable is the EKS AL2023 AMI's own formula, nodeadm at awslabs/amazon-eks-ami tag v20260724:
`nodeadm/internal/kubelet/config.go` `withDefaultReservedResources` sets kube-reserved CPU by
`getCPUMillicoresToReserve` (6% of the first core, 1% of the second, 0.5% of cores 3-4, 0.25% of the rest) and
memory by `getMemoryMebibytesToReserve` (11 MiB x max pods + 255 MiB), no system-reserved, and
`defaultKubeletSubConfig` the hard eviction threshold `memory.available: 100Mi`; max pods is
`nodeadm/internal/kubelet/eni_max_pods.go` `calculateStandardMaxPods` (ENIs x (IPv4 addresses per ENI - 1) + 2)
from its embedded `instance-info.jsonl` (excerpted in NODEADM_INSTANCE_INFO). The kubelet subtracts the huge
pages it finds from allocatable memory (`pkg/kubelet/nodestatus/setters.go` `MachineInfo`). Capacity is the
EC2 nominal vCPUs and memory (config/instances.yaml), as Cluster Autoscaler's AWS provider also assumes
(`cloudprovider/aws/aws_manager.go` `buildNodeFromTemplate`); the kernel keeps some of that memory, which this
model does not subtract.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from fractions import Fraction

from config.catalog import load_catalog
from config.k8s import (
    EFA_RESOURCE,
    GPU_RESOURCE,
    HUGEPAGES_RESOURCE,
    ROLE_LABEL,
    WORKER_GROUP_LABEL,
    cfn_taint_effect,
)

# ---- quantities ---------------------------------------------------------------------------------

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1, "k": 10**3,
            "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")


def quantity(value: str | int | float) -> Fraction:
    """A Kubernetes resource quantity (`apimachinery/pkg/api/resource/quantity.go` forms) in base units:
    cores for cpu, bytes for memory, a count otherwise."""
    if isinstance(value, (int, float)):
        return Fraction(str(value))
    match = _QUANTITY.match(str(value).strip())
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    number, suffix = Fraction(match.group(1)), match.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


MIB = 2**20

# ---- nodes --------------------------------------------------------------------------------------

# awslabs/amazon-eks-ami v20260724 nodeadm/internal/kubelet/instance-info.jsonl, the lines for every type in
# config/instances.yaml: instance type -> (defaultMaxENIs, ipv4AddressesPerInterface).
NODEADM_INSTANCE_INFO = {
    "g6.xlarge": (4, 15), "g6.2xlarge": (4, 15), "g6.4xlarge": (8, 30), "g6.8xlarge": (8, 30),
    "g6.12xlarge": (8, 30), "g6.16xlarge": (15, 50), "g6.24xlarge": (15, 50), "g6.48xlarge": (15, 50),
    "g6e.xlarge": (4, 15), "g6e.2xlarge": (4, 15), "g6e.4xlarge": (8, 30), "g6e.8xlarge": (8, 30),
    "g6e.12xlarge": (10, 30), "g6e.16xlarge": (15, 50), "g6e.24xlarge": (10, 50), "g6e.48xlarge": (10, 50),
    "g5.xlarge": (4, 15), "g5.2xlarge": (4, 15), "g5.4xlarge": (8, 30), "g5.8xlarge": (8, 30),
    "g5.12xlarge": (15, 50), "g5.16xlarge": (8, 30), "g5.24xlarge": (15, 50), "g5.48xlarge": (7, 50),
    "p4d.24xlarge": (15, 50), "p5.48xlarge": (2, 50), "p5e.48xlarge": (2, 50), "p5en.48xlarge": (4, 50),
    "m7i.large": (3, 10), "m7i.xlarge": (4, 15), "m7i.2xlarge": (4, 15), "m7i.4xlarge": (8, 30),
    "m7i.8xlarge": (8, 30), "m7i.12xlarge": (8, 30), "m7i.16xlarge": (15, 50),
    "m6i.large": (3, 10), "m6i.xlarge": (4, 15), "m6i.2xlarge": (4, 15), "m6i.4xlarge": (8, 30),
    "m6i.8xlarge": (8, 30), "m6i.12xlarge": (8, 30), "m6i.16xlarge": (15, 50),
}
EVICTION_HARD_MEMORY = 100 * MIB  # nodeadm defaultKubeletSubConfig: evictionHard memory.available 100Mi


def max_pods(instance_type: str) -> int:
    """nodeadm's `calculateStandardMaxPods` for the type."""
    enis, ips = NODEADM_INSTANCE_INFO[instance_type]
    return enis * (ips - 1) + 2


def kube_reserved_cpu_millicores(millicores: int) -> int:
    """nodeadm's `getCPUMillicoresToReserve` (integer arithmetic as in Go)."""
    bounds, per_10k = [0, 1000, 2000, 4000, millicores], [600, 100, 50, 25]
    return sum((min(millicores, bounds[i + 1]) - bounds[i]) * per_10k[i] // 10000
               for i in range(4) if millicores > bounds[i])


def kube_reserved_memory_mib(pods: int) -> int:
    """nodeadm's `getMemoryMebibytesToReserve`."""
    return 11 * pods + 255


@dataclass(frozen=True, kw_only=True)
class NodeGroup:
    """One managed node group as the template declares it: what its nodes are labelled, tainted and hold."""

    name: str
    instance_type: str
    labels: dict[str, str]
    taints: list[dict]  # Kubernetes form: key, value, effect
    capacity: dict[str, Fraction]  # hardware: cpu, memory, pods, hugepages-2Mi, nvidia.com/gpu, EFA devices
    is_gpu: bool

    def base_allocatable(self) -> dict[str, Fraction]:
        """Capacity less nodeadm's kube-reserved, the hard eviction threshold and the huge pages (before any
        device plugin: GPUs and EFA devices are advertised only where their plugin runs)."""
        pods = int(self.capacity["pods"])
        cpu_m = int(self.capacity["cpu"] * 1000)
        hugepages = self.capacity.get(HUGEPAGES_RESOURCE, Fraction(0))
        return {
            "cpu": Fraction(cpu_m - kube_reserved_cpu_millicores(cpu_m), 1000),
            "memory": self.capacity["memory"] - kube_reserved_memory_mib(pods) * MIB - EVICTION_HARD_MEMORY
            - hugepages,
            "pods": Fraction(pods),
            **({HUGEPAGES_RESOURCE: hugepages} if hugepages else {}),
        }


def _nodegroup_instance_type(template: dict, props: dict) -> str:
    if props.get("InstanceTypes"):
        return props["InstanceTypes"][0]
    ref = props["LaunchTemplate"]["Id"]["Ref"]
    return template["Resources"][ref]["Properties"]["LaunchTemplateData"]["InstanceType"]


def _hugepages(template: dict, props: dict) -> int:
    """2 MiB pages the node's user data reserves (`sysctl -w vm.nr_hugepages=N`), 0 if none."""
    lt = props.get("LaunchTemplate")
    if not lt:
        return 0
    data = template["Resources"][lt["Id"]["Ref"]]["Properties"]["LaunchTemplateData"].get("UserData")
    match = re.search(r"sysctl -w vm\.nr_hugepages=(\d+)", json.dumps(data) if data else "")
    return int(match.group(1)) if match else 0


def node_groups(template: dict) -> list[NodeGroup]:
    """Every `AWS::EKS::Nodegroup` of a synthesized template, with the labels the kubelet and EKS add
    (`kubernetes.io/os`, `kubernetes.io/arch`, `node.kubernetes.io/instance-type`, `eks.amazonaws.com/*`)."""
    groups = []
    for logical_id, res in template["Resources"].items():
        if res["Type"] != "AWS::EKS::Nodegroup":
            continue
        props = res["Properties"]
        itype_name = _nodegroup_instance_type(template, props)
        itype = load_catalog().instances[itype_name]
        labels = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "node.kubernetes.io/instance-type": itype_name,
                  "eks.amazonaws.com/capacityType": props.get("CapacityType", "ON_DEMAND"),
                  **(props.get("Labels") or {})}
        taints = [{"key": t["Key"], "value": t.get("Value", ""),
                   "effect": next(k for k in ("NoSchedule", "PreferNoSchedule", "NoExecute")
                                  if cfn_taint_effect(k) == t["Effect"])} for t in props.get("Taints") or []]
        pages = _hugepages(template, props)
        capacity = {"cpu": Fraction(itype.vcpus), "memory": Fraction(int(itype.memory_gib * 1024)) * MIB,
                    "pods": Fraction(max_pods(itype_name)),
                    **({HUGEPAGES_RESOURCE: Fraction(pages * 2 * MIB)} if pages else {}),
                    **({GPU_RESOURCE: Fraction(itype.gpus)} if itype.gpus else {}),
                    **({EFA_RESOURCE: Fraction(itype.efa_interfaces)} if itype.efa_interfaces else {})}
        name = labels.get(WORKER_GROUP_LABEL) or labels.get(ROLE_LABEL) or logical_id
        groups.append(NodeGroup(name=name, instance_type=itype_name,
                                labels=labels, taints=taints, capacity=capacity, is_gpu=bool(itype.gpus)))
    return groups

# ---- scheduling rules ---------------------------------------------------------------------------


def tolerates(toleration: dict, taint: dict) -> bool:
    """`ToleratesTaint`."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    # An empty key with operator Equal gets here too; API validation refuses such a toleration
    # (pkg/apis/core/validation: "operator must be Exists when `key` is empty").
    if (toleration.get("operator") or "Equal") == "Exists":
        return True
    return (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated_taints(pod_spec: dict, group: NodeGroup) -> list[dict]:
    """The node's NoSchedule/NoExecute taints no toleration of the pod matches (empty: the taints allow it)."""
    tolerations = pod_spec.get("tolerations") or []
    return [t for t in group.taints if t["effect"] in ("NoSchedule", "NoExecute")
            and not any(tolerates(tol, t) for tol in tolerations)]


def _requirement_matches(req: dict, labels: dict[str, str]) -> bool:
    key, operator, values = req["key"], req["operator"], req.get("values") or []
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt"):
        try:
            have, want = int(labels[key]), int(values[0])
        except (KeyError, ValueError, IndexError):
            return False
        return have > want if operator == "Gt" else have < want
    raise ValueError(f"unknown node selector operator {operator!r}")


def node_affinity_matches(pod_spec: dict, labels: dict[str, str]) -> bool:
    """`nodeSelector` and `requiredDuringSchedulingIgnoredDuringExecution` node affinity (matchExpressions;
    matchFields select `metadata.name`, which no template sets, and are treated as not matching)."""
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    for term in required.get("nodeSelectorTerms") or []:
        expressions = term.get("matchExpressions") or []
        if term.get("matchFields") or not expressions:
            continue
        if all(_requirement_matches(req, labels) for req in expressions):
            return True
    return False


def placeable(pod_spec: dict, group: NodeGroup) -> bool:
    """Taints and node affinity allow the pod on the group's nodes (resources aside)."""
    return node_affinity_matches(pod_spec, group.labels) and not untolerated_taints(pod_spec, group)


def _container_requests(container: dict) -> dict[str, Fraction]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: quantity(value) for name, value in merged.items()}


def _add(a: dict[str, Fraction], b: dict[str, Fraction]) -> dict[str, Fraction]:
    return {k: a.get(k, Fraction(0)) + b.get(k, Fraction(0)) for k in a.keys() | b.keys()}


def pod_requests(pod_spec: dict) -> dict[str, Fraction]:
    """`PodRequests`: what the scheduler reserves for one pod of this spec (without the pod slot)."""
    total: dict[str, Fraction] = {}
    for container in pod_spec.get("containers") or []:
        total = _add(total, _container_requests(container))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in pod_spec.get("initContainers") or []:
        requests = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            sidecars = _add(sidecars, requests)
            total = _add(total, requests)
        else:
            step = _add(sidecars, requests)
            init_peak = {k: max(init_peak.get(k, Fraction(0)), step.get(k, Fraction(0)))
                         for k in init_peak.keys() | step.keys()}
    total = {k: max(total.get(k, Fraction(0)), init_peak.get(k, Fraction(0))) for k in total.keys() | init_peak.keys()}
    overhead = {name: quantity(value) for name, value in (pod_spec.get("overhead") or {}).items()}
    return _add(total, overhead)


def shortfall(requests: list[dict[str, Fraction]], allocatable: dict[str, Fraction]) -> dict[str, Fraction]:
    """What the pods (one slot each) need beyond the node's allocatable; empty when they all fit."""
    need = {"pods": Fraction(len(requests))}
    for r in requests:
        need = _add(need, r)
    return {k: v - allocatable.get(k, Fraction(0)) for k, v in need.items()
            if v > allocatable.get(k, Fraction(0))}

# ---- workloads ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A DaemonSet or Deployment (or a Ray pod template) and where it came from."""

    source: str  # chart folder, add-on or dist chart
    kind: str
    name: str
    pod_spec: dict = field(repr=False)

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.name}"


def workloads(objects: list[dict], source: str) -> list[Workload]:
    """The DaemonSets and Deployments among rendered objects."""
    return [Workload(source=source, kind=o["kind"], name=o["metadata"]["name"],
                     pod_spec=o["spec"]["template"]["spec"])
            for o in objects if o.get("kind") in ("DaemonSet", "Deployment")]


def daemonsets_on(group: NodeGroup, all_workloads: list[Workload]) -> list[Workload]:
    """The DaemonSets whose pods the controller puts on this group's nodes."""
    return [w for w in all_workloads if w.kind == "DaemonSet" and placeable(w.pod_spec, group)]


def allocatable(group: NodeGroup, all_workloads: list[Workload], advertised: dict[str, str]) -> dict[str, Fraction]:
    """The node's allocatable: nodeadm's formula, plus each extended resource whose device plugin DaemonSet
    (`advertised`: DaemonSet key -> resource) lands on the node, in the amount the hardware has."""
    result = group.base_allocatable()
    for w in daemonsets_on(group, all_workloads):
        resource = advertised.get(w.key)
        if resource and resource in group.capacity:
            result[resource] = group.capacity[resource]
    return result


def free_for_pods(group: NodeGroup, all_workloads: list[Workload], advertised: dict[str, str]) -> dict[str, Fraction]:
    """Allocatable less the requests (and pod slots) of the DaemonSets that land on the node."""
    left = allocatable(group, all_workloads, advertised)
    for w in daemonsets_on(group, all_workloads):
        left = _add(left, {k: -v for k, v in {**pod_requests(w.pod_spec), "pods": Fraction(1)}.items()})
    return left
