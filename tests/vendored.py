"""Exact copies of the pinned Helm charts (and the node monitoring agent's add-on schema), for the tests that
render them with the real helm: found or fetched by the one pinned-artifact fetcher, tools/pins.py, and always
checked against the SHA-256 pinned in its table.

Each chart is a folder `<chart>-<version>/`, exactly as it is in its upstream repository at the release ref
(provenance in `../shared/charts/README.md` and in tools/pins.py). It is looked for, in this order, in
`$HELM_CHARTS_DIR`, in `../shared/charts` beside the repository (or `$PINS_MIRROR/charts`), in the repository's
caches `.cache/helm-charts/` and `.cache/pins/`; when none holds it, it is downloaded file by file from GitHub at
the pinned commit (tools/pins.py) and cached. Whatever the source, the folder must match its pinned tree digest; a
copy that does not is refused, never passed over for the next source and never skipped.

Adding a chart: one row in the table of tools/pins.py (with the digest `python -m tests.vendored --digest
<folder>` prints) and its files' lines in tools/pins-charts.sha256sums.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from charts.errors import ChartError
from config.errors import run_cli
from config.loader import REPO_ROOT
from tools import pins

# <chart>-<version> folder -> SHA-256 of its listing (tree_digest), from the one table in tools/pins.py.
CHARTS = {p.name: p.sha256 for p in pins.of_kind("chart")}
# Single files beside the charts -> their SHA-256.
FILES = {p.name: p.sha256 for p in pins.of_kind("file") if p.mirror.startswith("charts/")}
DIR_ENV = "HELM_CHARTS_DIR"
tree_digest = pins.tree_digest


class ChartsUnavailable(ChartError):
    """No source holds a pinned chart (or file) and it could not be downloaded; the message says how to get it."""


def shared_dir(repo_root: Path = REPO_ROOT) -> Path:
    """`../shared/charts` beside the repository."""
    return repo_root.parent / "shared" / "charts"


def cache_dir(repo_root: Path = REPO_ROOT) -> Path:
    """The repository's older cache folder for chart copies (still read)."""
    return repo_root / ".cache" / "helm-charts"


def search_dirs(repo_root: Path = REPO_ROOT, environ: Mapping[str, str] = os.environ) -> list[Path]:
    """The folders looked in before tools/pins.py's mirror, cache and download, first match wins."""
    dirs = [Path(environ[DIR_ENV])] if environ.get(DIR_ENV) else []
    return dirs + [shared_dir(repo_root), cache_dir(repo_root)]


def _resolve(name: str, table: Mapping[str, str], repo_root: Path, environ: Mapping[str, str]) -> Path:
    if name not in table:
        raise ChartError(f"{name}: not a pinned {'chart' if table is CHARTS else 'file'} (pinned: "
                         f"{', '.join(table)}); add it to the table in tools/pins.py")
    try:
        return pins.fetch(name, dirs=search_dirs(repo_root, environ), repo_root=repo_root, environ=environ)[0]
    except pins.PinUnavailable as exc:
        raise ChartsUnavailable(
            f"{exc}. Or provide it one of three other ways: check out ../shared beside the repository; set "
            f"{DIR_ENV} to a folder holding {name}; or extract it into {cache_dir(repo_root)}") from None
    except pins.PinError as exc:
        raise ChartError(str(exc)) from None


def chart_dir(name: str, *, repo_root: Path = REPO_ROOT, environ: Mapping[str, str] = os.environ) -> Path:
    """The verified folder of pinned chart `name` (`<chart>-<version>`)."""
    return _resolve(name, CHARTS, repo_root, environ)


def file_path(name: str, *, repo_root: Path = REPO_ROOT, environ: Mapping[str, str] = os.environ) -> Path:
    """The verified path of pinned file `name` (a configuration schema)."""
    return _resolve(name, FILES, repo_root, environ)


def main(argv: list[str] | None = None) -> int:
    """`--digest FOLDER`: print a chart folder's tree digest (for a new CHARTS line). Otherwise verify every
    pinned chart and file; exit 2 with the reason on the first that is missing or differs."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.vendored", description=main.__doc__.split(".")[0])
    parser.add_argument("--digest", metavar="FOLDER", type=Path, help="print FOLDER's tree digest and exit")
    args = parser.parse_args(argv)
    if args.digest:
        print(tree_digest(args.digest))
        return 0
    for name in CHARTS:
        chart_dir(name)
    for name in FILES:
        file_path(name)
    return 0


if __name__ == "__main__":
    run_cli(main)
