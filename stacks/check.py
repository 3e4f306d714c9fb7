"""`python -m stacks.check [FILE] --against OLD`: the config check, then what deploying FILE would replace.

Replace, delete, release (kept, DeletionPolicy Retain) or roll the nodes of, compared with OLD.

The config package knows nothing of the stacks, so the comparison, which synthesizes them, is composed here,
one floor up (as `python -m workloads.check` adds the dataset line). OLD is the variable file that was deployed,
or a cdk.out directory of the templates that were (docs/lifecycle.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from config import ClusterConfig, load_or_exit
from config.__main__ import check
from config.cli import add_file_argument, chosen_file


def against(config: ClusterConfig, old: str) -> str:
    """What deploying `config` over `old` (a variable file or a cdk.out directory) replaces, deletes or rolls."""
    from stacks.replacements import compare, key_changes  # starts jsii: not for --help or a bad file

    path = Path(old)
    previous = path if path.is_dir() else load_or_exit(path)
    found = compare(previous, config)
    if not found:
        return f"against {old}: replaces nothing (no create-only property changes, no resource leaves)"
    lines = [f"against {old}:", *(f"  {c.line()}" for c in found)]
    if key_changes(found):
        lines.append("warning: this edit REPLACES OR DELETES the cluster, a node group or the bucket: "
                     + ", ".join(f"{c.stack}/{c.logical_id}" for c in key_changes(found)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Exit 0 with the plan and the comparison (the file is valid), or 2 with one line per problem on stderr."""
    parser = argparse.ArgumentParser(prog="python -m stacks.check", description=__doc__.split("\n")[0])
    add_file_argument(parser)
    parser.add_argument("--against", metavar="OLD", required=True,
                        help="the deployed setup: its variable file, or a cdk.out directory of its templates")
    args = parser.parse_args(argv)
    config = check(chosen_file(parser, args))
    print(against(config, args.against))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
