"""tools/pins.py, the one table of pinned upstream artifacts and their fetcher: the table agrees with the mirror
and with every other place that names a version; a copy is taken from the mirror, else downloaded from a (loopback)
raw-content host and verified; a mismatch, local or downloaded, is an error and nothing is cached."""

from __future__ import annotations

import http.server
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from config.versions import CLUSTER_AUTOSCALER_CHARTS
from harness.loopback import ThreadedHTTPServer
from tests.helpers import REPO
from tools import pins

SMALL = "aws-efa-k8s-device-plugin-v0.5.30"
SHARED = pins.mirror_root()


def needs_mirror(path: str) -> Path:
    if not (SHARED / path).exists():
        pytest.skip(f"needs the mirror ../shared ({SHARED / path})")
    return SHARED / path


def test_each_chart_listing_gives_its_pinned_tree_digest():
    for p in pins.of_kind("chart"):
        files = pins.chart_files(p.name)
        assert files and pins.listing_digest(files) == p.sha256, p.name


def test_the_chart_listing_is_the_mirrors_sha256sums():
    shared = needs_mirror("charts/SHA256SUMS").read_text().splitlines()
    assert pins.CHART_LISTING.read_text().splitlines() == [line for line in shared if not line.endswith("  README.md")]


def test_binary_pins_match_the_mirrors_sha256sums():
    sums = {}
    for folder in ("k8s/bin", "k8s-node/bin"):
        for line in needs_mirror(f"{folder}/SHA256SUMS").read_text().splitlines():
            digest, _, name = line.partition("  ")
            sums[f"{folder}/{name}"] = digest
    binaries = pins.of_kind("binary")
    assert {p.mirror for p in binaries} == {name for name in sums if name.endswith(".xz")}
    for p in binaries:
        assert sums[p.mirror] == p.sha256, p.name
        assert sums.get(p.mirror.removesuffix(".xz"), "") == p.unpacked_sha256, p.name


def test_every_other_version_pin_agrees_with_the_table():
    """config cannot import the stacks, so its own pins are checked here rather than derived."""
    from config.ray_fields import RayConfig
    from stacks import versions

    assert pins.chart_version("cluster-autoscaler") == CLUSTER_AUTOSCALER_CHARTS["1.34"][0]
    assert pins.chart_version("kuberay-operator") == RayConfig.model_fields["kuberay_version"].default
    assert versions.NVIDIA_DEVICE_PLUGIN.version == pins.chart_version("nvidia-device-plugin")
    assert versions.NODE_MONITORING_AGENT_CHART == pins.chart_version("eks-node-monitoring-agent")


class RawHost:
    """A GitHub raw-content host on 127.0.0.1 serving `<repo>/<commit>/<path>` from a folder; counts the GETs."""

    def __init__(self, root: Path):
        self.requests: list[str] = []
        host = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self):
                host.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.httpd = ThreadedHTTPServer(Handler)
        self.url = f"http://127.0.0.1:{self.httpd.port}"


@pytest.fixture
def raw_host(tmp_path, monkeypatch):
    """SMALL's files laid out as raw.githubusercontent.com serves them at the pinned commit."""
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    source = pins.fetch(SMALL)[0]
    root = tmp_path / "www"
    for relpath in pins.chart_files(SMALL):
        target = root / pins.chart_file_url(SMALL, relpath, base="").lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source / relpath, target)
    host = RawHost(root)
    yield host, root
    host.httpd.close()


def clone_env(tmp_path: Path, host: RawHost) -> dict:
    """A user's clone: an empty mirror, and the raw host on loopback."""
    (tmp_path / "empty").mkdir(exist_ok=True)
    return {"repo_root": tmp_path / "repo", "environ": {pins.MIRROR_ENV: str(tmp_path / "empty"),
                                                         pins.GITHUB_RAW_ENV: host.url}}


def test_without_a_mirror_a_chart_is_downloaded_verified_and_cached(tmp_path, raw_host):
    host, _ = raw_host
    kw = clone_env(tmp_path, host)
    path, source = pins.fetch(SMALL, **kw)
    assert path == pins.cache_root(tmp_path / "repo") / SMALL and source.startswith(host.url)
    assert pins.tree_digest(path) == pins.pin(SMALL).sha256
    # LICENSE and NOTICE come from the repository root, the chart's files from its folder, at the pinned commit.
    assert "/aws/eks-charts/bfe91c4b9257c80f754ad4b3d6a9a3c239b2b8ec/LICENSE" in host.requests
    assert "/aws/eks-charts/bfe91c4b9257c80f754ad4b3d6a9a3c239b2b8ec/stable/aws-efa-k8s-device-plugin/Chart.yaml" \
        in host.requests
    served = len(host.requests)
    assert pins.fetch(SMALL, **kw) == (path, "local") and len(host.requests) == served  # the cache, no download


def test_a_tampered_download_is_an_error_and_nothing_is_cached(tmp_path, raw_host):
    host, root = raw_host
    values = root / pins.chart_file_url(SMALL, "values.yaml", base="").lstrip("/")
    values.write_text(values.read_text() + "# changed\n")
    with pytest.raises(pins.PinMismatch, match=r"not file values.yaml of the pinned .*nothing was cached"):
        pins.fetch(SMALL, **clone_env(tmp_path, host))
    assert not pins.cache_root(tmp_path / "repo").exists() or not any(pins.cache_root(tmp_path / "repo").iterdir())


def test_an_altered_local_copy_is_an_error_not_passed_over_for_a_download(tmp_path, raw_host):
    host, _ = raw_host
    kw = clone_env(tmp_path, host)
    mirror = Path(kw["environ"][pins.MIRROR_ENV]) / "charts" / SMALL
    shutil.copytree(pins.fetch(SMALL)[0], mirror)
    (mirror / "values.yaml").write_text("tolerations: []\n")
    with pytest.raises(pins.PinMismatch, match=rf"{SMALL}: not the pinned {SMALL}: tree sha256 expected"):
        pins.fetch(SMALL, **kw)
    assert host.requests == []


def test_an_unreachable_host_is_an_error_saying_how_to_get_it(tmp_path):
    (tmp_path / "empty").mkdir()
    environ = {pins.MIRROR_ENV: str(tmp_path / "empty"), pins.GITHUB_RAW_ENV: "http://127.0.0.1:9"}
    with pytest.raises(pins.PinUnavailable, match=rf"{SMALL} not found .*download from http://127.0.0.1:9/.* failed"):
        pins.fetch(SMALL, repo_root=tmp_path / "repo", environ=environ, timeout_s=5)


def test_a_missing_binary_says_how_to_build_it(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(pins.PinUnavailable, match=r"kube-apiserver v1.34.9 not found .*team's own build.*How it was"):
        pins.fetch("kube-apiserver", repo_root=tmp_path / "repo", environ={pins.MIRROR_ENV: str(tmp_path / "empty")})


def test_the_command_lists_the_table():
    run = subprocess.run([sys.executable, "-m", "tools.pins", "--list"], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True)
    rows = [line.split("\t") for line in run.stdout.splitlines()]
    assert [row[0] for row in rows] == list(pins.PINS) and all(len(row) == 4 for row in rows)


def test_the_crds_are_read_from_the_mirror_pins_mirror_names(tmp_path):
    """A clone beside no ../shared, with PINS_MIRROR set (bench/newcomer.py --mirror): the synth finds the CRDs
    where `python -m tools.pins` verified them, without a download."""
    from tools import crds

    mirror = tmp_path / "mirror"
    (mirror / "kuberay").mkdir(parents=True)
    for name in crds.SHA256:
        (mirror / "kuberay" / name).write_bytes(pins.fetch(name)[0].read_bytes())
    environ = {pins.MIRROR_ENV: str(mirror), crds.BASE_URL_ENV: "http://127.0.0.1:9"}
    for name in crds.SHA256:
        assert crds.crd_path(name, repo_root=tmp_path / "repo", environ=environ, timeout_s=5) == \
            mirror / "kuberay" / name
