"""Day two, as synthesized templates: the first deploy, changes during a run, teardown, redeploy, a second cluster.

Each step synthesizes the shipped variable file with one edit and classifies every resource as CloudFormation will
treat it (ops/lifecycle.py: create-only properties from the provider schemas cfn-lint ships, Ref/GetAtt
propagation, exports), and every node group by what happens to its nodes. The steps are the ones docs/lifecycle.md
walks through.
"""

from __future__ import annotations

import tempfile
from functools import cache
from pathlib import Path

import pytest

from config import load_config
from ops.lifecycle import Step, classify, identity, name_property, physical_names
from tests.helpers import write_variant

pytestmark = pytest.mark.slow  # ten syntheses (about 10 s each on the 2-core machine)

REGION = "us-east-2"
_ROOT = Path(tempfile.mkdtemp(prefix="lifecycle-"))

# The variable file at each step: the shipped file with these edits (worker group 0 merged, not replaced).
STEPS: dict[str, dict] = {
    "first": {},                                    # the first deploy: nothing exists yet
    "deployed": {"group": {"deployed": True}},      # the one edit after it: the GPU group exists
    "max_nodes": {"group": {"deployed": True, "max_nodes": 4}},
    "min_nodes": {"group": {"deployed": True, "min_nodes": 1}},
    "instance_type": {"group": {"deployed": True, "instance_type": "g6.24xlarge"}},
    "node_ami": {"group": {"deployed": True}, "file": {"cluster": {"node_ami_release_version": "1.34.1-20260724"}}},
    "addon": {"group": {"deployed": True}, "addon": ("coredns", "v1.12.4-eksbuild.2")},
    # After `cdk destroy --all` (the bucket kept): the kept bucket by name, node groups created anew.
    "redeploy": {"file": {"storage": {"existing_bucket": True}}},
    # Another cluster in the same account and region.
    "second": {"group": {"deployed": True}, "file": {"cluster": {"name": "ray-efa-two"}}},
}
DURING_A_RUN = ("max_nodes", "min_nodes", "instance_type", "node_ami", "addon")


@cache
def templates(step: str) -> dict[str, dict]:
    from ops.replacements import synthesize
    from stacks import versions

    edit = STEPS[step]
    path = write_variant(_ROOT, edit.get("file", {}), name=f"{step}.yaml", group=edit.get("group"))
    addon = edit.get("addon")
    pins = versions.MANAGED_ADDON_VERSIONS["1.34"]
    saved = dict(pins)
    if addon:
        pins[addon[0]] = addon[1]
    try:
        return synthesize(load_config(path), _ROOT / step)
    finally:
        pins.clear()
        pins.update(saved)


@cache
def step(name: str) -> Step:
    """`name` deployed over the running cluster ("deployed"); the first deploy and the redeploy over nothing."""
    before = {} if name in ("first", "redeploy") else templates("first" if name == "deployed" else "deployed")
    return classify(before, templates(name), region=REGION)


@cache
def teardown() -> Step:
    return classify(templates("deployed"), {}, region=REGION)


def _gpu(templates_: dict[str, dict]) -> dict:
    (group,) = [r for t in templates_.values() for k, r in t["Resources"].items()
                if r["Type"] == "AWS::EKS::Nodegroup" and k.startswith("Workersgpu")]
    return group


def _classes(name: str) -> dict[str, str]:
    """Node group class by logical id prefix: "system" and "gpu"."""
    out = {}
    for (_, logical), cls in step(name).nodegroups.items():
        out["gpu" if logical.startswith("Workersgpu") else "system"] = cls
    return out


# ---- the first deploy, and the edit after it ----------------------------------------------------

def test_the_first_deploy_creates_every_resource():
    assert {v.action for v in step("first").verdicts.values()} == {"create"}


def test_the_first_deploy_gives_the_gpu_group_its_desired_size():
    # EKS API NodegroupScalingConfig: "When creating a node group, you must specify all or none of the properties."
    assert _gpu(templates("first"))["Properties"]["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 0, "MaxSize": 2}


def test_marking_the_group_deployed_drops_desired_size_and_touches_nothing():
    assert "DesiredSize" not in _gpu(templates("deployed"))["Properties"]["ScalingConfig"]
    # Removing DesiredSize: "When using CloudFormation, no action occurs" (EKS API NodegroupScalingConfig).
    assert _classes("deployed") == {"system": "unchanged", "gpu": "unchanged"}
    assert step("deployed").by_action("create", "replace", "delete", "release") == []


# ---- changes during a run -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["max_nodes", "min_nodes"])
def test_a_min_or_max_change_only_scales_the_gpu_group(name):
    assert _classes(name) == {"system": "unchanged", "gpu": "scaled"}


@pytest.mark.parametrize("name", ["max_nodes", "min_nodes"])
def test_a_min_or_max_change_leaves_the_autoscalers_size_alone(name):
    assert "DesiredSize" not in _gpu(templates(name))["Properties"]["ScalingConfig"]


def test_an_instance_type_change_rolls_the_gpu_group():
    assert _classes("instance_type") == {"system": "unchanged", "gpu": "rolled"}


def test_a_node_ami_change_rolls_every_group():
    assert _classes("node_ami") == {"system": "rolled", "gpu": "rolled"}


def test_an_addon_version_change_updates_the_addon_in_place_and_no_node():
    updated = [(v.type, v.action) for v in step("addon").verdicts.values() if v.action != "unchanged"]
    assert updated == [("AWS::EKS::Addon", "update")]
    assert set(_classes("addon").values()) == {"unchanged"}


@pytest.mark.parametrize("name", DURING_A_RUN)
def test_a_change_during_a_run_creates_replaces_and_deletes_nothing(name):
    assert [(v.logical_id, v.action, v.reasons) for v in step(name).by_action("create", "replace", "delete")] == []


@pytest.mark.parametrize("name", ["deployed", *DURING_A_RUN])
def test_no_named_resource_is_replaced(name):
    # CloudFormation "Name type": a resource with a custom name cannot be replaced.
    named = [v.logical_id for v in step(name).by_action("replace") if name_property(v.type, REGION)]
    assert named == []


@pytest.mark.parametrize("name", ["deployed", *DURING_A_RUN])
def test_no_export_another_stack_imports_changes(name):
    assert step(name).changed_exports == {}


def test_config_check_says_a_rolled_group_ends_a_running_job(capsys):
    from config.__main__ import main

    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "instance_type, disk_gib or cluster.node_ami_release_version replaces every node of the group one at " \
           "a time: a running job ends" in out


def test_the_docs_say_a_rolled_group_ends_a_running_job():
    from tests.helpers import REPO

    text = (REPO / "docs" / "lifecycle.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `instance_type`"))
    assert "**rolled**" in row and "**ends**" in row
    assert "`cluster.node_ami_release_version`: the group is\n  rolled" in text or "**a running job ends**" in text


def test_stacks_check_says_a_rolled_group_ends_a_running_job():
    from ops.check import describe

    lines = describe(step("instance_type"))
    assert any("rolled" in line and "a running job ends" in line for line in lines), lines


# ---- teardown and redeploy ----------------------------------------------------------------------

def test_teardown_keeps_the_bucket_and_its_policy_and_deletes_the_rest():
    released = sorted((v.type, v.logical_id) for v in teardown().by_action("release"))
    # The bucket and its TLS-only policy (storage.removal_policy: retain), and the log groups of CDK's kubectl
    # handler and its framework Lambda (CDK creates them retained): they hold what helm said during the deploy,
    # which is what explains a rolled-back first deploy; docs/lifecycle.md names them and how to delete them.
    assert [kind for kind, _ in released] == ["AWS::Logs::LogGroup", "AWS::Logs::LogGroup", "AWS::S3::Bucket",
                                              "AWS::S3::BucketPolicy"]
    assert all("KubectlProvider" in logical for kind, logical in released if kind == "AWS::Logs::LogGroup")
    assert {v.action for v in teardown().verdicts.values()} == {"delete", "release"}


def test_teardown_deletes_the_secrets_key():
    (key,) = teardown().of_type("AWS::KMS::Key").values()
    assert key.action == "delete"


def test_the_redeploy_creates_nothing_the_teardown_left_in_the_account():
    kept = {identity(templates("deployed")[v.stack]["Resources"][v.logical_id], templates("deployed")[v.stack],
                     REGION) for v in teardown().by_action("release")} - {None}
    # The bucket and its policy have written identities (the log groups are named after generated function names).
    assert len(kept) == 2
    created = {identity(r, t, REGION): f"{s}/{k}" for s, t in templates("redeploy").items()
               for k, r in t["Resources"].items()}
    assert {i: created[i] for i in kept if i in created} == {}


def test_the_redeploy_uses_the_kept_bucket_by_the_name_it_had():
    bucket = next(r for t in templates("deployed").values() for r in t["Resources"].values()
                  if r["Type"] == "AWS::S3::Bucket")
    outputs = templates("redeploy")["ray-efa-storage"]["Outputs"]
    assert outputs["BucketName"]["Value"] == bucket["Properties"]["BucketName"]


def test_the_redeploy_creates_the_node_groups_with_a_desired_size():
    assert _gpu(templates("redeploy"))["Properties"]["ScalingConfig"]["DesiredSize"] == 0


# ---- a second cluster ---------------------------------------------------------------------------

def test_a_second_cluster_shares_no_name_with_the_first():
    first, second = (physical_names(templates(n), region=REGION) for n in ("deployed", "second"))
    assert sorted(set(first) & set(second)) == []
    kinds = {name.split(" ")[0] for name in first}
    assert kinds == {"stack", "export", "AWS::EKS::Cluster", "AWS::EKS::Addon", "AWS::S3::Bucket",
                     "AWS::S3::BucketPolicy"}


@pytest.mark.parametrize("deployed", [False, True])
def test_a_capacity_block_group_without_the_autoscaler_keeps_its_hand_set_size_once_deployed(tmp_path, deployed):
    # Created at desired 0 (the block may not have started); scaled by hand when it starts (docs/deploying.md).
    from ops.replacements import synthesize
    from tests.helpers import EXAMPLES

    path = write_variant(tmp_path, {"autoscaling": {"enabled": False}}, base=EXAMPLES / "p5.yaml",
                         group={"deployed": deployed})
    config = load_config(path)
    (group,) = [r for t in synthesize(config, tmp_path / "out").values() for k, r in t["Resources"].items()
                if r["Type"] == "AWS::EKS::Nodegroup" and k.startswith("Workers")]
    assert ("DesiredSize" in group["Properties"]["ScalingConfig"]) is not deployed
