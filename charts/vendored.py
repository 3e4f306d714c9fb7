"""Exact copies of the pinned Helm charts (and the node monitoring agent's add-on schema), for the tests that
render them with the real helm: found where they are, and always checked against a pinned SHA-256.

Each chart is a folder `<chart>-<version>/`, exactly as it is in its upstream repository at the release ref
(provenance in `../shared/charts/README.md`). It is looked for, in this order, in `$HELM_CHARTS_DIR`, in
`../shared/charts` beside the repository, and in the repository's cache `.cache/helm-charts/` (gitignored); a
folder that does not hold it is passed over. Whatever the source, the folder must match the digest pinned below
(the SHA-256 of its `sha256sum`-style listing, see `tree_digest`); a copy that does not is refused, never
passed over for the next source (a chart that differs from the pinned release is a mistake to fix).

Nothing is downloaded: Helm repositories publish packaged `.tgz` files, not these folders, and two of the charts
(kube-prometheus-stack's dependencies) are not published as one package. Where no source holds a chart,
`ChartsUnavailable` says how to get it, and the tests that need it skip with that message. CI has `../shared`.

Adding a chart: put its folder in `../shared/charts` (with a README row and SHA256SUMS lines), then add one line
to `CHARTS` with the digest `python -m charts.vendored --digest <folder>` prints.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from charts.errors import ChartError
from config.loader import REPO_ROOT

# <chart>-<version> folder -> SHA-256 of its listing (tree_digest). Each matches ../shared/charts/SHA256SUMS.
CHARTS = {
    "nvidia-device-plugin-0.20.0": "8e3fe101c6f2d4997c6890c52c8b5ef468c0e951cc07c586128a694e63f7c48b",
    "aws-efa-k8s-device-plugin-v0.5.30": "9c15ef42fff8de670189712c3e7dbee6b03694037dab4a205bce82e511923e9d",
    "kuberay-operator-1.7.0": "86d320521e7e86ece315063fbfdaf9f46d25b87ef66f0410f5cafffe68acc28a",
    "cluster-autoscaler-9.53.0": "ac1cac6c132eccbfc480c8fdc3cb02f91868649005dad2a20be278f7a95e8194",
    "eks-node-monitoring-agent-1.7.0": "c06f3239039b2676e3a552d12b29ceb2fd1f9479db004b5f7f5b640d9384da33",
    "kube-prometheus-stack-88.5.3": "766e148d44899b2310ef6c3f6b134ef72e2827d3717c0822ce57d91aee8a19dd",
    "dcgm-exporter-4.8.2": "6ef7bc1b0aee250359246b9646bec686ca41c03ba5dbdd3704ed0ced103c0608",
}
# Single files beside the charts -> their SHA-256.
FILES = {
    # aws/eks-node-monitoring-agent charts/configuration.schema.json at tag v1.7.0: what the EKS add-on accepts.
    "eks-node-monitoring-agent-1.7.0.configuration.schema.json":
        "cf9829b3a720bc0b0a8b5b806af5fed258b6fae12bc313f6dddbc4a49725c35a",
}
DIR_ENV = "HELM_CHARTS_DIR"


class ChartsUnavailable(ChartError):
    """No source holds a pinned chart (or file); the message says how to provide it."""


def shared_dir(repo_root: Path = REPO_ROOT) -> Path:
    """`../shared/charts` beside the repository."""
    return repo_root.parent / "shared" / "charts"


def cache_dir(repo_root: Path = REPO_ROOT) -> Path:
    """The repository's cache folder for chart copies."""
    return repo_root / ".cache" / "helm-charts"


def search_dirs(repo_root: Path = REPO_ROOT, environ: Mapping[str, str] = os.environ) -> list[Path]:
    """The folders looked in, first match wins."""
    dirs = [Path(environ[DIR_ENV])] if environ.get(DIR_ENV) else []
    return dirs + [shared_dir(repo_root), cache_dir(repo_root)]


def tree_digest(folder: Path) -> str:
    """SHA-256 of the folder's `sha256sum` listing: one `<sha256>  <path>` line per file, paths relative to the
    folder and sorted bytewise (what `grep '  <folder>/' SHA256SUMS | sed 's#  <folder>/#  #' | LC_ALL=C sort -k2
    | sha256sum` gives from ../shared/charts/SHA256SUMS)."""
    lines = sorted((path.relative_to(folder).as_posix(), hashlib.sha256(path.read_bytes()).hexdigest())
                   for path in folder.rglob("*") if path.is_file())
    listing = "".join(f"{digest}  {name}\n" for name, digest in sorted(lines, key=lambda x: x[0].encode()))
    return hashlib.sha256(listing.encode()).hexdigest()


def _how_to_get(name: str, repo_root: Path, environ: Mapping[str, str]) -> str:
    looked = ", ".join(str(d) for d in search_dirs(repo_root, environ))
    return (f"{name} not found (looked in {looked}). It is the upstream chart folder at its release ref, listed "
            f"with provenance and extraction commands in the shared charts README (shared/charts/README.md of "
            f"the steering checkout, which CI has beside the repository as ../shared). Provide it one of three "
            f"ways: check out ../shared beside the repository; set {DIR_ENV} to a folder holding {name}; or "
            f"extract it into {cache_dir(repo_root)}")


def chart_dir(name: str, *, repo_root: Path = REPO_ROOT, environ: Mapping[str, str] = os.environ) -> Path:
    """The verified folder of pinned chart `name` (`<chart>-<version>`)."""
    if name not in CHARTS:
        raise ChartError(f"{name}: not a pinned chart (pinned: {', '.join(CHARTS)}); add it to CHARTS in "
                         "charts/vendored.py")
    for folder in search_dirs(repo_root, environ):
        path = folder / name
        if path.is_dir():
            actual = tree_digest(path)
            if actual != CHARTS[name]:
                raise ChartError(f"{path}: not the pinned {name}: tree sha256 expected {CHARTS[name]}, got {actual}; "
                                 "replace it with an exact copy of the upstream folder at the pinned ref")
            return path
    raise ChartsUnavailable(_how_to_get(name, repo_root, environ))


def file_path(name: str, *, repo_root: Path = REPO_ROOT, environ: Mapping[str, str] = os.environ) -> Path:
    """The verified path of pinned file `name` (a configuration schema)."""
    if name not in FILES:
        raise ChartError(f"{name}: not a pinned file (pinned: {', '.join(FILES)})")
    for folder in search_dirs(repo_root, environ):
        path = folder / name
        if path.is_file():
            actual = hashlib.sha256(path.read_bytes()).hexdigest()
            if actual != FILES[name]:
                raise ChartError(f"{path}: not the pinned {name}: sha256 expected {FILES[name]}, got {actual}")
            return path
    raise ChartsUnavailable(_how_to_get(name, repo_root, environ))


def main(argv: list[str] | None = None) -> int:
    """`--digest FOLDER`: print a chart folder's tree digest (for a new CHARTS line). Otherwise verify every
    pinned chart and file; exit 2 with the reason on the first that is missing or differs."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m charts.vendored", description=main.__doc__.split(".")[0])
    parser.add_argument("--digest", metavar="FOLDER", type=Path, help="print FOLDER's tree digest and exit")
    args = parser.parse_args(argv)
    if args.digest:
        print(tree_digest(args.digest))
        return 0
    try:
        for name in CHARTS:
            chart_dir(name)
        for name in FILES:
            file_path(name)
    except ChartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
