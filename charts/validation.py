"""Schema checks for every synthesized object, before anything is written.

- RayCluster / RayJob: the `openAPIV3Schema` of KubeRay 1.7.0's CRDs (found or downloaded, and
  checked against pinned SHA-256s, by `tools.crds`), made strict: an object schema that lists its
  properties and does not say `x-kubernetes-preserve-unknown-fields` rejects any other key,
  because the API server would silently prune a misspelt field and the setting would be lost.
- Core kinds (and the pod templates inside the Ray objects): kubernetes-validate's strict
  schemas for the cluster's Kubernetes version (the newest it ships that is not newer).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate import utils as kv_utils
from packaging.version import Version

from charts.errors import ChartError
from tools.crds import crd_path

CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}
OPERATOR_CRD_KINDS = {"PodMonitor"}
"""Prometheus operator kinds (monitoring.coreos.com/v1), whose CRDs ship in the pinned kube-prometheus-stack
chart, not here: synthesis passes them; tests/test_observability.py validates them against that chart's CRD."""


def strict(schema: Any) -> Any:
    """A copy of an OpenAPI v3 schema where listed-property objects reject unknown keys."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@cache
def crd_validator(kind: str, version: str = "v1") -> jsonschema.protocols.Validator:
    """A strict validator for `kind` at `ray.io/<version>`, from the CRD file."""
    path = crd_path(CRD_FILES[kind])
    crd = yaml.load(path.read_bytes(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            schema = strict(served["schema"]["openAPIV3Schema"])
            return jsonschema.Draft7Validator(schema)
    raise ChartError(f"{path}: has no version {version} of {kind}")


def kubernetes_schema_version(kubernetes_version: str) -> str:
    """The kubernetes-validate schema set used for a cluster version: the newest not newer than it.

    A cluster newer than every shipped set is checked against the newest one.
    """
    wanted = Version(kubernetes_version)
    available = [Version(v) for v in kv_utils.all_versions()]
    not_newer = [v for v in available if (v.major, v.minor) <= (wanted.major, wanted.minor)]
    chosen = max(not_newer) if not_newer else min(available)
    return f"{chosen.major}.{chosen.minor}"


def _where(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind', '?')}/{meta.get('name', '?')}"


def _path(parts) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(object)"


def _crd_problems(obj: dict, kind: str) -> list[str]:
    validator = crd_validator(kind, obj["apiVersion"].split("/", 1)[1])
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{_where(obj)}: {_path(e.absolute_path)}: {e.message} (KubeRay CRD schema)" for e in errors]


def _core_problems(obj: dict, version: str, prefix: str = "") -> list[str]:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kv_utils.ValidationError as exc:
        return [f"{prefix or _where(obj)}: {_path(exc.absolute_path)}: {exc.message} "
                f"(Kubernetes {version} schema, strict)"]
    except kv_utils.SchemaNotFoundError as exc:
        return [f"{_where(obj)}: {exc.message}"]
    return []


def _pod_templates(obj: dict) -> list[tuple[str, dict]]:
    spec = obj.get("spec") or {}
    cluster = spec.get("rayClusterSpec", spec) if obj.get("kind") == "RayJob" else spec
    base = "spec.rayClusterSpec" if cluster is not spec else "spec"
    found = []
    head = (cluster.get("headGroupSpec") or {}).get("template")
    if head is not None:
        found.append((f"{base}.headGroupSpec.template", head))
    for i, group in enumerate(cluster.get("workerGroupSpecs") or []):
        if "template" in group:
            found.append((f"{base}.workerGroupSpecs[{i}].template", group["template"]))
    return found


def problems(objects: list[dict], kubernetes_version: str) -> list[str]:
    """Every schema problem in `objects`, one line each naming the object and field; empty when all valid."""
    version = kubernetes_schema_version(kubernetes_version)
    found: list[str] = []
    for obj in objects:
        kind = obj.get("kind")
        if obj.get("apiVersion", "").startswith("monitoring.coreos.com/") and kind in OPERATOR_CRD_KINDS:
            continue
        if obj.get("apiVersion", "").startswith("ray.io/") and kind in CRD_FILES:
            found += _crd_problems(obj, kind)
            for where, template in _pod_templates(obj):
                wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
                found += _core_problems(wrapped, version, prefix=f"{_where(obj)}: {where}")
        else:
            found += _core_problems(obj, version)
    return found


def check(objects: list[dict], kubernetes_version: str) -> None:
    """Raise `ChartError` listing every schema problem in `objects`."""
    found = problems(objects, kubernetes_version)
    if found:
        raise ChartError("synthesized manifests fail schema validation:\n  " + "\n  ".join(found))
