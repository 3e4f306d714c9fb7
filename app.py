"""CDK entry point (`npx cdk synth`, see cdk.json): the variable file in, three stacks out (network, storage,
and the EKS cluster or, with `target: ec2`, the EC2 launcher stack).

The file is `-c config=FILE`, else $CLUSTER_CONFIG, else config/cluster.yaml. A bad file prints
one `FILE: field: problem` line each and exits 2 before anything is written. `-c nag=true` adds
cdk-nag's AwsSolutions checks. Every template's Metadata names the file and its SHA-256.
`-c target=eks|ec2` overrides the file's `target` (the file is validated again for it), so `make demo`
synthesizes both targets from the default file.
"""

from __future__ import annotations

import aws_cdk as cdk

from config import load_config, resolve_path
from config.cli import provenance
from config.errors import UserError, run_cli
from config.target import with_target
from stacks import build

CONFIG_METADATA = "RayEfaConfig"


def main() -> None:
    """Synthesize the stacks into cdk.out."""
    app = cdk.App()
    path = app.node.try_get_context("config")
    config = load_config(path)
    target = app.node.try_get_context("target")
    if target:
        try:
            config = with_target(config, str(target))
        except ValueError as exc:
            raise UserError.of(f"{resolve_path(path)}: {line}" for line in str(exc).splitlines()) from None
    build(app, config, nag=str(app.node.try_get_context("nag")).lower() == "true")
    record_source(app, path)
    app.synth()


def record_source(app: cdk.App, path: str | None) -> None:
    """Name the variable file and its SHA-256 in every stack's template Metadata (no resource changes)."""
    source = provenance(path)
    for stack in (child for child in app.node.children if isinstance(child, cdk.Stack)):
        stack.template_options.metadata = {**(stack.template_options.metadata or {}), CONFIG_METADATA: source}


if __name__ == "__main__":
    run_cli(main)
