"""Edits users make often do not replace the EKS cluster, a node group or the bucket (issue 17, point 7).

Each edit is applied to a shipped variable file, both files are synthesized (the real app, through
ops/replacements.py) and compared: the cluster's, node groups' and bucket's logical ids stay, and no
create-only property (cfn-lint's shipped provider schemas) changes anywhere. Edits that do replace or
delete something are checked to be reported, by `python -m ops.check NEW --against OLD` too.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
import yaml

from config import DEFAULT_FILE, ClusterConfig, load_config
from ops.replacements import KEY_TYPES, Change, changes, create_only_properties, synthesize
from tests.helpers import EXAMPLES

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)

_ROOT = Path(tempfile.mkdtemp(prefix="safe-edits-"))
SHIPPED = {"cluster": DEFAULT_FILE, **{p.stem: p for p in sorted(EXAMPLES.glob("*.yaml"))}}
DIGEST = "sha256:" + "0123456789abcdef" * 4


def teardown_module():
    shutil.rmtree(_ROOT, ignore_errors=True)


def _fit_batch(data: dict) -> dict:
    """Keep `job.global_batch_size` a multiple of micro batch x world size after a change of GPUs."""
    config = ClusterConfig.model_validate(data)
    data["job"]["global_batch_size"] = config.job.micro_batch_size * config.world_size
    return data


def _job(data: dict) -> dict:
    data["job"].update(max_steps=data["job"]["max_steps"] + 100, learning_rate=1.0e-5, run_name="another-run")
    return data


def _image_digest(data: dict) -> dict:
    data["ray"]["image"] = f"{data['ray']['image']}@{DIGEST}"
    return data


def _more_nodes(data: dict) -> dict:
    group = data["cluster"]["worker_groups"][0]
    group["nodes"] += 1
    if group.get("max_nodes") is not None:
        group["max_nodes"] = max(group["max_nodes"], group["nodes"])
    return _fit_batch(data)


def _add_group(data: dict) -> dict:
    extra = copy.deepcopy(data["cluster"]["worker_groups"][0])
    extra.update(name="extra", nodes=1)
    extra.pop("max_nodes", None)
    data["cluster"]["worker_groups"].append(extra)
    return _fit_batch(data)


def _toggle_autoscaling(data: dict) -> dict:
    data["autoscaling"]["enabled"] = not data["autoscaling"]["enabled"]
    return data


def _set(path: str, value: object) -> Callable[[dict], dict]:
    def edit(data: dict) -> dict:
        *parents, leaf = path.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[leaf] = value
        return data
    return edit


# Routine edits, on every shipped file.
EVERY_FILE = {"job fields": _job, "image digest": _image_digest, "a group's nodes": _more_nodes,
              "add a worker group": _add_group, "autoscaling on/off": _toggle_autoscaling}
# More routine edits, on the default file.
DEFAULT_ONLY = {
    "scale-down minutes": _set("autoscaling.scale_down_minutes", 30),
    "CloudWatch add-on on": _set("cluster.cloudwatch_observability", True),
    "admin role": _set("cluster.admin_role_arn", "arn:aws:iam::123456789012:role/Admin"),
    "public CIDRs": lambda data: _set("cluster.public_access_cidrs", ["203.0.113.0/24"])(
        _set("cluster.endpoint_access", "public_and_private")(data)),
    "system node count": _set("cluster.system_nodes.nodes", 3),
    "Ray head size": _set("ray.head.cpu", 6),
    "checkpoint expiry": _set("storage.checkpoint_expiry_days", 60),
    "NCCL debug": _set("nccl.debug", "WARN"),
}


def _all_of(edits: dict[str, Callable[[dict], dict]]) -> Callable[[dict], dict]:
    """Every edit at once: one synthesis instead of one each (a create-only change names its property, so a
    failure still says which edit made it)."""
    def edit(data: dict) -> dict:
        for one in edits.values():
            data = one(data)
        return data
    return edit


COMBINED = {"every routine edit": _all_of(EVERY_FILE), "every default-file edit": _all_of(DEFAULT_ONLY)}


@cache
def _templates(file_key: str, edit_name: str | None) -> tuple[ClusterConfig, dict]:
    data = yaml.safe_load(SHIPPED[file_key].read_text())
    if edit_name:
        data = {**EVERY_FILE, **DEFAULT_ONLY, **REPLACING, **COMBINED}[edit_name](data)
    path = _ROOT / f"{file_key}-{(edit_name or 'base').replace(' ', '_').replace('/', '_')}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    config = load_config(path)
    return config, synthesize(config, path.with_suffix(".out"))


def _changes(file_key: str, edit_name: str) -> list[Change]:
    _, before = _templates(file_key, None)
    config, after = _templates(file_key, edit_name)
    return changes(before, after, region=config.region)


def _key_resources(templates: dict) -> dict[tuple[str, str], dict]:
    return {(stack, logical): r for stack, t in templates.items() for logical, r in t["Resources"].items()
            if r["Type"] in KEY_TYPES}


def _value_at(resource: dict, pointer: str) -> object:
    value = resource.get("Properties", {})
    for part in pointer.split("/")[2:]:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _assert_safe(file_key: str, edit_name: str) -> None:
    config, before = _templates(file_key, None)
    _, after = _templates(file_key, edit_name)
    old, new = _key_resources(before), _key_resources(after)
    assert old.keys() <= new.keys(), f"{edit_name}: lost {sorted(old.keys() - new.keys())}"
    for key, resource in old.items():
        for pointer in create_only_properties(resource["Type"], config.region):
            assert _value_at(resource, pointer) == _value_at(new[key], pointer), (key, pointer)
    replaced = [c.line() for c in _changes(file_key, edit_name) if c.action == "replace"]
    assert replaced == [], f"{edit_name} on {file_key}: {replaced}"


# Each synthesis takes seconds, so: each routine edit alone on the default file, all of them at once on every
# shipped file, and the default file's further edits at once.
@pytest.mark.parametrize("edit_name", sorted(EVERY_FILE))
def test_routine_edit_replaces_nothing(edit_name):
    _assert_safe("cluster", edit_name)


@pytest.mark.parametrize("file_key", sorted(SHIPPED))
def test_every_routine_edit_at_once_replaces_nothing_in_any_shipped_file(file_key):
    _assert_safe(file_key, "every routine edit")


def test_more_routine_edits_replace_nothing():
    _assert_safe("cluster", "every default-file edit")


def test_create_only_properties_come_from_cfn_lints_schemas():
    # The schema's own list, e.g. a node group's instance types and capacity type cannot change in place.
    assert {"/properties/InstanceTypes", "/properties/CapacityType", "/properties/Subnets"} <= set(
        create_only_properties("AWS::EKS::Nodegroup", "us-east-2"))
    assert "/properties/BucketName" in create_only_properties("AWS::S3::Bucket", "us-east-2")
    # cfn-lint reads a custom resource as AWS::CloudFormation::CustomResource: only its ServiceToken.
    assert create_only_properties("Custom::AWSCDK-EKS-HelmChart", "us-east-2") == ("/properties/ServiceToken",)


# ---- edits that do replace or roll something, and are reported --------------------------------

REPLACING = {
    "system instance type": _set("cluster.system_nodes.instance_type", "m7i.4xlarge"),
    "spot capacity": lambda d: (d["cluster"]["worker_groups"][0].update(capacity="spot"), d)[1],
    "GPU availability zone": _set("gpu_availability_zone", "us-east-2a"),
    "rename a worker group": lambda d: (d["cluster"]["worker_groups"][0].update(name="gpu-a"), d)[1],
    "GPU disk size": lambda d: (d["cluster"]["worker_groups"][0].update(disk_gib=500), d)[1],
}


def _by_action(edit_name: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for change in _changes("cluster", edit_name):
        out.setdefault(change.action, set()).add(change.type)
    return out


def test_system_instance_type_replaces_the_system_node_group():
    (change,) = [c for c in _changes("cluster", "system instance type") if c.type == "AWS::EKS::Nodegroup"]
    assert change.action == "replace" and "InstanceTypes" in change.reason and "System" in change.logical_id


def test_capacity_type_replaces_the_gpu_node_group():
    (change,) = [c for c in _changes("cluster", "spot capacity") if c.type == "AWS::EKS::Nodegroup"]
    assert change.action == "replace" and "CapacityType" in change.reason


def test_gpu_availability_zone_replaces_subnets_and_every_node_group_through_the_export():
    found = [c for c in _changes("cluster", "GPU availability zone") if c.type == "AWS::EKS::Nodegroup"]
    assert len(found) == 2 and all("refers to" in c.reason and "Subnet" in c.reason for c in found)
    assert "AWS::EC2::Subnet" in _by_action("GPU availability zone")["replace"]


def test_renaming_a_worker_group_deletes_its_node_group():
    assert "AWS::EKS::Nodegroup" in _by_action("rename a worker group")["delete"]


def test_disk_size_rolls_the_nodes_but_keeps_the_node_group():
    assert _by_action("GPU disk size") == {"roll nodes": {"AWS::EC2::LaunchTemplate"}}


def test_changes_follow_an_export_into_another_stack():
    old = {"net": {"Resources": {"Sub": {"Type": "AWS::EC2::Subnet", "Properties": {"AvailabilityZone": "a"}}},
                   "Outputs": {"O": {"Value": {"Ref": "Sub"}, "Export": {"Name": "net:Sub"}}}},
           "app": {"Resources": {"Ng": {"Type": "AWS::EKS::Nodegroup",
                                        "Properties": {"Subnets": [{"Fn::ImportValue": "net:Sub"}]}}}}}
    new = copy.deepcopy(old)
    new["net"]["Resources"]["Sub"]["Properties"]["AvailabilityZone"] = "b"
    assert [(c.stack, c.logical_id, c.action) for c in changes(old, new, region="us-east-2")] == [
        ("app", "Ng", "replace"), ("net", "Sub", "replace")]


# ---- ops.check --against --------------------------------------------------------------------

def _check(capsys, *argv: str) -> tuple[int, str]:
    from ops.check import main

    code = main(list(argv))
    return code, capsys.readouterr().out


def test_check_against_a_previous_file_names_the_replaced_node_group(capsys):
    _templates("cluster", "spot capacity")
    code, out = _check(capsys, str(_ROOT / "cluster-spot_capacity.yaml"), "--against", str(DEFAULT_FILE))
    assert code == 0
    assert "replace: ray-efa-cluster/WorkersgpuNodegroup" in out and "create-only CapacityType" in out
    assert "REPLACES OR DELETES the cluster, a node group or the bucket" in out


def test_check_against_cdk_out_reads_the_last_synthesized_templates(capsys):
    _templates("cluster", None)
    _templates("cluster", "system instance type")
    code, out = _check(capsys, str(_ROOT / "cluster-system_instance_type.yaml"), "--against",
                       str(_ROOT / "cluster-base.out"))
    assert code == 0 and "replace: ray-efa-cluster/ClusterNodegroupSystem" in out


def test_check_against_says_when_nothing_is_replaced(capsys):
    _templates("cluster", "job fields")
    code, out = _check(capsys, str(_ROOT / "cluster-job_fields.yaml"), "--against", str(DEFAULT_FILE))
    assert code == 0 and "against " in out and "replaces nothing" in out and "replace:" not in out
