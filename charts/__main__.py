"""The cdk8s app (`app:` in cdk8s.yaml): `npx cdk8s synth` runs `python -m charts`.

`python -m charts [FILE] [--outdir DIR]` reads the variable file (FILE, else $CLUSTER_CONFIG, else
config/cluster.yaml; `npx cdk8s synth` passes no FILE, so it takes $CLUSTER_CONFIG) through the one loader,
builds and validates every object, and only then writes the manifests to $CDK8S_OUTDIR
(default `dist/`), swapped in by renames once everything is built. A bad variable file, an oversized code bundle
or a schema error exits non-zero with the reason and leaves no partial output behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from config.cli import add_file_argument, chosen_file
from config.errors import FAILED, UserError, run_cli
from config.loader import REPO_ROOT, load_config, resolve_path

if TYPE_CHECKING:
    from config.model import ClusterConfig

# jsii (under cdk8s) starts Node.js on import; `--help` and a bad file must not wait for it or print its banner.
JSII_SUPPORTED_NODE = ("22", "24")


def synthesize(config: ClusterConfig, config_file: Path, outdir: Path, *, repo_root: Path = REPO_ROOT) -> list[Path]:
    """Build, validate, then write every chart to `outdir` at once; return the files written."""
    from charts import validation
    from charts.charts import build_app, inputs, manifests

    chart_inputs = inputs(config, config_file, repo_root=repo_root)
    outdir = Path(outdir).resolve()
    outdir.parent.mkdir(parents=True, exist_ok=True)
    # Staged beside the target so the final step is a rename on one filesystem, never a partial copy.
    staging = Path(tempfile.mkdtemp(prefix=f".{outdir.name}-staging-", dir=outdir.parent))
    try:
        app = build_app(chart_inputs, outdir=str(staging))
        objects = [obj for chart_objects in manifests(app).values() for obj in chart_objects]
        validation.check(objects, config.cluster.kubernetes_version)
        app.synth()
        staging.chmod(0o755)
        _replace(staging, outdir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(outdir.glob("*.k8s.yaml"))


def _replace(new: Path, target: Path) -> None:
    if not target.exists():
        new.rename(target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}-old-", dir=target.parent))
    old.rmdir()
    target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 with manifests written, 2 on a bad variable file, 1 if they cannot be made valid."""
    parser = argparse.ArgumentParser(prog="python -m charts", description=__doc__.split("\n\n")[1])
    add_file_argument(parser)
    parser.add_argument("--outdir", metavar="DIR",
                        help="where to write the manifests (default: $CDK8S_OUTDIR, else dist)")
    args = parser.parse_args(argv)
    config_file = resolve_path(chosen_file(parser, args))
    config = load_config(config_file)
    outdir = Path(args.outdir or os.environ.get("CDK8S_OUTDIR") or "dist")
    _quiet_node_banner()
    from charts.errors import ChartError

    try:
        synthesize(config, config_file, outdir)
    except ChartError as exc:
        raise UserError(f"cannot synthesize the Kubernetes manifests: {exc}", file=str(config_file),
                        exit_code=FAILED) from None
    return 0


def _quiet_node_banner() -> None:
    """One line instead of jsii's 12-line banner (printed as Python bytes) for a Node.js outside 22/24, as
    `make setup` does (Makefile NODE_SUPPORTED)."""
    try:
        major = subprocess.run(["node", "-p", "process.versions.node.split('.')[0]"], capture_output=True,
                               text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return  # jsii says itself that Node.js is missing
    if major not in JSII_SUPPORTED_NODE and "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION" not in os.environ:
        print(f"note: Node.js {major} is not one jsii supports ({' or '.join(JSII_SUPPORTED_NODE)}); "
              "docs/setup.md: Node.js", file=sys.stderr)
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", major)
    os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")
    os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")


if __name__ == "__main__":
    run_cli(main)
