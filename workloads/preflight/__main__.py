"""`python -m workloads.preflight`: run the preflight as its own job and exit non-zero on failure."""

from __future__ import annotations

import argparse
import os

from config.cli import add_file_argument, chosen_file
from config.errors import run_cli


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the preflight, print the table (or JSON); 0 when every check passed."""
    parser = argparse.ArgumentParser(prog="python -m workloads.preflight", description=__doc__)
    add_file_argument(parser)
    parser.add_argument("--local", action="store_true", help="local Ray cluster, 2 CPU workers over gloo")
    parser.add_argument("--expect-transport", choices=("efa", "socket"),
                        help="transport to require (default: nccl.transport on a cluster, none locally)")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    parser.add_argument("--max-size", type=int, help="largest message size, bytes (default 1 GiB; 16 MiB locally)")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations per size (default 5)")
    args = parser.parse_args(argv)

    from config import load_or_exit

    chosen = chosen_file(parser, args)
    config = load_or_exit(chosen)
    if not args.local:
        # The Hub token and access before any GPU work (a local run uses its embedded model).
        from config.loader import resolve_path
        from workloads.fsdp_finetune.settings import refuse, token_problems

        refuse(token_problems(config.job, source=str(resolve_path(chosen)), region=config.region))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from workloads.preflight.runner import run_preflight

    report = run_preflight(config, local=args.local, expect_transport=args.expect_transport,
                           max_size=args.max_size, iters=args.iters)
    print(report.to_json() if args.json else report.render(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    run_cli(main)
