"""cfn-lint and cdk-nag over every synthesized template of every variant."""

from __future__ import annotations

import json

import pytest
from cfnlint.api import ManualArgs, lint_file

from tests.stack_synth import VARIANTS, synth

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)

# Warnings accepted, each for a reason; anything else (and any error) fails.
ACCEPTED_WARNINGS = {
    # CDK's kubectl-provider constructs, and the provider of the VPC default-security-group restriction
    # (@aws-cdk/aws-ec2:restrictDefaultSecurityGroup), add a DependsOn on a role they also GetAtt; harmless
    # redundancy in code this project does not own.
    "W3005": "redundant DependsOn emitted by CDK's kubectl provider and default-security-group provider",
    # The AZs are named on purpose: the GPU nodes' placement group needs the one AZ the file names.
    "W3010": "availability zones come from the variable file by design",
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_cfn_lint_clean(variant):
    result = synth(variant)
    findings = []
    for path in result.template_files:
        findings += [(path.name, m.rule.id, m.message) for m in
                     lint_file(path, config=ManualArgs(regions=[result.config.region]))]
    errors = [f for f in findings if f[1].startswith("E")]
    unexpected = [f for f in findings if not f[1].startswith("E") and f[1] not in ACCEPTED_WARNINGS
                  and not f[1].startswith("I")]
    assert not errors, errors
    assert not unexpected, unexpected


@pytest.mark.parametrize("variant", VARIANTS)
def test_cdk_nag_aws_solutions_clean(variant):
    result = synth(variant)
    assert not result.nag_violations, "\n".join(f"{v['rule']} at {v['resource']}" for v in result.nag_violations)
    assert result.nag_error is None, result.nag_error


@pytest.mark.parametrize("variant", ["alt", "default"])  # alt: every optional add-on; default: the autoscaler
def test_every_acknowledgment_has_a_reason_and_a_resource_scope(variant):
    """cdk-nag acknowledgments (construct metadata): none on a whole stack, none without a reason."""
    acknowledged = []
    for meta in synth(variant).outdir.glob("*.metadata.json"):
        for path, entries in json.loads(meta.read_text()).items():
            for entry in entries:
                if entry["type"] == "aws:cdk:acknowledged-rules":
                    acknowledged += [(path, rule, reason) for rule, reason in entry["data"].items()
                                     if rule.startswith("AwsSolutions::")]
    assert len(acknowledged) >= 10
    for path, rule, reason in acknowledged:
        assert path.count("/") >= 2, f"{rule} acknowledged on a whole stack: {path}"
        assert len(reason) > 40, f"{rule} at {path} needs a real reason"
