"""`python -m ops.check [FILE] --against OLD`: the config check, then what deploying FILE would replace.

Replace, delete, release (kept, DeletionPolicy Retain) or roll the nodes of, compared with OLD.

The config package knows nothing of the stacks, so the comparison, which synthesizes them, is composed here,
one floor up (as `python -m workloads.check` adds the dataset line). OLD is the variable file that was deployed,
or a cdk.out directory of the templates that were (docs/lifecycle.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from config import ClusterConfig, load_config
from config.__main__ import check
from config.cli import add_file_argument, chosen_file
from config.errors import run_cli

# What each node group class (ops/lifecycle.py) does to a job running on the group.
NODEGROUP_EFFECT = {
    "rolled": "EKS replaces every node of the group, one at a time (UpdateStrategy MINIMAL): a running job ends "
              "(its Ray workers go with their nodes); deploy between jobs",
    "replaced": "a new node group is created and the old one deleted with its nodes: a running job ends",
    "deleted": "the group and its nodes are deleted: a running job ends",
    "scaled": "only MinSize/MaxSize change; the Cluster Autoscaler's current size stays (no DesiredSize in the "
              "template), running nodes stay",
    "updated": "an in-place change (labels, taints or tags); no node is replaced",
}


def describe(step) -> list[str]:
    """One line per node group that is not unchanged, with what it does to a running job."""
    return [f"node group {stack}/{logical}: {cls}: {NODEGROUP_EFFECT[cls]}"
            for (stack, logical), cls in sorted(step.nodegroups.items()) if cls in NODEGROUP_EFFECT]


def against(config: ClusterConfig, old: str) -> str:
    """What deploying `config` over `old` (a variable file or a cdk.out directory) replaces, deletes or rolls."""
    from ops.replacements import compare, key_changes  # starts jsii: not for --help or a bad file

    path = Path(old)
    previous = path if path.is_dir() else load_config(path)
    found, step = compare(previous, config, with_step=True)
    groups = [f"  {line}" for line in describe(step)]
    if not found:
        return "\n".join([f"against {old}: replaces nothing (no create-only property changes, no resource leaves)",
                          *groups])
    lines = [f"against {old}:", *(f"  {c.line()}" for c in found), *groups]
    if key_changes(found):
        lines.append("warning: this edit REPLACES OR DELETES the cluster, a node group or the bucket: "
                     + ", ".join(f"{c.stack}/{c.logical_id}" for c in key_changes(found)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Exit 0 with the plan and the comparison (the file is valid), or 2 with one line per problem on stderr."""
    parser = argparse.ArgumentParser(prog="python -m ops.check", description=__doc__.split("\n")[0])
    add_file_argument(parser)
    parser.add_argument("--against", metavar="OLD", required=True,
                        help="the deployed setup: its variable file, or a cdk.out directory of its templates")
    args = parser.parse_args(argv)
    config = check(chosen_file(parser, args))
    print(against(config, args.against))
    return 0


if __name__ == "__main__":
    run_cli(main)
