"""The one way every command names the variable file: a positional `FILE`, else $CLUSTER_CONFIG, else
config/cluster.yaml (`resolve_path`). `--config FILE` is still read, hidden, for scripts written before."""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

from config.loader import DEFAULT_FILE, ENV_VAR, resolve_path

FILE_HELP = f"variable file (default: ${ENV_VAR}, else config/cluster.yaml)"


def add_file_argument(parser: argparse.ArgumentParser) -> None:
    """Add the positional FILE (and the hidden legacy `--config`) to `parser`."""
    parser.add_argument("file", nargs="?", metavar="FILE", help=FILE_HELP)
    parser.add_argument("--config", dest="legacy_config", metavar="FILE", help=argparse.SUPPRESS)


def chosen_file(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The file named on the command line (positional or legacy `--config`), or None for the fallbacks."""
    if args.file and args.legacy_config and Path(args.file) != Path(args.legacy_config):
        parser.error(f"two variable files given ({args.file} and --config {args.legacy_config}); name one")
    return args.file or args.legacy_config


def provenance(path: str | os.PathLike | None = None) -> dict[str, str]:
    """Which variable file an output came from: its path (relative to the working directory when inside it)
    and the SHA-256 of its bytes, recorded in dist/ and cdk.out/."""
    file = resolve_path(path)
    try:
        shown = str(file.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        shown = str(file.resolve())
    return {"file": shown, "sha256": hashlib.sha256(file.read_bytes()).hexdigest()}


__all__ = ["DEFAULT_FILE", "FILE_HELP", "add_file_argument", "chosen_file", "provenance"]
