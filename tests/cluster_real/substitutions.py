"""What `make cluster-real` changes in the product's manifests, declared: the one table of differences.

The test applies the real `dist/` output of the lab variable file (tests/fixtures/cluster-real.yaml). A few things
cannot be as on EKS on one 2-core machine without the internet; each is a row below, with the reason. `substitute`
makes exactly these changes, and `undeclared` compares the result with the product's manifest leaf by leaf: any
difference that no row declares is returned, and the test fails on it.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Substitution:
    pattern: str
    """fnmatch pattern over the changed leaf's path (list indices written [*], an appended item [+])."""
    product: str
    lab: str
    why: str


POD_SPECS = ("spec.submitterPodTemplate.spec", "spec.rayClusterSpec.headGroupSpec.template.spec",
             "spec.rayClusterSpec.workerGroupSpecs[*].template.spec")
"""The RayJob's pod templates: the submitter, the Ray head, each worker group."""

TABLE = (
    Substitution("*.containers[*].image", "ray.image (the AWS DLC, multi-GB, from public.ecr.aws)",
                 "the stand-in image (tests/cluster_real/image.py)",
                 "no registry can be reached from the node, and the DLC is CUDA-sized; the stand-in is Debian "
                 "minbase whose PATH starts with the project's venv"),
    Substitution("*.volumes[+]", "-", "hostPath volumes: the CPython install, the project's venv, the demo's data",
                 "the stand-in image carries no Python: the pinned one from the host, read-only, at the same paths "
                 "(a venv's shebangs are absolute); the data file the lab file names (`datasets` reads s3:// only "
                 "through s3fs, not in the venv)"),
    Substitution("*.containers[*].volumeMounts[+]", "-", "their read-only mounts", "as above"),
    Substitution("*.containers[*].resources.requests.cpu", "the pod's CPUs (config.resources)", "100m",
                 "three Ray pods and the submitter on one 2-core node; the limits stay, so Ray counts the CPUs "
                 "the variable file gives each pod (KubeRay's num-cpus comes from the limit)"),
    Substitution("*.containers[*].resources.requests.memory", "the pod's memory (config.resources)", "256Mi",
                 "the same node holds every pod; the limits stay"),
    Substitution("*.containers[*].env[+]", "-",
                 "AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (every pod)",
                 "the checkpoint bucket is the test's S3 server on the node's bridge address; on EKS Pod Identity "
                 "gives the credentials, to the submitter too (one service account: its follow.sh copies its log "
                 "into the run folder), and S3 is AWS's"),
)


def render_table() -> str:
    rows = ["| leaf | product | lab | why |", "| --- | --- | --- | --- |"]
    rows += [f"| `{s.pattern}` | {s.product} | {s.lab} | {s.why} |" for s in TABLE]
    return "\n".join(rows)


def substitute(rayjob: dict, *, image: str, host_paths: list[Path], s3_env: dict[str, str]) -> dict:
    """A copy of the product's RayJob with the table's changes, and only those."""
    out = copy.deepcopy(rayjob)
    for spec in _pod_specs(out):
        volumes = spec.setdefault("volumes", [])
        names = [f"host-python-{i}" for i in range(len(host_paths))]
        for name, path in zip(names, host_paths, strict=True):
            volumes.append({"name": name, "hostPath": {"path": str(path), "type": "Directory"}})
        for container in spec["containers"]:
            container["image"] = image
            requests = container.get("resources", {}).get("requests", {})
            if "cpu" in requests:
                requests["cpu"] = "100m"
            if "memory" in requests:
                requests["memory"] = "256Mi"
            mounts = container.setdefault("volumeMounts", [])
            for name, path in zip(names, host_paths, strict=True):
                mounts.append({"name": name, "mountPath": str(path), "readOnly": True})
            container.setdefault("env", []).extend({"name": k, "value": v} for k, v in s3_env.items())
    return out


def undeclared(product: dict, lab: dict) -> list[str]:
    """Every difference between the two manifests that no row of TABLE declares (empty: none)."""
    return [f"{path}: {why}" for path, why in _diff(product, lab, "")
            if not any(matches(_normal(path), s.pattern) for s in TABLE)]


def matches(path: str, pattern: str) -> bool:
    """`*` is any text; `[*]` (any list index) and `[+]` (an appended item) are literal."""
    tokens = re.split(r"(\[\*\]|\[\+\])", pattern)
    rx = "".join(re.escape(t) if t in ("[*]", "[+]") else ".*".join(map(re.escape, t.split("*"))) for t in tokens)
    return re.fullmatch(rx, path) is not None


def changed_leaves(product: dict, lab: dict) -> list[str]:
    """Every difference, declared or not, as normalised paths (what the test prints beside the table)."""
    return sorted({_normal(path) for path, _ in _diff(product, lab, "")})


def _pod_specs(rayjob: dict) -> list[dict]:
    spec = rayjob["spec"]
    return ([spec["submitterPodTemplate"]["spec"], spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]]
            + [g["template"]["spec"] for g in spec["rayClusterSpec"].get("workerGroupSpecs", [])])


def _normal(path: str) -> str:
    return re.sub(r"\[\d+\]", "[*]", path)


def _diff(a, b, path: str):
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            sub = f"{path}.{key}" if path else key
            if key not in a:
                yield sub, "added"
            elif key not in b:
                yield sub, "removed"
            else:
                yield from _diff(a[key], b[key], sub)
    elif isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            yield from _diff(x, y, f"{path}[{i}]")
        if len(b) > len(a):
            yield from ((f"{path}[+]", "appended") for _ in b[len(a):])
        elif len(a) > len(b):
            yield f"{path}[{len(b)}]", "removed"
    elif a != b:
        yield path, f"{a!r} -> {b!r}"
