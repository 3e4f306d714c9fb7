"""`main()`: validate the job, build Ray Train's configs from the variable file, run `fit()`.

    python -m workloads.fsdp_finetune [FILE] [--storage-path URI] [--max-steps N]
    python -m workloads.fsdp_finetune --local --output-dir DIR [--max-steps N]

On the cluster the job comes from the variable file and checkpoints go to the stacks' S3 bucket.
`--local` keeps the file's validation but swaps in the embedded tiny job (`local_job`): a random
Qwen2-architecture model, a generated arithmetic dataset, two CPU workers on gloo, all on this
machine. Every bad setting is reported before a worker starts, as `SOURCE: job.<field>: message`,
exit status 2; so is a rerun under a run name whose latest checkpoint is past `max_steps` (it would
train nothing and export the longer run's model).

`RAY_TRAIN_HEALTH_CHECK_INTERVAL_S` (Ray Train's default 2 s) is how often the train controller
polls the workers; reports, the end of training and worker failures are seen only on a poll. The
cluster's runtime env sets it (charts); a local run defaults it to 0.5 s (`workloads.local_ray`).

This module only parses the command line and composes the pipeline (`workloads.fsdp_finetune`'s docstring has
the order): `settings` refuses, `run_plan` places, `trainer` fits, `local_demo` or `cluster_job` drives.
"""

from __future__ import annotations

import argparse

from config import load_or_exit, resolve_path
from config.cli import add_file_argument, chosen_file
from workloads.fsdp_finetune.cluster_job import main_cluster
from workloads.fsdp_finetune.local_demo import main_local
from workloads.fsdp_finetune.settings import SettingProblem, refuse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m workloads.fsdp_finetune", description=__doc__.split("\n")[0])
    add_file_argument(parser)
    parser.add_argument("--local", action="store_true", help="run the embedded tiny job on this machine's CPUs")
    parser.add_argument("--output-dir", default="out/local", help="local mode: metrics, plot, checkpoints, model")
    parser.add_argument("--max-steps", type=int, default=None, help="override job.max_steps")
    parser.add_argument("--storage-path", default=None,
                        help="Ray storage URI (default: s3://<bucket>/<storage.prefix>/checkpoints on the "
                             "cluster, DIR locally)")
    parser.add_argument("--verbose", action="store_true",
                        help="local mode: print Ray's and the workers' output too (always in DIR/ray.log)")
    args = parser.parse_args(argv)
    args.config = chosen_file(parser, args)
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point: validate, plan, (preflight,) fit, and for local runs evaluate before and after."""
    args = parse_args(argv)
    file = resolve_path(args.config)
    config = load_or_exit(file)
    if args.max_steps is not None and args.max_steps < 1:
        refuse([SettingProblem("--max-steps", "max_steps", f"must be positive, got {args.max_steps}")])
    if args.local:
        return main_local(args, config)
    return main_cluster(args, config, str(file))
