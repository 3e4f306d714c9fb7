"""In-process synthesis of the CDK app for the stack tests, once per variable-file variant per session.

Each variant is synthesized with cdk.json's context (its feature flags) and cdk-nag's AwsSolutions plugin
on, exactly as `cdk synth -c nag=true` would; templates are read from the output directory, so a nag
violation (which aborts synthesis after the templates are written) does not hide them from the other tests.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from config import ClusterConfig, load_config
from tests.helpers import EXAMPLES, cdk_app, write_variant

if TYPE_CHECKING:
    from stacks import ProjectStacks

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

_ROOT = Path(tempfile.mkdtemp(prefix="stack-synth-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)

ADMIN_ROLE = "arn:aws:iam::123456789012:role/Admin"

PUBLIC_CIDRS = ["203.0.113.0/24", "198.51.100.7/32"]
ALT_KMS_KEY = "arn:aws:kms:us-east-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"

# A variant that flips every switch the default leaves off: a narrowed endpoint, admin access entry,
# CloudWatch add-on, spot capacity scaling 0..4, two worker groups, two NAT gateways over three AZs,
# a bucket destroyed with the stack, a model and dataset read from S3, a Hugging Face token secret by
# name under a customer managed key, and the Cluster Autoscaler off (fixed groups).
ALT = {
    "autoscaling": {"enabled": False},
    "network": {"nat_gateways": 2, "max_azs": 3},
    "cluster": {
        "endpoint_access": "public_and_private",
        "public_access_cidrs": PUBLIC_CIDRS,
        "admin_role_arn": ADMIN_ROLE,
        "cloudwatch_observability": True,
        "worker_groups": [
            {"name": "gpu", "instance_type": "g6.12xlarge", "nodes": 2, "min_nodes": 0, "max_nodes": 4,
             "gpus_per_pod": 4, "capacity": "spot"},
            {"name": "gpu-b", "instance_type": "g6.12xlarge", "nodes": 1, "gpus_per_pod": 4},
        ],
    },
    "storage": {"removal_policy": "destroy"},
    "job": {"global_batch_size": 48, "model": "s3://my-models/qwen/Qwen2.5-1.5B",
            "dataset": "s3://my-data/alpaca/train.jsonl",
            "hf_token_secret": "ml/hf-token", "hf_token_kms_key_arn": ALT_KMS_KEY},
}

VARIANTS = ("default", "p5", "socket", "alt")


@dataclass(frozen=True, kw_only=True)
class Synth:
    """One synthesized variant: its config, stacks (the construct tree), output directory, templates by
    stack role, nag report."""

    config: ClusterConfig
    stacks: ProjectStacks
    outdir: Path
    templates: dict[str, dict]
    template_files: list[Path]
    nag_error: str | None
    nag_violations: list[dict]


def variant_file(name: str) -> Path:
    """The variable file for a variant."""
    if name == "default":
        return write_variant(_ROOT, name="default.yaml")
    if name == "alt":
        return write_variant(_ROOT, ALT, name="alt.yaml")
    if name == "default-socket":
        # The default file with socket transport: its worker nodes lose the EFA label, EFA devices and huge pages.
        return write_variant(_ROOT, {"nccl": {"transport": "socket"}}, name="default-socket.yaml")
    if name == "socket":
        # The socket example with a private-only API endpoint, redeployed over a bucket an earlier teardown kept.
        return write_variant(_ROOT, {"cluster": {"endpoint_access": "private"}, "storage": {"existing_bucket": True}},
                             base=EXAMPLES / "socket.yaml", name="socket.yaml")
    return EXAMPLES / f"{name}.yaml"


@cache
def synth(name: str) -> Synth:
    """Synthesize variant `name` (cached for the session)."""
    from stacks import build, stack_names

    config = load_config(variant_file(name))
    outdir = _ROOT / name
    app = cdk_app(outdir=str(outdir), context={"@aws-cdk/core:validationReportJson": True})
    stacks = build(app, config, nag=True)
    nag_error = None
    try:
        app.synth()
    except Exception as exc:  # noqa: BLE001 - jsii raises a generic error for a failed validation
        nag_error = str(exc)
    report = outdir / "policy-validation-report.json"
    violations = []
    if report.exists():
        for plugin in json.loads(report.read_text())["pluginReports"]:
            violations += [{"rule": v["ruleName"], "resource": r["constructPath"]}
                           for v in plugin["violations"] for r in v["violatingResources"]]
    files = {role: outdir / f"{stack}.template.json" for role, stack in stack_names(config).items()}
    return Synth(config=config, stacks=stacks, outdir=outdir,
                 templates={r: json.loads(f.read_text()) for r, f in files.items()},
                 template_files=list(files.values()), nag_error=nag_error, nag_violations=violations)
