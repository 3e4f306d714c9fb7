"""tests/vendored.py: pinned chart copies are found, verified, refused when altered, and a missing one says
how to get it."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from charts.errors import ChartError
from tests.vendored import CHARTS, DIR_ENV, FILES, ChartsUnavailable, chart_dir, file_path, shared_dir
from tools.pins import GITHUB_RAW_ENV, MIRROR_ENV

SMALL = "aws-efa-k8s-device-plugin-v0.5.30"


@pytest.fixture
def shared():
    if not (shared_dir() / SMALL).is_dir():
        pytest.skip(f"needs ../shared/charts ({shared_dir()})")
    return shared_dir()


def test_pins_match_the_shared_sha256sums(shared):
    """Each CHARTS digest is the SHA-256 of that folder's lines of SHA256SUMS, as the module docstring says."""
    lines = (shared / "SHA256SUMS").read_text().splitlines()
    for name, digest in CHARTS.items():
        listing = sorted((line.split("  ", 1)[1].removeprefix(f"{name}/"), line.split("  ", 1)[0])
                         for line in lines if line.split("  ", 1)[1].startswith(f"{name}/"))
        text = "".join(f"{h}  {p}\n" for p, h in sorted(listing, key=lambda x: x[0].encode()))
        assert hashlib.sha256(text.encode()).hexdigest() == digest, name
    for name, digest in FILES.items():
        assert f"{digest}  {name}" in lines


def test_a_copy_in_the_env_folder_is_used_first(shared, tmp_path):
    shutil.copytree(shared / SMALL, tmp_path / SMALL)
    assert chart_dir(SMALL, environ={DIR_ENV: str(tmp_path)}) == tmp_path / SMALL


def test_an_altered_copy_is_refused_not_passed_over(shared, tmp_path):
    shutil.copytree(shared / SMALL, tmp_path / SMALL)
    (tmp_path / SMALL / "values.yaml").write_text("tolerations: []\n")
    with pytest.raises(ChartError, match=rf"{SMALL}: not the pinned {SMALL}: tree sha256 expected"):
        chart_dir(SMALL, environ={DIR_ENV: str(tmp_path)})


# A user's clone: no ../shared beside it, and GitHub's raw host replaced by a closed loopback port.
OFFLINE = {MIRROR_ENV: "/nonexistent", GITHUB_RAW_ENV: "http://127.0.0.1:9"}


def test_a_missing_chart_says_how_to_get_it(tmp_path):
    with pytest.raises(ChartsUnavailable, match=rf"{SMALL} not found .*set {DIR_ENV} to a folder holding {SMALL}"):
        chart_dir(SMALL, repo_root=tmp_path / "repo", environ=OFFLINE)


def test_a_missing_schema_says_how_to_get_it(tmp_path):
    (name,) = FILES
    with pytest.raises(ChartsUnavailable, match="download from http://127.0.0.1:9/.*check out ../shared beside"):
        file_path(name, repo_root=tmp_path / "repo", environ=OFFLINE)


def test_an_unpinned_chart_is_refused_with_the_fix():
    with pytest.raises(ChartError, match="add it to the table in tools/pins.py"):
        chart_dir("some-chart-1.0.0")
