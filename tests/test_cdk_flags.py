"""CDK feature flags: cdk.json carries the recommended set, and the in-process apps of the tests see it.

`cdk synth` hands the app cdk.json's `context`; the tests build the `App` in-process, so they go through
tests/helpers.py's `cdk_app`, which passes the same context. The recommended set is what the pinned CLI's
`cdk init` writes (and what the pinned aws-cdk-lib lists as `CURRENTLY_RECOMMENDED_FLAGS`), so a version bump
that brings new flags fails here until cdk.json takes them or KEPT names them with a reason.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
from importlib.metadata import version
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from ops.context import CDK_JSON, cdk_json_context
from tests.helpers import REPO, cdk_app
from tests.stack_synth import VARIANTS, synth

pytestmark = pytest.mark.slow  # synthesizes and runs the pinned CLI; `make check` leaves it out

# Flags whose recommended value cdk.json deliberately does not take: flag -> (our value, why).
KEPT = {
    "@aws-cdk/core:defaultCrossStackReferences": (
        "strong",
        "The cluster and storage stacks import the network stack's VPC and subnets and the cluster's name and ARN "
        "through Fn::ImportValue exports, so CloudFormation refuses to delete or change an export while a stack "
        "still imports it (a teardown in the wrong order fails instead of orphaning the cluster). 'strong' is also "
        "how an unconfigured app behaves (unconfiguredBehavesLike v2: strong), so deployed stacks keep their "
        "exports. Moving to the recommended 'weak' (Fn::GetStackOutput) takes two deploys, 'both' then 'weak', "
        "as the flag's documentation says (aws-cdk-lib 2.275, cx-api/lib/features.js)."),
}

_ENV = {**os.environ, "CDK_DISABLE_VERSION_CHECK": "true", "CDK_DISABLE_CLI_TELEMETRY": "true",
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1"}


def _partition_of_a_us_east_2_stack(app: cdk.App):
    stack = cdk.Stack(app, "Probe", env=cdk.Environment(region="us-east-2"))
    return stack.resolve(stack.partition)


def _cdk_init_context(directory: Path) -> dict:
    """The context of the cdk.json that the pinned CLI's `cdk init app --language python` writes (offline)."""
    app_dir = directory / "app"
    app_dir.mkdir()
    proc = subprocess.run([str(REPO / "node_modules" / ".bin" / "cdk"), "init", "app", "--language", "python",
                           "--generate-only", "--no-notices"], cwd=app_dir, env=_ENV, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((app_dir / "cdk.json").read_text())["context"]


def _differences(recommended: dict) -> tuple[list, list, list]:
    """(flags cdk.json lacks, flags cdk.json sets that are not recommended, values that differ unexplained)."""
    ours = cdk_json_context()
    missing = sorted(set(recommended) - set(ours))
    unknown = sorted(set(ours) - set(recommended))
    differ = [(k, ours[k], recommended[k]) for k in sorted(set(ours) & set(recommended))
              if ours[k] != recommended[k] and (k not in KEPT or KEPT[k][0] != ours[k])]
    return missing, unknown, differ


# ---- the in-process app sees cdk.json -------------------------------------------------------------

def test_every_cdk_json_context_value_reaches_the_synthesized_app():
    node = synth("default").stacks.network.node
    context = cdk_json_context()
    assert len(context) > 80
    assert {k: node.try_get_context(k) for k in context} == context


def test_a_flag_set_in_cdk_json_changes_the_in_process_app(tmp_path):
    """@aws-cdk/core:enablePartitionLiterals as cdk.json sets it (true: `aws` for a us-east-2 stack), then as a
    different cdk.json sets it (false: the AWS::Partition pseudo parameter)."""
    assert cdk_json_context()["@aws-cdk/core:enablePartitionLiterals"] is True
    assert _partition_of_a_us_east_2_stack(cdk_app()) == "aws"
    other = tmp_path / "cdk.json"
    data = json.loads(CDK_JSON.read_text())
    data["context"]["@aws-cdk/core:enablePartitionLiterals"] = False
    other.write_text(json.dumps(data))
    assert _partition_of_a_us_east_2_stack(cdk_app(cdk_json=other)) == {"Ref": "AWS::Partition"}


def _resources_without_cdk_metadata(template: dict) -> dict:
    """A template's resources, less CDKMetadata and the `aws:cdk:*` and `aws:asset:*` metadata only the CLI asks for."""
    out = {}
    for logical, res in template["Resources"].items():
        if res["Type"] == "AWS::CDK::Metadata":
            continue
        metadata = {k: v for k, v in (res.get("Metadata") or {}).items() if not k.startswith("aws:")}
        out[logical] = {**{k: v for k, v in res.items() if k != "Metadata"}, **({"Metadata": metadata} if metadata
                                                                                 else {})}
    return out


def test_in_process_templates_equal_what_cdk_synth_writes(tmp_path):
    """The pinned CLI's `cdk synth -c nag=true` of the default file, against the tests' in-process synthesis."""
    from tests.stack_synth import variant_file

    env = {k: v for k, v in _ENV.items() if k != "CLUSTER_CONFIG"}
    proc = subprocess.run([str(REPO / "node_modules" / ".bin" / "cdk"), "synth", "--quiet", "--no-notices",
                           "-c", f"config={variant_file('default')}", "-c", "nag=true", "-o", str(tmp_path / "out")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = synth("default")
    for path in result.template_files:
        cli = json.loads((tmp_path / "out" / path.name).read_text())
        assert _resources_without_cdk_metadata(cli) == _resources_without_cdk_metadata(json.loads(path.read_text()))
        # Template-level Metadata names the variable file (app.py's record_source), which only app.py adds.
        assert {k: v for k, v in cli.items() if k not in ("Resources", "Metadata")} == \
            {k: v for k, v in json.loads(path.read_text()).items() if k not in ("Resources", "Metadata")}


def test_stacks_check_synthesizes_with_cdk_json_too(tmp_path):
    """`python -m ops.check` compares against a cdk.out that `cdk synth` wrote: its own synthesis must carry the
    same flags, or every flag's resources would show as deleted."""
    from ops.replacements import synthesize

    result = synth("default")
    mine = synthesize(result.config, tmp_path / "out")
    for role, name in (("network", "ray-efa-network"), ("cluster", "ray-efa-cluster")):
        assert _resources_without_cdk_metadata(mine[name]).keys() == \
            _resources_without_cdk_metadata(result.templates[role]).keys()
    assert any(r["Type"] == "Custom::VpcRestrictDefaultSG" for r in mine["ray-efa-network"]["Resources"].values())


def test_context_given_to_the_helper_wins_over_cdk_json():
    """As `-c key=value` wins over cdk.json in `cdk synth`."""
    app = cdk_app(context={"@aws-cdk/core:enablePartitionLiterals": False})
    assert _partition_of_a_us_east_2_stack(app) == {"Ref": "AWS::Partition"}


def test_nothing_builds_an_app_without_cdk_json():
    """Every in-process `App` (the tests', `python -m ops.check`'s) comes from `ops.context.new_app`, through
    tests/helpers.py's `cdk_app` in the tests; only app.py, which the CLI runs with the context, builds its own."""
    offenders = []
    for path in [*REPO.glob("tests/*.py"), *REPO.glob("stacks/*.py"), *REPO.glob("ops/*.py")]:
        if path.relative_to(REPO).as_posix() == "ops/context.py":
            continue
        offenders += [f"{path.relative_to(REPO)}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1)
                      if re.search(r"\bApp\(", line) and not re.search(r"\b(cdk|new)_app\(", line)]
    assert not offenders, offenders


# ---- cdk.json against the recommended set ----------------------------------------------------------

def test_cdk_json_has_the_flags_the_pinned_clis_cdk_init_writes(tmp_path):
    missing, unknown, differ = _differences(_cdk_init_context(tmp_path))
    assert not missing, f"new recommended flags: add them to cdk.json (or to KEPT with a reason): {missing}"
    assert not unknown, f"cdk.json sets flags `cdk init` no longer writes: {unknown}"
    assert not differ, f"cdk.json differs from `cdk init` without a reason in KEPT: {differ}"


def test_cdk_json_has_the_pinned_aws_cdk_libs_recommended_flags(tmp_path):
    """The library's own list (cx-api's CURRENTLY_RECOMMENDED_FLAGS), read from the jsii bundle the Python package
    ships, so a bump of aws-cdk-lib alone also shows its new flags."""
    import aws_cdk

    bundle = Path(aws_cdk.__file__).parent / "_jsii" / f"aws-cdk-lib@{version('aws-cdk-lib')}.jsii.tgz"
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp_path, members=[m for m in tar.getmembers() if m.name.startswith("package/cx-api/")],
                       filter="data")
    features = tmp_path / "package" / "cx-api" / "lib" / "features.js"
    proc = subprocess.run(["node", "-e", f"process.stdout.write(JSON.stringify(require({str(features)!r})"
                                         ".CURRENTLY_RECOMMENDED_FLAGS))"],
                          env=_ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _differences(json.loads(proc.stdout)) == ([], [], [])


def test_every_kept_flag_still_differs_from_the_recommendation(tmp_path):
    """A KEPT entry whose value became the recommended one (or left cdk.json) is stale."""
    recommended, ours = _cdk_init_context(tmp_path), cdk_json_context()
    for flag, (value, reason) in KEPT.items():
        assert ours.get(flag) == value, flag
        assert recommended[flag] != value, flag
        assert len(reason) > 40, flag


# ---- what the adopted flags add --------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_the_vpcs_default_security_group_is_emptied(variant):
    """@aws-cdk/aws-ec2:restrictDefaultSecurityGroup: CDK's custom resource removes the default group's rules."""
    vpc_id = next(k for k, r in synth(variant).templates["network"]["Resources"].items()
                  if r["Type"] == "AWS::EC2::VPC")
    Template.from_json(synth(variant).templates["network"]).has_resource_properties(
        "Custom::VpcRestrictDefaultSG", {"DefaultSecurityGroupId": {"Fn::GetAtt": [vpc_id, "DefaultSecurityGroup"]}})


def test_cdk_lambdas_log_to_groups_that_expire():
    """@aws-cdk/aws-lambda:useCdkManagedLogGroup: the kubectl provider's functions log to log groups CDK creates
    with a retention, not to ones Lambda would create that never expire."""
    groups = [r["Properties"] for r in synth("default").templates["cluster"]["Resources"].values()
              if r["Type"] == "AWS::Logs::LogGroup"]
    assert len(groups) == 2
    for props in groups:
        assert props["RetentionInDays"] > 0
        assert props["LogGroupName"]["Fn::Join"][1][0] == "/aws/lambda/"


def test_cross_stack_references_stay_exports():
    """KEPT: strong references, Fn::ImportValue of the network stack's exports."""
    text = json.dumps(synth("default").templates["cluster"])
    assert '"Fn::ImportValue": "ray-efa-network:' in text
    assert "Fn::GetStackOutput" not in text
