"""KubeRay CRDs (tools/crds.py): where they are found, the SHA-256 check, the download and its errors.

Each test gets its own repository root under tmp_path, so `../shared/kuberay` and `.cache/` are the
test's; the downloads come from a real HTTP server on 127.0.0.1 serving copies of the pinned files.
"""

from __future__ import annotations

import hashlib
import http.server
import subprocess
import sys
from pathlib import Path

import pytest

from charts import validation
from config.errors import UserError
from harness.loopback import ThreadedHTTPServer
from tests.helpers import REPO
from tools import crds

CLUSTERS, JOBS = "ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml"


@pytest.fixture(scope="module")
def pinned(tmp_path_factory) -> Path:
    """A folder holding the two pinned files, byte for byte (from wherever this checkout resolves them)."""
    folder = tmp_path_factory.mktemp("pinned")
    for file in crds.SHA256:
        (folder / file).write_bytes(crds.crd_path(file).read_bytes())
    return folder


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    return root


class Server:
    """http.server on 127.0.0.1 in a thread, serving one folder and counting the GETs."""

    def __init__(self, folder: Path):
        self.requests: list[str] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(folder), **kwargs)

            def do_GET(self):
                server.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.httpd = ThreadedHTTPServer(Handler)
        self.url = f"http://127.0.0.1:{self.httpd.port}/crd/bases"

    def close(self):
        self.httpd.close()


@pytest.fixture
def served(tmp_path, pinned):
    """The pinned files under `<url>/crd/bases/`; yields (server, folder) so a test can tamper with them."""
    root = tmp_path / "www"
    bases = root / "crd" / "bases"
    bases.mkdir(parents=True)
    for file in crds.SHA256:
        (bases / file).write_bytes((pinned / file).read_bytes())
    server = Server(root)
    yield server, bases
    server.close()


@pytest.fixture(autouse=True)
def no_proxy_for_loopback(monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1")


def env(**values) -> dict[str, str]:
    """An environment for crd_path: only the variables given (no $KUBERAY_CRD_DIR from the caller's shell)."""
    return dict(values)


def tamper(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))


def test_resolution_order(repo, pinned, tmp_path):
    explicit, shared, cache = tmp_path / "explicit", crds.shared_dir(repo, {}), crds.cache_dir(repo)
    for folder in (explicit, shared, cache):
        folder.mkdir(parents=True)
    for file in crds.SHA256:
        (cache / file).write_bytes((pinned / file).read_bytes())
    offline = env(KUBERAY_CRD_BASE_URL="http://127.0.0.1:9/none")
    assert crds.crd_path(CLUSTERS, repo_root=repo, environ=offline) == cache / CLUSTERS
    (shared / CLUSTERS).write_bytes((pinned / CLUSTERS).read_bytes())
    assert crds.crd_path(CLUSTERS, repo_root=repo, environ=offline) == shared / CLUSTERS
    (explicit / CLUSTERS).write_bytes((pinned / CLUSTERS).read_bytes())
    with_dir = {**offline, "KUBERAY_CRD_DIR": str(explicit)}
    assert crds.crd_path(CLUSTERS, repo_root=repo, environ=with_dir) == explicit / CLUSTERS
    # A folder without the file is passed over for the next one.
    assert crds.crd_path(JOBS, repo_root=repo, environ=with_dir) == cache / JOBS


def test_a_tampered_local_copy_is_refused_not_passed_over(repo, pinned, tmp_path, served):
    server, _ = served
    explicit = tmp_path / "explicit"
    explicit.mkdir()
    (explicit / JOBS).write_bytes((pinned / JOBS).read_bytes())
    tamper(explicit / JOBS)
    with pytest.raises(UserError) as caught:
        crds.crd_path(JOBS, repo_root=repo, environ=env(KUBERAY_CRD_DIR=str(explicit), KUBERAY_CRD_BASE_URL=server.url))
    message = str(caught.value)
    assert str(explicit / JOBS) in message
    assert crds.SHA256[JOBS] in message
    assert hashlib.sha256((explicit / JOBS).read_bytes()).hexdigest() in message
    assert server.requests == [] and not crds.cache_dir(repo).exists()


def test_download_is_checked_cached_and_reused(repo, served):
    server, _ = served
    environ = env(KUBERAY_CRD_BASE_URL=server.url)
    path, downloaded = crds.resolve(CLUSTERS, repo_root=repo, environ=environ)
    assert (path, downloaded) == (crds.cache_dir(repo) / CLUSTERS, True)
    assert server.requests == ["/crd/bases/" + CLUSTERS]
    assert crds.crd_path(CLUSTERS, repo_root=repo, environ=environ) == path
    assert server.requests == ["/crd/bases/" + CLUSTERS]  # the second call read the cache
    assert sorted(p.name for p in crds.cache_dir(repo).iterdir()) == [CLUSTERS]  # no temporary file left


def test_a_tampered_download_is_refused_and_not_cached(repo, served):
    server, bases = served
    tamper(bases / JOBS)
    with pytest.raises(UserError) as caught:
        crds.crd_path(JOBS, repo_root=repo, environ=env(KUBERAY_CRD_BASE_URL=server.url))
    message = str(caught.value)
    assert f"{server.url}/{JOBS}" in message and crds.SHA256[JOBS] in message and "nothing was cached" in message
    assert not (crds.cache_dir(repo) / JOBS).exists()


def test_offline_error_names_the_three_ways(repo):
    with pytest.raises(UserError) as caught:
        crds.crd_path(CLUSTERS, repo_root=repo, environ=env(KUBERAY_CRD_BASE_URL="http://127.0.0.1:9/bases"),
                      timeout_s=5)
    message = str(caught.value)
    assert message.startswith(f"{CLUSTERS}: KubeRay 1.7.0 CRD not found")
    assert "http://127.0.0.1:9/bases/ray.io_rayclusters.yaml failed" in message
    assert "set KUBERAY_CRD_DIR" in message
    assert f"put them in {crds.shared_dir(repo, {})}" in message
    assert "run `make setup`" in message and "KUBERAY_CRD_BASE_URL" in message
    assert str(crds.cache_dir(repo)) in message


def test_http_error_is_reported(repo, served):
    server, _ = served
    with pytest.raises(UserError, match=r"failed \(HTTP Error 404"):
        crds.crd_path(CLUSTERS, repo_root=repo, environ=env(KUBERAY_CRD_BASE_URL=server.url + "/missing"))


def test_validation_refuses_a_tampered_crd(monkeypatch, tmp_path, pinned):
    (tmp_path / CLUSTERS).write_bytes((pinned / CLUSTERS).read_bytes())
    tamper(tmp_path / CLUSTERS)
    monkeypatch.setenv(crds.DIR_ENV, str(tmp_path))
    validation.crd_validator.cache_clear()
    try:
        with pytest.raises(UserError, match=rf"{tmp_path / CLUSTERS}: {CLUSTERS} is not KubeRay 1.7.0's: sha256"):
            validation.problems([{"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "x"}}], "1.34")
    finally:
        validation.crd_validator.cache_clear()


def test_setup_command_fails_naming_file_and_digests(tmp_path, pinned):
    """`python -m tools.crds` (what `make setup` runs) with a tampered file: exit 2, file and digests named."""
    for file in crds.SHA256:
        (tmp_path / file).write_bytes((pinned / file).read_bytes())
    tamper(tmp_path / JOBS)
    run = subprocess.run([sys.executable, "-m", "tools.crds"], cwd=REPO, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", crds.DIR_ENV: str(tmp_path)}, timeout=60)
    assert run.returncode == 2, run.stderr
    assert f"{tmp_path / JOBS}: {JOBS} is not KubeRay 1.7.0's: sha256 expected {crds.SHA256[JOBS]}, got " in run.stderr
