"""`job.hf_token_secret` and `job.hf_token_kms_key_arn`: the forms the fields accept (limits from botocore's
Secrets Manager model), the gated-model warning of `config check`, and the IAM grant the stacks make:
GetSecretValue on exactly that secret (checked against real secret ARNs from moto), cdk-nag clean."""

from __future__ import annotations

import re

import pytest
from aws_cdk.assertions import Match, Template

from config import ConfigError
from config.hub import SECRET_NAME_MAX, gated_family, secret_iam_resource, token_warnings
from config.model import JobConfig
from tests.helpers import cdk_app, load_variant, write_variant
from tests.stack_synth import ALT_KMS_KEY, synth

ARN = "arn:aws:secretsmanager:us-east-2:123456789012:secret:ml/hf-token-AbC123"


def _botocore_name_max() -> int:
    import botocore.session

    model = botocore.session.get_session().get_service_model("secretsmanager")
    return model.operation_model("CreateSecret").input_shape.members["Name"].metadata["max"]


def test_name_limit_is_botocores():
    assert SECRET_NAME_MAX == _botocore_name_max() == 512


def test_a_name_at_the_limit_is_accepted_and_one_past_it_refused():
    assert JobConfig(hf_token_secret="a" * SECRET_NAME_MAX).hf_token_secret == "a" * SECRET_NAME_MAX
    with pytest.raises(ValueError, match="not a Secrets Manager secret name"):
        JobConfig(hf_token_secret="a" * (SECRET_NAME_MAX + 1))


@pytest.mark.parametrize("name", ["ml/hf-token", "prod_hf+token=1.x@team-a"])
def test_names_with_secrets_managers_characters_are_accepted(name):
    assert JobConfig(hf_token_secret=name).hf_token_secret == name


@pytest.mark.parametrize("name", ["hf token", "hf:token", "hf#token", ""])
def test_names_outside_the_charset_are_refused(name):
    with pytest.raises(ValueError, match="secret name"):
        JobConfig(hf_token_secret=name)


def test_a_complete_arn_is_accepted():
    assert JobConfig(hf_token_secret=ARN).hf_token_secret == ARN


@pytest.mark.parametrize("arn", [
    "arn:aws:secretsmanager:us-east-2:123456789012:secret:ml/hf-token-AbC1",  # suffix cut short
    "arn:aws:secretsmanager:us-east-2:12345:secret:ml/hf-token-AbC123",  # short account
    "arn:aws:kms:us-east-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",  # not a secret
])
def test_an_incomplete_or_foreign_arn_is_refused_with_how_to_get_the_arn(arn):
    with pytest.raises(ValueError, match="describe-secret"):
        JobConfig(hf_token_secret=arn)


def test_a_kms_alias_is_refused():
    with pytest.raises(ValueError, match="alias"):
        JobConfig(hf_token_secret="x", hf_token_kms_key_arn="arn:aws:kms:us-east-2:123456789012:alias/hf")


def test_a_kms_key_without_a_secret_is_refused_naming_both_fields(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_variant(tmp_path, {"job": {"hf_token_kms_key_arn": ALT_KMS_KEY}})
    assert "job.hf_token_kms_key_arn: set only with job.hf_token_secret" in str(err.value)


# ---- config check: gated families -----------------------------------------------------------------

@pytest.mark.parametrize(("model", "gated"), [("meta-llama/Llama-3.2-1B", True), ("google/gemma-2-2b-it", True),
                                               ("mistralai/Mistral-7B-v0.3", True), ("Qwen/Qwen2.5-1.5B", False),
                                               ("google/flan-t5-small", False)])
def test_gated_families(model, gated):
    assert (gated_family(model) is not None) == gated


def test_config_check_names_the_field_for_a_gated_model_without_a_token(tmp_path, capsys):
    from config.__main__ import main

    file = write_variant(tmp_path, {"job": {"model": "meta-llama/Llama-3.2-1B"}})
    assert main(["check", str(file)]) == 0  # a warning: the model may be on this machine
    out = capsys.readouterr().out
    assert "warning: job.model: 'meta-llama/Llama-3.2-1B' is gated" in out
    assert "set job.hf_token_secret" in out and "docs/gated-models.md" in out


def test_config_check_is_silent_with_a_token(tmp_path, capsys):
    from config.__main__ import main

    file = write_variant(tmp_path, {"job": {"model": "meta-llama/Llama-3.2-1B", "hf_token_secret": "ml/hf-token"}})
    assert main(["check", str(file)]) == 0
    assert "job.model" not in capsys.readouterr().out


def test_a_local_copy_of_a_gated_model_is_not_warned_about(tmp_path):
    (tmp_path / "meta-llama" / "Llama-3.2-1B").mkdir(parents=True)
    job = JobConfig(model="meta-llama/Llama-3.2-1B")
    assert token_warnings(job, base=tmp_path) == []
    assert len(token_warnings(job, base=tmp_path / "elsewhere")) == 1


# ---- the IAM resource, against real secret ARNs ---------------------------------------------------

def _iam_matches(pattern: str, value: str) -> bool:
    """IAM's resource wildcards: `*` any run of characters, `?` exactly one (IAM user guide, "Resource")."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value) is not None


def test_a_names_resource_matches_that_secret_and_no_neighbour(moto_server):
    sm = moto_server.client("secretsmanager")
    arns = {name: sm.create_secret(Name=name, SecretString="x")["ARN"]
            for name in ("iam-scope/hf-token", "iam-scope/hf-token2", "iam-scope/hf-token-other",
                         "iam-scope/hf-token-abcdef-x")}
    region, account = arns["iam-scope/hf-token"].split(":")[3:5]
    resource = secret_iam_resource("iam-scope/hf-token", partition="aws", region=region, account=account)
    assert resource.endswith(":secret:iam-scope/hf-token-??????")
    assert [name for name, arn in arns.items() if _iam_matches(resource, arn)] == ["iam-scope/hf-token"]


def test_an_arns_resource_is_the_arn_itself():
    assert secret_iam_resource(ARN, partition="aws", region="eu-west-1", account="000000000000") == ARN


# ---- the stacks ----------------------------------------------------------------------------------

_NAME_RESOURCE = {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":secretsmanager:us-east-2:",
                                    {"Ref": "AWS::AccountId"}, ":secret:ml/hf-token-??????"]]}


def _pod_role_policy(variant: str) -> dict:
    (policy,) = [r["Properties"] for r in synth(variant).templates["storage"]["Resources"].values()
                 if r["Type"] == "AWS::IAM::Policy" and "RayPodRole" in str(r["Properties"]["Roles"])]
    return policy


@pytest.mark.slow
def test_pod_role_may_read_exactly_the_named_secret():
    Template.from_json(synth("alt").templates["storage"]).has_resource_properties("AWS::IAM::Policy", {
        "Roles": [{"Ref": Match.string_like_regexp("RayPodRole")}],
        "PolicyDocument": {"Statement": Match.array_with([{
            "Sid": "ReadHfTokenSecret", "Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
            "Resource": _NAME_RESOURCE}])}})


@pytest.mark.slow
def test_pod_role_may_decrypt_with_the_key_only_through_secrets_manager_for_that_secret():
    Template.from_json(synth("alt").templates["storage"]).has_resource_properties("AWS::IAM::Policy", {
        "PolicyDocument": {"Statement": Match.array_with([{
            "Sid": "DecryptHfTokenSecret", "Effect": "Allow", "Action": "kms:Decrypt", "Resource": ALT_KMS_KEY,
            "Condition": {"StringEquals": {"kms:ViaService": "secretsmanager.us-east-2.amazonaws.com"},
                          "StringLike": {"kms:EncryptionContext:SecretARN": _NAME_RESOURCE}}}])}})


@pytest.mark.slow
def test_no_other_secrets_manager_or_kms_permission_anywhere():
    for variant in ("alt", "default"):
        for template in synth(variant).templates.values():
            for res in template["Resources"].values():
                if res["Type"] not in ("AWS::IAM::Policy", "AWS::IAM::Role"):
                    continue
                docs = [res["Properties"].get("PolicyDocument")] + [
                    p["PolicyDocument"] for p in res["Properties"].get("Policies", [])]
                for doc in filter(None, docs):
                    for st in doc["Statement"]:
                        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
                        touched = [a for a in actions if a.startswith(("secretsmanager:", "kms:"))]
                        if touched:
                            assert variant == "alt" and st.get("Sid") in ("ReadHfTokenSecret",
                                                                          "DecryptHfTokenSecret"), st


@pytest.mark.slow  # synthesizes the CDK app (pyproject.toml `markers`)
def test_without_a_secret_the_pod_role_has_no_secret_statement():
    sids = {st.get("Sid") for st in _pod_role_policy("default")["PolicyDocument"]["Statement"]}
    assert not sids & {"ReadHfTokenSecret", "DecryptHfTokenSecret"}


@pytest.mark.slow  # synthesizes the CDK app (pyproject.toml `markers`)
def test_the_alt_variant_with_the_secret_is_cdk_nag_clean():
    result = synth("alt")
    assert result.config.job.hf_token_secret == "ml/hf-token"
    assert not result.nag_violations and result.nag_error is None


def test_an_arn_is_granted_as_it_is_to_any_role_without_kms():
    """`grant_hf_token_read` for any grantee (the EC2 target's instance-profile roles call it too)."""
    import aws_cdk as cdk
    from aws_cdk import aws_iam as iam

    from stacks.hf_token import grant_hf_token_read

    stack = cdk.Stack(cdk_app(), "Grant")
    role = iam.Role(stack, "InstanceRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    added = grant_hf_token_read(role, JobConfig(hf_token_secret=ARN), region="us-east-2")
    assert len(added) == 1
    template = Template.from_stack(stack)
    template.has_resource_properties("AWS::IAM::Policy", {"PolicyDocument": {"Statement": [{
        "Sid": "ReadHfTokenSecret", "Effect": "Allow", "Action": "secretsmanager:GetSecretValue", "Resource": ARN}]}})
    assert grant_hf_token_read(role, JobConfig(), region="us-east-2") == []


@pytest.mark.slow  # synthesizes the CDK app (pyproject.toml `markers`)
def test_ec2_head_and_worker_instance_roles_read_the_same_secret_nag_clean(tmp_path):
    """The EC2 target: `grant_job_access` (shared with the Pod Identity role) grants both instance roles."""
    import json

    from config import load_config
    from stacks import build

    config = load_config(write_variant(tmp_path, {"target": "ec2", "job": {"hf_token_secret": ARN}}))
    app = cdk_app(outdir=str(tmp_path / "cdk.out"))
    build(app, config, nag=True)
    app.synth()
    ec2 = json.loads((tmp_path / "cdk.out" / "ray-efa-ec2.template.json").read_text())
    granted = set()
    for res in ec2["Resources"].values():
        if res["Type"] != "AWS::IAM::Policy":
            continue
        for st in res["Properties"]["PolicyDocument"]["Statement"]:
            if st.get("Sid") == "ReadHfTokenSecret":
                assert st["Action"] == "secretsmanager:GetSecretValue" and st["Resource"] == ARN
                granted.update(r["Ref"] for r in res["Properties"]["Roles"])
    assert all(g.startswith(("HeadRole", "WorkerRole")) for g in granted) and len(granted) == 2
    report = json.loads((tmp_path / "cdk.out" / "validation-report.json").read_text())
    assert "ReadHfTokenSecret" not in json.dumps(report)  # cdk-nag raised nothing about the grant
