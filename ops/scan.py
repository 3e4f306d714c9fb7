"""The Ray pods as plain Pods, for `make checkov`.

checkov reads Kubernetes kinds it knows (Pod, DaemonSet, ...) and passes over custom resources, so the
head and worker pods inside a RayCluster or RayJob would go unscanned. `python -m ops.scan DIST OUT`
copies the manifests in DIST to OUT and writes beside them each Ray pod template as the Pod the KubeRay
operator makes from it (name, namespace, the template's labels and annotations plus the operator's
`ray.io/cluster` and `ray.io/node-type`), so checkov checks them, their inline skips included, and sees
that the NetworkPolicy selects them.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import yaml

from config.errors import UserError, run_cli
from config.k8s import RAY_CLUSTER_LABEL, RAY_NODE_TYPE_LABEL


def _templates(obj: dict) -> list[tuple[str, str, dict]]:
    """(node type, group, pod template) of every pod a Ray object makes."""
    spec = obj["spec"]["rayClusterSpec"] if obj["kind"] == "RayJob" else obj["spec"]
    found = [("head", "head", spec["headGroupSpec"]["template"])]
    return found + [("worker", g["groupName"], g["template"]) for g in spec["workerGroupSpecs"]]


def ray_pods(objects: list[dict]) -> list[dict]:
    """The Pods KubeRay creates from the RayClusters and RayJobs in `objects` (one per group)."""
    pods = []
    for obj in objects:
        if obj.get("kind") not in ("RayCluster", "RayJob"):
            continue
        owner = obj["metadata"]["name"]
        for node_type, group, template in _templates(obj):
            metadata = template.get("metadata") or {}
            labels = {**metadata.get("labels", {}), RAY_CLUSTER_LABEL: owner, RAY_NODE_TYPE_LABEL: node_type}
            pods.append({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": f"{owner}-{group}", "namespace": obj["metadata"]["namespace"],
                                      "labels": labels, "annotations": metadata.get("annotations", {})},
                         "spec": template["spec"]})
    return pods


def main(argv: list[str]) -> int:
    """`python -m ops.scan DIST OUT`: copy DIST's manifests to OUT and add OUT/ray-pods.k8s.yaml.

    One folder, so checkov's graph checks see the NetworkPolicies and the pods they select together.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ops.scan", description=main.__doc__.split("\n")[0])
    parser.add_argument("dist", type=Path, metavar="DIST", help="folder of synthesized manifests (dist)")
    parser.add_argument("out", type=Path, metavar="OUT", help="folder checkov scans (replaced *.k8s.yaml)")
    args = parser.parse_args(argv)
    dist, out = args.dist, args.out
    objects = [o for f in sorted(dist.glob("*.k8s.yaml")) for o in yaml.safe_load_all(f.read_text()) if o]
    if not objects:
        raise UserError("no manifests", file=str(dist), fix="run `make synth-k8s` first")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.k8s.yaml"):
        old.unlink()
    for manifest in dist.glob("*.k8s.yaml"):
        shutil.copyfile(manifest, out / manifest.name)
    pods = ray_pods(objects)
    (out / "ray-pods.k8s.yaml").write_text(yaml.safe_dump_all(pods, sort_keys=False))
    print(f"{out}: the manifests of {dist} and {len(pods)} Ray pods")
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
