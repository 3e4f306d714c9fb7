"""`python -m workloads.check [FILE]`: `python -m config check`, then the dataset's tokens and epochs.

The config package knows nothing of the workload, so the check that needs the workload's data pipeline
(tokenize and pack a local dataset exactly as the workers will) is composed here, one floor up:
the plan `python -m config check` prints, then the `data:` line (and the overfitting warning) when
`job.dataset` is on this machine. A hub or S3 dataset is not read: the driver prints the line at run time.
"""

from __future__ import annotations

import argparse
import os

from config.__main__ import check
from config.cli import add_file_argument, chosen_file


def main(argv: list[str] | None = None) -> int:
    """Exit 0 with the plan and the data line, or 2 with one line per problem on stderr.

    Offline unless `--online`: counting a local dataset's tokens loads the tokenizer of `job.model`, which
    for a Hub id would otherwise retry the Hub for about 50 s without a network. HF_HUB_OFFLINE=1 makes
    huggingface_hub, transformers and datasets use the local cache only (they read it when first imported,
    which is why it is set before the data pipeline is imported)."""
    parser = argparse.ArgumentParser(prog="python -m workloads.check", description=__doc__.split("\n")[0])
    add_file_argument(parser)
    parser.add_argument("--online", action="store_true", help="also check what needs the network (see "
                        "python -m config check --help); the tokenizer may then come from the Hub")
    args = parser.parse_args(argv)
    if not args.online:
        os.environ["HF_HUB_OFFLINE"] = "1"
    config = check(chosen_file(parser, args), online=args.online)

    from workloads.fsdp_finetune.data import dataset_epochs

    dataset_epochs(config.job, world_size=config.world_size, local_only=True)
    return 0


if __name__ == "__main__":
    from config.errors import run_cli

    run_cli(main)
