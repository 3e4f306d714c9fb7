"""Every variable-file field states its limit, and the limits are the parsers' own, read from their artifacts.

The artifacts read offline: cfn-lint's CloudFormation resource schemas, botocore's service models, the
KubeRay RayJob CRD in ../shared/kuberay, aws-cdk-lib's bundled network-util.js, `packaging`, Ray's
`CheckpointConfig`, numpy's seed range. Each limit is shown accepted and one past it refused.
"""

from __future__ import annotations

import re
import tarfile
import types
import typing
from functools import cache
from pathlib import Path

import botocore.session
import pytest
import yaml
from pydantic import BaseModel, ValidationError

from config import ClusterConfig
from config.base import INT32_MAX
from config.cluster_fields import INSTANCE_TYPE_PATTERN
from config.reference import constraint_text
from config.subnets import carve
from tests.helpers import cdk_app, default_data
from tools import pins

# KubeRay 1.7.0's RayJob CRD, verified against its pin, from wherever this checkout has it (tools/pins.py: the mirror,
# the cache or a download by `make setup`), not only from ../shared, which a user's clone lacks.
KUBERAY_FILE = "ray.io_rayjobs.yaml"


@cache
def cfn(resource_type: str) -> dict:
    from cfnlint.schema.manager import PROVIDER_SCHEMA_MANAGER

    return PROVIDER_SCHEMA_MANAGER.get_resource_schema("us-east-1", resource_type).schema


@cache
def botocore_model(service: str):
    return botocore.session.get_session().get_service_model(service)


@cache
def rayjob_spec() -> dict:
    text = pins.fetch(KUBERAY_FILE)[0].read_text()
    crd = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # 13k lines
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]


def int32_max(schema: dict) -> int:
    assert schema["format"] == "int32"
    return 2**31 - 1


@cache
def cdk_network_util() -> str:
    import aws_cdk

    bundle = next(Path(aws_cdk.__file__).parent.glob("_jsii/aws-cdk-lib@*.jsii.tgz"))
    with tarfile.open(bundle) as tar:
        return tar.extractfile("package/aws-ec2/lib/network-util.js").read().decode()


def gp3_max_gib() -> int:
    text = cfn("AWS::EC2::LaunchTemplate")["definitions"]["Ebs"]["properties"]["VolumeSize"]["description"]
    return int(re.search(r"gp3``: 1 - ([\d,]+) GiB", text).group(1).replace(",", ""))


def errors_at(path: str, value) -> list[dict]:
    """Validation errors located at dotted `path` when the default file has `value` there."""
    data = default_data()
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
    node[keys[-1]] = value
    try:
        ClusterConfig.model_validate(data)
    except ValidationError as exc:
        return [e for e in exc.errors() if ".".join(map(str, e["loc"])) == path]
    return []


# (field path, the limit read from the artifact, the value one past it)
LIMITS = {
    "eks nodegroup Capacity min (nodes)": lambda: ("cluster.worker_groups.0.nodes",
                                                   botocore_model("eks").shape_for("Capacity").metadata["min"], -1),
    "eks nodegroup Capacity min (max_nodes)": lambda: (
        "cluster.worker_groups.0.max_nodes", botocore_model("eks").shape_for("Capacity").metadata["min"], -1),
    "eks nodegroup ZeroCapacity min (min_nodes)": lambda: (
        "cluster.worker_groups.0.min_nodes", botocore_model("eks").shape_for("ZeroCapacity").metadata["min"], -1),
    "eks nodegroup Capacity min (system nodes)": lambda: (
        "cluster.system_nodes.nodes", botocore_model("eks").shape_for("Capacity").metadata["min"], -1),
    "cfn launch template gp3 max (system disk)": lambda: ("cluster.system_nodes.disk_gib", gp3_max_gib(), +1),
    "cfn launch template gp3 max (worker disk)": lambda: ("cluster.worker_groups.0.disk_gib", gp3_max_gib(), +1),
    "cfn launch template gp3 max (EC2 head disk)": lambda: ("ec2.head_disk_gib", gp3_max_gib(), +1),
    "RayJob activeDeadlineSeconds int32": lambda: (
        "job.timeout_hours", int32_max(rayjob_spec()["activeDeadlineSeconds"]) // 3600, +1),
    "RayJob ttlSecondsAfterFinished int32": lambda: (
        "job.ttl_hours", int32_max(rayjob_spec()["ttlSecondsAfterFinished"]) // 3600, +1),
    "RayJob backoffLimit int32": lambda: ("job.retries", int32_max(rayjob_spec()["backoffLimit"]), +1),
    "S3 NoncurrentDays integer": lambda: (
        "storage.noncurrent_days",
        INT32_MAX if botocore_model("s3").shape_for("Days").type_name == "integer" else None, +1),
    "S3 Expiration Days integer": lambda: (
        "storage.checkpoint_expiry_days",
        INT32_MAX if botocore_model("s3").shape_for("Days").type_name == "integer" else None, +1),
}


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_artifact_limit_is_accepted_and_one_past_refused(name: str):
    path, limit, step = LIMITS[name]()
    assert limit is not None
    assert errors_at(path, limit) == [], f"{path}={limit} (the limit itself) was refused"
    assert errors_at(path, limit + step), f"{path}={limit + step} (one past the limit) was accepted"


def test_s3_bucket_name_length_is_cfn_lints():
    schema = cfn("AWS::S3::Bucket")["properties"]["BucketName"]
    longest = "a" * schema["maxLength"]
    assert re.fullmatch(schema["pattern"], longest)
    assert errors_at("storage.bucket_name", longest) == []
    assert errors_at("storage.bucket_name", longest + "a")


def test_cluster_name_fits_eks_and_is_narrower():
    schema = cfn("AWS::EKS::Cluster")["properties"]["Name"]
    longest = "r" + "a" * 40
    assert len(longest) <= schema["maxLength"] and re.match(schema["pattern"], longest)
    assert errors_at("cluster.name", longest) == []
    assert errors_at("cluster.name", longest + "a")


def test_kubernetes_version_pattern_is_cfn_lints():
    pattern = cfn("AWS::EKS::Cluster")["properties"]["Version"]["pattern"]
    assert re.fullmatch(pattern, "1.35") and errors_at("cluster.kubernetes_version", "1.35") == []
    assert not re.fullmatch(pattern, "1.350") and errors_at("cluster.kubernetes_version", "1.350")


@pytest.mark.slow
def test_vpc_mask_range_is_cdks():
    low, high = map(int, re.search(r"VPCs must be between /(\d+) and /(\d+)", cdk_network_util()).groups())
    assert errors_at("network.vpc_cidr", f"10.0.0.0/{low}") == []
    assert errors_at("network.vpc_cidr", f"10.0.0.0/{high}") == []
    assert errors_at("network.vpc_cidr", f"10.0.0.0/{low - 1}")
    assert errors_at("network.vpc_cidr", f"10.0.0.0/{high + 1}")


def test_iam_arn_length_is_botocores():
    longest = botocore_model("iam").shape_for("arnType").metadata["max"]
    prefix = "arn:aws:iam::123456789012:role/"
    assert errors_at("cluster.admin_role_arn", prefix + "r" * (longest - len(prefix))) == []
    assert errors_at("cluster.admin_role_arn", prefix + "r" * (longest - len(prefix) + 1))


def test_every_botocore_instance_type_matches_the_pattern():
    names = botocore_model("ec2").shape_for("InstanceType").enum
    assert names and all(re.fullmatch(INSTANCE_TYPE_PATTERN, n) for n in names)


def test_catalog_instance_types_are_ec2s():
    from config.catalog import load_catalog

    known = set(botocore_model("ec2").shape_for("InstanceType").enum)
    assert set(load_catalog().instances) <= known


@pytest.mark.slow
def test_keep_checkpoints_floor_is_rays():
    from ray.train import CheckpointConfig

    CheckpointConfig(num_to_keep=1)
    with pytest.raises(ValueError):
        CheckpointConfig(num_to_keep=0)
    assert errors_at("job.keep_checkpoints", 1) == []
    assert errors_at("job.keep_checkpoints", 0)


def test_seed_range_is_numpys():
    import numpy as np

    np.random.seed(2**32 - 1)
    with pytest.raises(ValueError):
        np.random.seed(2**32)
    assert errors_at("job.seed", 2**32 - 1) == []
    assert errors_at("job.seed", 2**32)


@pytest.mark.parametrize(("requirement", "valid"), [("datasets==4.0.0", True), ("peft>=0.13,<1", True),
                                                      ("datasets==", False), ("not a requirement!", False)])
def test_pip_requirements_are_packagings(requirement: str, valid: bool):
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        Requirement(requirement)
        parses = True
    except InvalidRequirement:
        parses = False
    assert parses is valid
    assert (errors_at("ray.extra_pip_packages", [requirement]) == []) is valid


@pytest.mark.parametrize(("path", "value"), [
    ("cluster.public_access_cidrs", ["10.0.0.1/24"]),
    ("cluster.public_access_cidrs", ["not-a-cidr"]),
    ("network.vpc_cidr", "224.0.0.0/16"),
    ("job.model", ""),
    ("job.dataset", " "),
    ("job.model", "bad--id/x"),
    ("job.instruction_field", ""),
    ("job.learning_rate", float("nan")),
    ("job.grad_clip", float("inf")),
    ("cluster.worker_groups.0.capacity_reservation_id", "cr-123"),
    ("cluster.admin_role_arn", "arn:aws:iam::12345:role/Admin"),
    ("ray.namespace", "-ray"),
])
def test_values_the_parsers_refuse_are_refused(path: str, value):
    assert errors_at(path, value)


def _leaves(annotation) -> list:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [leaf for arg in typing.get_args(annotation) for leaf in _leaves(arg)]
    return [annotation]


def _walk(model: type[BaseModel], prefix: str = ""):
    validated = {f for d in model.__pydantic_decorators__.field_validators.values() for f in d.info.fields}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        inner = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            yield from _walk(inner, f"{prefix}{name}.")
            continue
        yield f"{prefix}{name}", field, name in validated


def test_every_field_has_a_constraint_or_a_reason():
    """A field is complete when its type admits only valid values (bool, an enum), or the model states a
    constraint (bounds, lengths, pattern, a validator) and its source, or a written reason any value is fine."""
    missing = []
    for path, field, validated in _walk(ClusterConfig):
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        kinds = {k for k in _leaves(field.annotation) if k is not type(None)}
        closed = kinds and all(k is bool or typing.get_origin(k) is typing.Literal for k in kinds)
        if closed or "any_value" in extra:
            continue
        if not (constraint_text(field) or validated) or "limit_source" not in extra:
            missing.append(path)
    assert missing == [], f"fields with no constraint or no stated source: {missing}"


@pytest.mark.slow
def test_subnet_carve_matches_cdk():
    """config/subnets.py gives the blocks CDK's ec2.Vpc writes into the template (aws-cdk-lib, in process)."""
    import aws_cdk as cdk
    from aws_cdk import aws_ec2 as ec2

    cases = [("10.0.0.0/16", 2), ("10.0.0.0/20", 3), ("172.16.0.0/22", 3)]
    app = cdk_app()
    for i, (cidr, azs) in enumerate(cases):
        stack = cdk.Stack(app, f"S{i}", env=cdk.Environment(account="123456789012", region="us-east-2"))
        ec2.Vpc(stack, "Vpc", ip_addresses=ec2.IpAddresses.cidr(cidr), nat_gateways=1,
                availability_zones=[f"us-east-2{c}" for c in "abc"[:azs]],
                subnet_configuration=[
                    ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                    ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)])
    assembly = app.synth()
    for i, (cidr, azs) in enumerate(cases):
        template = assembly.get_stack_by_name(f"S{i}").template
        blocks = sorted(r["Properties"]["CidrBlock"] for r in template["Resources"].values()
                        if r["Type"] == "AWS::EC2::Subnet")
        plan = carve(cidr, azs)
        assert plan.problem is None
        assert sorted(str(n) for n in plan.public + plan.private) == blocks


@pytest.mark.parametrize(("cidr", "azs"), [("10.0.0.0/23", 2), ("10.0.0.0/24", 3), ("10.0.0.0/28", 2)])
def test_vpc_too_small_is_refused_like_cdk(cidr: str, azs: int):
    import aws_cdk as cdk
    from aws_cdk import aws_ec2 as ec2

    assert carve(cidr, azs).problem
    stack = cdk.Stack(cdk_app(), "S", env=cdk.Environment(account="123456789012", region="us-east-2"))
    with pytest.raises(Exception, match="exceeds remaining space|not a valid"):
        ec2.Vpc(stack, "Vpc", ip_addresses=ec2.IpAddresses.cidr(cidr), nat_gateways=1,
                availability_zones=[f"us-east-2{c}" for c in "abc"[:azs]],
                subnet_configuration=[
                    ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                    ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)])
