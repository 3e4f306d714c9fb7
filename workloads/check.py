"""`python -m workloads.check [FILE]`: `python -m config check`, then the dataset's tokens and epochs.

The config package knows nothing of the workload, so the check that needs the workload's data pipeline
(tokenize and pack a local dataset exactly as the workers will) is composed here, one floor up:
the plan `python -m config check` prints, then the `data:` line (and the overfitting warning) when
`job.dataset` is on this machine. A hub or S3 dataset is not read: the driver prints the line at run time.
"""

from __future__ import annotations

import argparse

from config.__main__ import check
from config.cli import add_file_argument, chosen_file
from workloads.fsdp_finetune.data import dataset_epochs


def main(argv: list[str] | None = None) -> int:
    """Exit 0 with the plan and the data line, or 2 with one line per problem on stderr."""
    parser = argparse.ArgumentParser(prog="python -m workloads.check", description=__doc__.split("\n")[0])
    add_file_argument(parser)
    args = parser.parse_args(argv)
    config = check(chosen_file(parser, args))
    dataset_epochs(config.job, world_size=config.world_size, local_only=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
