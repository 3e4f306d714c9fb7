"""What a deploy of a new variable file would replace or delete, found offline from two syntheses.

CloudFormation replaces a resource when a property it can only set at creation changes; the resource
provider schemas list those as `createOnlyProperties`. The schemas read here are the ones cfn-lint
ships (cfnlint/data/schemas/providers/<region>, through `cfnlint.schema.PROVIDER_SCHEMA_MANAGER`), the
same set the lint tests use. A resource is also replaced when a create-only property refers (Ref,
GetAtt, Sub, or an export through ImportValue) to a resource that is itself replaced: its physical id
changes. A changed launch template is not a replacement but rolls its node group's nodes.

`python -m ops.check NEW --against OLD` prints the findings; OLD is the previous variable file or a
`cdk.out` directory of the last synthesized (deployed) templates.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from config import ClusterConfig

# What a user must never lose to a routine edit (issue 17, point 7).
KEY_TYPES = ("AWS::EKS::Cluster", "AWS::EKS::Nodegroup", "AWS::S3::Bucket")

Templates = dict[str, dict]
"""Templates by CloudFormation stack name."""


@dataclass(frozen=True, kw_only=True)
class Change:
    """One resource a deploy would replace, delete, or (a launch template) roll nodes for."""

    stack: str
    logical_id: str
    type: str
    action: str
    """"replace", "delete", "release" (leaves the stack but is kept) or "roll nodes"."""
    reason: str

    def line(self) -> str:
        return f"{self.action}: {self.stack}/{self.logical_id} ({self.type}): {self.reason}"


@cache
def create_only_properties(resource_type: str, region: str) -> tuple[str, ...]:
    """JSON pointers (`/properties/...`) of the type's create-only properties; () for types without a schema."""
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

    try:
        schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema(region, resource_type)
    except Exception:  # noqa: BLE001 - custom resources and unknown types have no provider schema
        return ()
    return tuple(schema.schema.get("createOnlyProperties", ()))


def _at(properties: dict, pointer: str) -> object:
    """The value at `/properties/A/B` in a resource's Properties (None where absent)."""
    value: object = properties
    for part in pointer.split("/")[2:]:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _references(value: object, stack: str, exports: dict[str, set[tuple[str, str]]]) -> set[tuple[str, str]]:
    """(stack, logical id) of every resource `value` refers to, following ImportValue to the exporting stack."""
    found: set[tuple[str, str]] = set()
    if isinstance(value, list):
        for item in value:
            found |= _references(item, stack, exports)
    elif isinstance(value, dict):
        for key, inner in value.items():
            if key == "Ref" and isinstance(inner, str) and not inner.startswith("AWS::"):
                found.add((stack, inner))
            elif key == "Fn::GetAtt":
                name = inner[0] if isinstance(inner, list) else str(inner).split(".")[0]
                found.add((stack, name))
            elif key == "Fn::ImportValue" and isinstance(inner, str):
                found |= exports.get(inner, set())
            elif key == "Fn::Sub":
                text = inner[0] if isinstance(inner, list) else inner
                found |= {(stack, name.split(".")[0]) for name in re.findall(r"\$\{([^!}][^}]*)\}", text)
                          if not name.startswith("AWS::")}
                if isinstance(inner, list):
                    found |= _references(inner[1], stack, exports)
            else:
                found |= _references(inner, stack, exports)
    return found


def _exports(templates: Templates) -> dict[str, set[tuple[str, str]]]:
    """Export name -> the resources its value refers to."""
    out: dict[str, set[tuple[str, str]]] = {}
    for stack, template in templates.items():
        for output in template.get("Outputs", {}).values():
            name = output.get("Export", {}).get("Name")
            if isinstance(name, str):
                out[name] = _references(output["Value"], stack, {})
    return out


def changes(old: Templates, new: Templates, *, region: str) -> list[Change]:
    """Resources of `old` that deploying `new` would replace or delete, and launch templates that roll nodes."""
    found: dict[tuple[str, str], Change] = {}
    new_exports = _exports(new)
    for stack, template in old.items():
        new_resources = new.get(stack, {}).get("Resources", {})
        for logical, resource in template.get("Resources", {}).items():
            kind = resource["Type"]
            after = new_resources.get(logical)
            if after is None and resource.get("DeletionPolicy") == "Retain":
                found[(stack, logical)] = Change(stack=stack, logical_id=logical, type=kind, action="release",
                                                 reason="leaves the stack, kept (DeletionPolicy Retain)")
            elif after is None:
                found[(stack, logical)] = Change(stack=stack, logical_id=logical, type=kind, action="delete",
                                                 reason="no longer in the template")
            elif after["Type"] != kind:
                found[(stack, logical)] = Change(stack=stack, logical_id=logical, type=kind, action="replace",
                                                 reason=f"becomes {after['Type']}")
            else:
                before_props, after_props = resource.get("Properties", {}), after.get("Properties", {})
                for pointer in create_only_properties(kind, region):
                    if _at(before_props, pointer) != _at(after_props, pointer):
                        found[(stack, logical)] = Change(
                            stack=stack, logical_id=logical, type=kind, action="replace",
                            reason=f"create-only {pointer.removeprefix('/properties/')} changes")
                        break
    # A create-only property that refers to a replaced resource gets a new value at deploy time.
    grew = True
    while grew:
        grew = False
        replaced = {key for key, change in found.items() if change.action in ("replace", "delete")}
        for stack, template in new.items():
            for logical, resource in template.get("Resources", {}).items():
                if (stack, logical) in found or logical not in old.get(stack, {}).get("Resources", {}):
                    continue
                for pointer in create_only_properties(resource["Type"], region):
                    hit = _references(_at(resource.get("Properties", {}), pointer), stack, new_exports) & replaced
                    if hit:
                        (ref_stack, ref_logical) = sorted(hit)[0]
                        found[(stack, logical)] = Change(
                            stack=stack, logical_id=logical, type=resource["Type"], action="replace",
                            reason=f"create-only {pointer.removeprefix('/properties/')} refers to "
                                   f"{ref_stack}/{ref_logical}, which is replaced")
                        grew = True
                        break
    for stack, template in old.items():
        for logical, resource in template.get("Resources", {}).items():
            after = new.get(stack, {}).get("Resources", {}).get(logical)
            if (resource["Type"] == "AWS::EC2::LaunchTemplate" and (stack, logical) not in found and after
                    and after["Properties"].get("LaunchTemplateData")
                    != resource["Properties"].get("LaunchTemplateData")):
                found[(stack, logical)] = Change(
                    stack=stack, logical_id=logical, type=resource["Type"], action="roll nodes",
                    reason="launch template changes: its node group replaces its nodes one at a time")
    return sorted(found.values(), key=lambda c: (c.action, c.stack, c.logical_id))


def synthesize(config: ClusterConfig, outdir: Path) -> Templates:
    """Synthesize the project's stacks for `config` into `outdir` (no cdk-nag) and read the templates."""
    os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

    from ops.context import new_app
    from stacks.assembly import build, stack_names

    # cdk.json's context (the feature flags), so the templates match what `cdk synth` writes into cdk.out.
    app = new_app(outdir=str(outdir))
    build(app, config)
    app.synth()
    return {name: json.loads((outdir / f"{name}.template.json").read_text())
            for name in stack_names(config).values()}


def read_cdk_out(directory: Path, config: ClusterConfig) -> Templates:
    """The templates of `config`'s stacks in a cdk.out directory (those present)."""
    from stacks.assembly import stack_names

    out = {}
    for name in stack_names(config).values():
        path = directory / f"{name}.template.json"
        if path.exists():
            out[name] = json.loads(path.read_text())
    return out


def compare(old: ClusterConfig | Path, new: ClusterConfig, *, with_step: bool = False):
    """Changes from `old` (a loaded variable file, or a cdk.out directory) to `new`; with `with_step`, also every
    resource's and node group's classification (`ops.lifecycle.classify`)."""
    from ops.lifecycle import classify

    with tempfile.TemporaryDirectory(prefix="config-against-") as tmp:
        after = synthesize(new, Path(tmp) / "new")
        before = read_cdk_out(old, new) if isinstance(old, Path) else synthesize(old, Path(tmp) / "old")
    found = changes(before, after, region=new.region)
    return (found, classify(before, after, region=new.region)) if with_step else found


def key_changes(found: list[Change]) -> list[Change]:
    """The changes that lose the cluster, a node group or the bucket."""
    return [c for c in found if c.type in KEY_TYPES and c.action in ("replace", "delete")]
