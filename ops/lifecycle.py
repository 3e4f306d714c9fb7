"""How CloudFormation will treat every resource when the project's stacks move from one set of templates to the next.

Offline, from two syntheses, by the rules CloudFormation documents; each rule names its source:

* A resource whose logical id is new is created; one that leaves the template is deleted, or released (left in the
  account) with `DeletionPolicy: Retain` (CloudFormation User Guide, "DeletionPolicy attribute").
* A change at or under one of the type's `createOnlyProperties` replaces the resource, any other change updates it in
  place (CloudFormation resource type schema, "createOnlyProperties": "Properties that can only be specified during
  resource creation ... a change requires replacement"; the schemas cfn-lint ships, cfnlint/data/schemas/providers,
  read through `cfnlint.schema.PROVIDER_SCHEMA_MANAGER`).
* A value that refers to another resource changes when that resource does: `Ref` returns its physical id, which
  changes only when it is replaced; `Fn::GetAtt` returns an attribute, which may change on any update (CloudFormation
  User Guide, "Update behaviors of stack resources": "resources that refer to a replaced resource are updated"). An
  `Fn::ImportValue` follows the export to the resource behind it.
* An export another stack imports cannot change ("Fn::ImportValue": "you can't modify or remove an output value that
  is referenced by another stack").
* A resource with a custom name cannot be replaced ("Name type": "If you specify a name, you can't perform updates that
  require replacement of this resource").

Every `AWS::EKS::Nodegroup` is also classed by what happens to its nodes: unchanged, scaled (only MinSize or MaxSize
change), rolled (its launch template version, `Version` or `ReleaseVersion` changes, directly or through `GetAtt`:
EKS replaces every node, `UpdateNodegroupVersion`), updated (another in-place change: labels, taints, tags), or
replaced. Removing `ScalingConfig.DesiredSize` alone is "unchanged": "When using CloudFormation, no action occurs if
you remove this parameter from your CFN template" (EKS API Reference, NodegroupScalingConfig).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache

Templates = dict[str, dict]
"""Templates by CloudFormation stack name."""

Path = tuple[str, ...]
_INTRINSICS = ("Ref", "Fn::GetAtt", "Fn::Sub", "Fn::ImportValue", "Fn::Join", "Fn::Select", "Fn::If",
               "Fn::Base64", "Fn::Split", "Fn::FindInMap", "Fn::GetAZs", "Fn::Cidr", "Fn::ToJsonString")
# What a node group change does to its nodes (module docstring).
ROLL_PATHS: tuple[Path, ...] = (("LaunchTemplate",), ("Version",), ("ReleaseVersion",))
DESIRED_SIZE: Path = ("ScalingConfig", "DesiredSize")


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What one resource undergoes: action "create", "unchanged", "update", "replace", "delete" or "release"."""

    stack: str
    logical_id: str
    type: str
    action: str
    changed: tuple[Path, ...] = ()
    """Property paths whose value changes at deploy time (written, or through a reference)."""
    reasons: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.stack, self.logical_id)


@dataclass(kw_only=True)
class Step:
    """The verdicts of one deploy (or teardown), with the node group classes and the exports that change."""

    verdicts: dict[tuple[str, str], Verdict]
    nodegroups: dict[tuple[str, str], str] = field(default_factory=dict)
    changed_exports: dict[str, str] = field(default_factory=dict)
    """Export name -> why its value changes; only exports that a template of the new set imports."""

    def of_type(self, kind: str) -> dict[tuple[str, str], Verdict]:
        return {k: v for k, v in self.verdicts.items() if v.type == kind}

    def by_action(self, *actions: str) -> list[Verdict]:
        return [v for v in self.verdicts.values() if v.action in actions]


@cache
def _schema(resource_type: str, region: str) -> dict:
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

    try:
        return PROVIDER_SCHEMA_MANAGER.get_resource_schema(region, resource_type).schema
    except Exception:  # noqa: BLE001 - custom resources (Custom::*) have no provider schema
        if resource_type.startswith("Custom::"):
            # A custom resource behaves as AWS::CloudFormation::CustomResource (ServiceToken create-only).
            return _schema("AWS::CloudFormation::CustomResource", region)
        return {}


def _pointer_path(pointer: str) -> Path:
    return tuple(pointer.split("/")[2:])


def create_only(resource_type: str, region: str) -> tuple[Path, ...]:
    """The type's `createOnlyProperties` as property paths."""
    return tuple(_pointer_path(p) for p in _schema(resource_type, region).get("createOnlyProperties", ()))


def name_property(resource_type: str, region: str) -> str | None:
    """The create-only property that names the resource (`Name`, or `<Type>Name`: BucketName, NodegroupName,
    AddonName, RoleName, LogGroupName ...), None for types without one."""
    tail = resource_type.split("::")[-1]
    names = {p[0] for p in create_only(resource_type, region) if len(p) == 1}
    for candidate in ("Name", f"{tail}Name"):
        if candidate in names:
            return candidate
    return None


def _is_intrinsic(value: object) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in _INTRINSICS


def _diff(old: object, new: object, path: Path = ()) -> list[Path]:
    """Property paths whose written value differs (intrinsics and lists compared whole)."""
    if isinstance(old, dict) and isinstance(new, dict) and not _is_intrinsic(old) and not _is_intrinsic(new):
        out: list[Path] = []
        for key in sorted(set(old) | set(new)):
            if key not in old or key not in new:
                out.append((*path, key))
            else:
                out += _diff(old[key], new[key], (*path, key))
        return out
    return [] if old == new else [path]


def _refs(value: object, path: Path = ()) -> list[tuple[Path, str, str, str | None]]:
    """(path, kind, target, attribute) for every reference in `value`: kind "Ref", "GetAtt" or "Import"."""
    found: list[tuple[Path, str, str, str | None]] = []
    if isinstance(value, list):
        for i, item in enumerate(value):
            found += _refs(item, (*path, str(i)))
    elif isinstance(value, dict):
        for key, inner in value.items():
            if key == "Ref" and isinstance(inner, str) and not inner.startswith("AWS::"):
                found.append((path, "Ref", inner, None))
            elif key == "Fn::GetAtt":
                target, attr = (inner[0], inner[1]) if isinstance(inner, list) else str(inner).split(".", 1)
                found.append((path, "GetAtt", target, attr if isinstance(attr, str) else json.dumps(attr)))
            elif key == "Fn::ImportValue" and isinstance(inner, str):
                found.append((path, "Import", inner, None))
            elif key == "Fn::Sub":
                text = inner[0] if isinstance(inner, list) else inner
                for name in re.findall(r"\$\{([^!}][^}]*)\}", text):
                    if name.startswith("AWS::"):
                        continue
                    target, _, attr = name.partition(".")
                    found.append((path, "GetAtt" if attr else "Ref", target, attr or None))
                if isinstance(inner, list):
                    found += _refs(inner[1], path)
            else:
                found += _refs(inner, path if key.startswith("Fn::") else (*path, key))
    return found


def _under(path: Path, prefixes: tuple[Path, ...]) -> bool:
    """`path` is at or under one of `prefixes`, or contains one (a whole object written anew)."""
    return any(path[:len(p)] == p or p[:len(path)] == path for p in prefixes)


def _exports(templates: Templates) -> dict[str, tuple[str, object]]:
    """Export name -> (stack, the output's Value)."""
    out: dict[str, tuple[str, object]] = {}
    for stack, template in templates.items():
        for output in template.get("Outputs", {}).values():
            name = output.get("Export", {}).get("Name")
            if isinstance(name, str):
                out[name] = (stack, output["Value"])
    return out


def _moves(kind: str, target_action: str | None) -> bool:
    """Whether a reference of `kind` to a resource undergoing `target_action` yields a new value."""
    if target_action == "replace":
        return True
    return kind == "GetAtt" and target_action == "update"


def classify(old: Templates, new: Templates, *, region: str) -> Step:
    """Every resource of `old` and `new` as CloudFormation will treat it when `new` is deployed over `old` (a stack
    missing from `new` is deleted; one missing from `old` is created)."""
    verdicts: dict[tuple[str, str], Verdict] = {}
    written: dict[tuple[str, str], list[Path]] = {}
    for stack in sorted(set(old) | set(new)):
        before = old.get(stack, {}).get("Resources", {})
        after = new.get(stack, {}).get("Resources", {})
        for logical in sorted(set(before) | set(after)):
            key = (stack, logical)
            if logical not in before:
                verdicts[key] = Verdict(stack=stack, logical_id=logical, type=after[logical]["Type"], action="create")
            elif logical not in after:
                kept = before[logical].get("DeletionPolicy") == "Retain"
                verdicts[key] = Verdict(stack=stack, logical_id=logical, type=before[logical]["Type"],
                                        action="release" if kept else "delete",
                                        reasons=("DeletionPolicy Retain",) if kept else ())
            elif after[logical]["Type"] != before[logical]["Type"]:
                verdicts[key] = Verdict(stack=stack, logical_id=logical, type=after[logical]["Type"],
                                        action="replace", reasons=("type changes",))
            else:
                written[key] = _diff(before[logical].get("Properties", {}), after[logical].get("Properties", {}))

    old_exports, new_exports = _exports(old), _exports(new)

    def target_action(stack: str, kind: str, target: str) -> str | None:
        if kind == "Import":
            exported = new_exports.get(target)
            if exported is None:
                return None
            moved = [_moves(k, action_of(exported[0], t)) for _, k, t, _ in _refs(exported[1]) if k != "Import"]
            return "replace" if any(moved) else None
        return action_of(stack, target)

    def action_of(stack: str, logical: str) -> str | None:
        verdict = verdicts.get((stack, logical))
        return verdict.action if verdict else None

    # Fixed point: a replaced or updated resource can change what refers to it, and so on.
    pending = dict(written)
    while True:
        grew = False
        for key, paths in pending.items():
            stack, logical = key
            resource = new[stack]["Resources"][logical]
            changed = set(paths)
            reasons = [f"{'/'.join(p)} written differently" for p in paths]
            for path, kind, target, _attr in _refs(resource.get("Properties", {})):
                if _moves("GetAtt" if kind == "Import" else kind, target_action(stack, kind, target)):
                    changed.add(path)
                    reasons.append(f"{'/'.join(path)} refers ({kind}) to {target}, which changes")
            kind_ = resource["Type"]
            if any(_under(p, create_only(kind_, region)) for p in changed):
                action = "replace"
            else:
                action = "update" if changed else "unchanged"
            previous = verdicts.get(key)
            if previous is None or previous.action != action or set(previous.changed) != changed:
                verdicts[key] = Verdict(stack=stack, logical_id=logical, type=kind_, action=action,
                                        changed=tuple(sorted(changed)), reasons=tuple(reasons))
                grew = grew or previous is None or previous.action != action or set(previous.changed) != changed
        if not grew:
            break

    step = Step(verdicts=verdicts)
    imported = {name for template in new.values() for _, kind, name, _ in _refs(template) if kind == "Import"}
    for name in sorted(imported & set(old_exports)):
        stack, value = old_exports[name]
        if name not in new_exports:
            step.changed_exports[name] = "the export leaves the template"
        elif json.dumps(new_exports[name][1], sort_keys=True) != json.dumps(value, sort_keys=True):
            step.changed_exports[name] = "its value is written differently"
        elif target_action(stack, "Import", name) == "replace":
            step.changed_exports[name] = "the resource behind it changes"
    for key, verdict in verdicts.items():
        if verdict.type == "AWS::EKS::Nodegroup":
            step.nodegroups[key] = nodegroup_class(verdict)
    return step


def nodegroup_class(verdict: Verdict) -> str:
    """"created", "deleted", "replaced", "rolled", "scaled", "updated" or "unchanged" (module docstring)."""
    if verdict.action in ("create", "replace"):
        return {"create": "created", "replace": "replaced"}[verdict.action]
    if verdict.action in ("delete", "release"):
        return "deleted"
    changed = [p for p in verdict.changed if p != DESIRED_SIZE]
    if not changed:
        return "unchanged"
    if any(_under(p, ROLL_PATHS) for p in changed):
        return "rolled"
    if all(p[:1] == ("ScalingConfig",) for p in changed):
        return "scaled"
    return "updated"


GENERATED = "<generated>"
"""Stands for a physical id CloudFormation generates at creation (unique: it never equals another one)."""


def resolved(value: object, template: dict, region: str) -> str:
    """A value as canonical text, with a `Ref` to a resource replaced by that resource's primary identifier as the
    template writes it (a bucket's `Ref` is its BucketName), so two templates' names can be compared; a `Ref` to a
    resource whose identifier is not written (CloudFormation generates it: a Lambda function's name) or a `GetAtt`
    becomes GENERATED."""
    def walk(v: object) -> object:
        if isinstance(v, dict) and set(v) == {"Ref"} and v["Ref"] in template.get("Resources", {}):
            resource = template["Resources"][v["Ref"]]
            ids = [_pointer_path(p) for p in _schema(resource["Type"], region).get("primaryIdentifier", ())]
            if len(ids) == 1 and len(ids[0]) == 1 and ids[0][0] in resource.get("Properties", {}):
                return walk(resource["Properties"][ids[0][0]])
            return GENERATED
        if isinstance(v, dict) and set(v) == {"Fn::GetAtt"}:
            return GENERATED
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v
    return json.dumps(walk(value), sort_keys=True)


def identity(resource: dict, template: dict, region: str) -> str | None:
    """The resource's primary identifier as written in the template (resolved), None when CloudFormation generates
    any part of it (then no other resource can have it)."""
    ids = [_pointer_path(p) for p in _schema(resource["Type"], region).get("primaryIdentifier", ())]
    props = resource.get("Properties", {})
    if not ids or any(len(p) != 1 or p[0] not in props for p in ids):
        return None
    parts = [resolved(props[p[0]], template, region) for p in ids]
    if any(GENERATED in part for part in parts):
        return None
    return resource["Type"] + " " + " ".join(parts)


def physical_names(templates: Templates, *, region: str) -> dict[str, str]:
    """Every identity that must be unique in an account and region -> where it comes from: stack names, export
    names, and each resource's primary identifier where the template writes it (a bucket's name, a cluster's name,
    an add-on's cluster and name)."""
    names: dict[str, str] = {}
    for stack, template in templates.items():
        names[f"stack {stack}"] = stack
        for output in template.get("Outputs", {}).values():
            if isinstance(output.get("Export", {}).get("Name"), str):
                names[f"export {output['Export']['Name']}"] = stack
        for logical, resource in template.get("Resources", {}).items():
            ident = identity(resource, template, region)
            if ident:
                names[ident] = f"{stack}/{logical}"
    return names
