"""The node the Cluster Autoscaler imagines for an empty managed node group, and whether a pod fits it.

A transcription of Cluster Autoscaler 1.34's AWS provider (kubernetes/autoscaler, tag
cluster-autoscaler-1.34.2, the version stacks/versions.py pins), fed with the synthesized CloudFormation:

- `AwsManager.buildNodeFromTemplate` (cloudprovider/aws/aws_manager.go lines 263-337): capacity `pods` 110,
  CPU, memory (MiB x 2^20) and `nvidia.com/gpu` from the instance type; then every
  `k8s.io/cluster-autoscaler/node-template/resources/<name>` ASG tag; allocatable = capacity. Labels: the
  generic ones (`buildGenericLabels`), then the ASG's `node-template/label/<k>` tags and, for a tag key
  containing `eks:`, the rest of the key (`extractLabelsFromAsg`). Taints: the ASG's `node-template/taint/<k>`
  tags whose value ends in an effect (`extractTaintsFromAsg`). When the labels now hold `nodegroup-name` and
  `cluster-name` (from EKS's `eks:nodegroup-name` / `eks:cluster-name` ASG tags), EKS DescribeNodegroup: its
  labels win over the ASG's, its taints are appended, and the `node-template/resources/` keys of its tags win.
- `awsWrapper.getManagedNodegroupInfo` (cloudprovider/aws/aws_wrapper.go lines 60-135): the labels are the node
  group's `Labels` plus `amiType`, `eks.amazonaws.com/capacityType`, `k8sVersion`, `eks.amazonaws.com/nodegroup`
  (and `diskSize` when set); taint effects translated by `taintEksTranslator` (lines 788-804).

The ASG's tags are those EKS puts on the group it creates for a managed node group (the auto-discovery tags
and `eks:cluster-name`, `eks:nodegroup-name`), plus whatever the templates themselves write onto an ASG, which
`project_asg_tags` collects (an `autoscaling:CreateOrUpdateTags` SDK call in a custom resource), so a tag
written there would show in the imagined node.

`fits` applies the scheduler's filters the autoscaler simulates (kube-scheduler's NodeResourcesFit,
NodeAffinity with nodeSelector, TaintToleration): requests against allocatable, labels, taints with effect
NoSchedule or NoExecute.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from kubernetes.utils import parse_quantity

from tests.placement import tolerates  # k8s.io/api/core/v1 `Toleration.ToleratesTaint`, one copy

NODE_TEMPLATE = "k8s.io/cluster-autoscaler/node-template/"
_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
_TAINT_VALUE = re.compile(r"(.*):(?:NoSchedule|NoExecute|PreferNoSchedule)")


@dataclass
class Node:
    """What the autoscaler believes a new node of the group would be."""

    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    allocatable: dict[str, object] = field(default_factory=dict)


def eks_asg_tags(cluster_name: str, nodegroup_name: str) -> dict[str, str]:
    """The tags EKS itself puts on a managed node group's ASG (EKS user guide, "Managed node groups"; CA
    proposal circumvent-tag-limit-aws.md: "we automatically add them to every managed nodegroup")."""
    return {"eks:cluster-name": cluster_name, "eks:nodegroup-name": nodegroup_name,
            "k8s.io/cluster-autoscaler/enabled": "true", f"k8s.io/cluster-autoscaler/{cluster_name}": "owned"}


def _text(value) -> str:
    """A template value flattened to text, references shown as `<LogicalId>`."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Ref" in value:
        return f"<{value['Ref']}>"
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return f"<{value['Fn::GetAtt'][0]}>"
    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join(_text(p) for p in parts)
    return json.dumps(value)


def project_asg_tags(templates: list[dict]) -> list[dict[str, str]]:
    """Every tag the templates' own resources would write onto an Auto Scaling group: CreateOrUpdateTags calls
    of CDK AwsCustomResources (`Custom::AWS`) and the Tags of any `AWS::AutoScaling::AutoScalingGroup`."""
    out = []
    for template in templates:
        for res in template.get("Resources", {}).values():
            if res["Type"] == "Custom::AWS":
                props = res["Properties"]
                for phase in ("Create", "Update"):
                    if phase in props:
                        call = json.loads(_text(props[phase]))
                        if call.get("action", "").lower() == "createorupdatetags":
                            out += [{"Key": t["Key"], "Value": t["Value"]} for t in call["parameters"]["Tags"]]
            elif res["Type"] == "AWS::AutoScaling::AutoScalingGroup":
                out += [{"Key": t["Key"], "Value": t["Value"]} for t in res["Properties"].get("Tags", [])]
    return out


def describe_nodegroup(props: dict, *, name: str, kubernetes_version: str) -> dict:
    """The parts of EKS DescribeNodegroup's answer the autoscaler reads, for an `AWS::EKS::Nodegroup` as deployed:
    CloudFormation converges the node group's Labels, Taints and Tags on the template's."""
    return {"nodegroupName": props.get("NodegroupName", name), "amiType": props.get("AmiType"),
            "capacityType": props.get("CapacityType", "ON_DEMAND"), "version": props.get("Version", kubernetes_version),
            "diskSize": props.get("DiskSize"), "labels": props.get("Labels", {}), "taints": props.get("Taints", []),
            "tags": props.get("Tags", {})}


def build_node_from_template(*, vcpus: int, memory_mib: int, gpus: int, instance_type: str, zone: str,
                             asg_tags: dict[str, str], nodegroup: dict | None) -> Node:
    """`buildNodeFromTemplate` for one ASG; `nodegroup` is DescribeNodegroup's answer (None: the call failed)."""
    node = Node()
    capacity = {"pods": parse_quantity(110), "cpu": parse_quantity(vcpus),
                "nvidia.com/gpu": parse_quantity(gpus), "memory": parse_quantity(memory_mib * 1024 * 1024)}
    for key, value in asg_tags.items():
        if key.startswith(NODE_TEMPLATE + "resources/") and key != NODE_TEMPLATE + "resources/":
            capacity[key.removeprefix(NODE_TEMPLATE + "resources/")] = parse_quantity(value)
    node.labels = {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
                   "node.kubernetes.io/instance-type": instance_type, "topology.kubernetes.io/region": zone[:-1],
                   "topology.kubernetes.io/zone": zone, "topology.ebs.csi.aws.com/zone": zone,
                   "kubernetes.io/hostname": "template-node"}
    for key, value in asg_tags.items():
        # strings.Split(k, prefix) then, failing that, strings.Split(k, "eks:"): the part after the separator.
        for sep in (NODE_TEMPLATE + "label/", "eks:"):
            if sep in key:
                label = key.split(sep)[1]
                if label:
                    node.labels[label] = value
                break
    for key, value in asg_tags.items():
        if _TAINT_VALUE.match(value) and NODE_TEMPLATE + "taint/" in key:
            taint_value, effect = value.split(":", 1)
            node.taints.append({"key": key.split(NODE_TEMPLATE + "taint/")[1], "value": taint_value, "effect": effect})
    if nodegroup is not None and node.labels.get("nodegroup-name") and node.labels.get("cluster-name"):
        mng_labels = {"amiType": nodegroup["amiType"], "eks.amazonaws.com/capacityType": nodegroup["capacityType"],
                      "k8sVersion": nodegroup["version"], "eks.amazonaws.com/nodegroup": nodegroup["nodegroupName"]}
        if nodegroup.get("diskSize") is not None:
            mng_labels["diskSize"] = str(nodegroup["diskSize"])
        node.labels.update({k: v for k, v in mng_labels.items() if v})
        node.labels.update(nodegroup["labels"])
        node.taints += [{"key": t["Key"], "value": t["Value"], "effect": _EFFECTS[t["Effect"]]}
                        for t in nodegroup["taints"]]
        for key, value in nodegroup["tags"].items():
            if key.startswith(NODE_TEMPLATE + "resources/") and key != NODE_TEMPLATE + "resources/":
                capacity[key.removeprefix(NODE_TEMPLATE + "resources/")] = parse_quantity(value)
    node.allocatable = capacity
    return node


def pod_requests(pod_spec: dict) -> dict[str, object]:
    """The pod's effective requests: the containers' sum, or an init container's if larger; an extended
    resource given only as a limit counts as requested."""
    def requests(container: dict) -> dict:
        res = container.get("resources", {})
        return {**res.get("limits", {}), **res.get("requests", {})}

    total: dict[str, object] = {}
    for container in pod_spec["containers"]:
        for name, amount in requests(container).items():
            total[name] = total.get(name, 0) + parse_quantity(amount)
    for container in pod_spec.get("initContainers", []):
        for name, amount in requests(container).items():
            total[name] = max(total.get(name, 0), parse_quantity(amount))
    total["pods"] = parse_quantity(1)
    return total


def _matches(expression: dict, labels: dict[str, str]) -> bool:
    key, op, values = expression["key"], expression["operator"], expression.get("values", [])
    return {"In": lambda: labels.get(key) in values, "NotIn": lambda: labels.get(key) not in values,
            "Exists": lambda: key in labels, "DoesNotExist": lambda: key not in labels}[op]()


def misfits(pod_spec: dict, node: Node) -> list[str]:
    """Why the pod cannot go on the node, one line per reason; empty when it fits."""
    out = []
    for name, amount in pod_requests(pod_spec).items():
        offered = node.allocatable.get(name, 0)
        if amount > offered:
            out.append(f"{name}: requests {amount}, node offers {offered}")
    for key, value in pod_spec.get("nodeSelector", {}).items():
        if node.labels.get(key) != value:
            out.append(f"nodeSelector {key}={value}: node has {node.labels.get(key)!r}")
    required = (pod_spec.get("affinity", {}).get("nodeAffinity", {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required and not any(all(_matches(e, node.labels) for e in term.get("matchExpressions", []))
                            for term in required["nodeSelectorTerms"]):
        out.append("required node affinity: no term matches")
    for taint in node.taints:
        if taint["effect"] in ("NoSchedule", "NoExecute") and not any(
                tolerates(t, taint) for t in pod_spec.get("tolerations", [])):
            out.append(f"taint {taint['key']}={taint['value']}:{taint['effect']} not tolerated")
    return out
