"""The cdk8s app (`app:` in cdk8s.yaml): `npx cdk8s synth` runs `python -m charts`.

Reads the variable file ($CLUSTER_CONFIG, else config/cluster.yaml) through the one loader,
builds and validates every object, and only then writes the manifests to $CDK8S_OUTDIR
(default `dist/`), swapped in by renames once everything is built. A bad variable file, an oversized code bundle
or a schema error exits non-zero with the reason and leaves no partial output behind.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from charts import validation
from charts.charts import build_app, inputs, manifests
from charts.errors import ChartError
from config.loader import REPO_ROOT, load_or_exit, resolve_path
from config.model import ClusterConfig


def synthesize(config: ClusterConfig, config_file: Path, outdir: Path, *, repo_root: Path = REPO_ROOT) -> list[Path]:
    """Build, validate, then write every chart to `outdir` at once; return the files written."""
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


def main() -> int:
    """Entry point: 0 with manifests written, 2 on a bad variable file, 1 if they cannot be made valid."""
    config_file = resolve_path()
    config = load_or_exit(config_file)
    outdir = Path(os.environ.get("CDK8S_OUTDIR") or "dist")
    try:
        synthesize(config, config_file, outdir)
    except ChartError as exc:
        print(f"{config_file}: cannot synthesize the Kubernetes manifests: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
