"""The KubeRay CRDs the charts validate against: found or downloaded, and always checked by SHA-256.

Each file is looked for, in this order, in `$KUBERAY_CRD_DIR`, in `../shared/kuberay` beside the
repository, and in the repository's cache `.cache/kuberay/v<VERSION>/` (gitignored); a folder that
does not hold it is passed over. When none does, it is downloaded from `$KUBERAY_CRD_BASE_URL/<file>`
(default: the release tag's `ray-operator/config/crd/bases` on GitHub) and cached. Whatever the
source, the bytes must match the digest pinned below; a file that does not is refused, never cached
and never passed over for the next source (a copy that differs from the pinned release is a mistake
to fix, not to work around).

`python -m tools.crds` resolves both files ahead of the first synth (`make setup` fetches them through
`python -m tools.pins`, which reads the same digests), so the first synth needs no network.

It sits in `tools/` (not `charts/`): a fetcher, not a chart; `charts/validation.py` reads the files through it.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from config.errors import UserError, run_cli
from config.loader import REPO_ROOT
from tools import pins

# The pins (version, URL, SHA-256) are rows of the one table in tools/pins.py.
_PINS = [p for p in pins.of_kind("file") if p.mirror.startswith("kuberay/")]
VERSION = pins.KUBERAY_VERSION
SHA256 = {p.name: p.sha256 for p in _PINS}
DIR_ENV = "KUBERAY_CRD_DIR"
BASE_URL_ENV = "KUBERAY_CRD_BASE_URL"
DEFAULT_BASE_URL = _PINS[0].url.rsplit("/", 1)[0]
# Each file is about 1 MB; a stalled connection should fail the set-up, not hang it.
DOWNLOAD_TIMEOUT_S = 60.0


def shared_dir(repo_root: Path = REPO_ROOT, environ: Mapping[str, str] = os.environ) -> Path:
    """`../shared/kuberay` beside the repository, or `$PINS_MIRROR/kuberay` (tools/pins.py's mirror)."""
    return pins.mirror_root(repo_root, environ) / "kuberay"


def cache_dir(repo_root: Path = REPO_ROOT) -> Path:
    """The repository's download cache for this version."""
    return repo_root / ".cache" / "kuberay" / f"v{VERSION}"


def base_url(environ: Mapping[str, str] = os.environ) -> str:
    """Where missing files are downloaded from: $KUBERAY_CRD_BASE_URL, else the pinned release on GitHub."""
    return (environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")


def search_dirs(repo_root: Path = REPO_ROOT, environ: Mapping[str, str] = os.environ) -> list[Path]:
    """The folders looked in, first match wins."""
    dirs = [Path(environ[DIR_ENV])] if environ.get(DIR_ENV) else []
    # tools/pins.py's cache last: `python -m tools.pins` may have downloaded them there.
    return dirs + [shared_dir(repo_root, environ), cache_dir(repo_root), pins.cache_root(repo_root)]


def check_digest(data: bytes, file: str, source: str, *, fix: str) -> None:
    """Refuse `data` (read from `source`) unless it is KubeRay VERSION's `file`, byte for byte."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != SHA256[file]:
        raise UserError(f"{source}: {file} is not KubeRay {VERSION}'s: sha256 expected {SHA256[file]}, "
                         f"got {actual}; {fix} (nothing was cached)")


def crd_path(file: str, *, repo_root: Path = REPO_ROOT, environ: Mapping[str, str] = os.environ,
             timeout_s: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """The verified local path of CRD `file`, downloading it into the cache when no folder holds it."""
    return resolve(file, repo_root=repo_root, environ=environ, timeout_s=timeout_s)[0]


def resolve(file: str, *, repo_root: Path = REPO_ROOT, environ: Mapping[str, str] = os.environ,
            timeout_s: float = DOWNLOAD_TIMEOUT_S) -> tuple[Path, bool]:
    """`crd_path`, and whether the file had to be downloaded."""
    if file not in SHA256:
        raise UserError(f"{file}: not a pinned KubeRay {VERSION} CRD (pinned: {', '.join(SHA256)})")
    for folder in search_dirs(repo_root, environ):
        path = folder / file
        if path.is_file():
            check_digest(path.read_bytes(), file, str(path),
                         fix=f"replace it with the v{VERSION} release's file, or delete it to have it downloaded")
            return path, False
    url = f"{base_url(environ)}/{file}"
    data = _download(url, file, repo_root, environ, timeout_s)
    check_digest(data, file, url, fix=f"{BASE_URL_ENV} must serve the v{VERSION} release's files")
    return _cache(data, file, repo_root), True


def _download(url: str, file: str, repo_root: Path, environ: Mapping[str, str], timeout_s: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.read()
    except (OSError, ValueError, http.client.HTTPException) as exc:  # URLError and HTTPError are OSErrors
        reason = exc if isinstance(exc, urllib.error.HTTPError) else getattr(exc, "reason", exc)
        looked = ", ".join(str(d) for d in search_dirs(repo_root, environ))
        raise UserError(
            f"{file}: KubeRay {VERSION} CRD not found (looked in {looked}) and the download from {url} failed "
            f"({reason}). Provide the CRDs ({', '.join(SHA256)}) one of three ways: set {DIR_ENV} to a folder "
            f"holding them; put them in {shared_dir(repo_root, environ)}; or run `make setup` where "
            f"{url.rsplit('/', 1)[0]} "
            f"can be reached (or with {BASE_URL_ENV} set to a mirror of it), which caches them in "
            f"{cache_dir(repo_root)}") from None


def _cache(data: bytes, file: str, repo_root: Path) -> Path:
    # Written beside the target and renamed: a concurrent reader sees the whole file or none.
    pins.write_atomic(cache_dir(repo_root) / file, data)
    return cache_dir(repo_root) / file


def main(argv: list[str] | None = None) -> int:
    """Resolve every pinned CRD; one line per file that had to be downloaded; exit 2 with the reason on failure."""
    import argparse

    argparse.ArgumentParser(
        prog="python -m tools.crds",
        description=f"Find KubeRay {VERSION}'s CRDs ({', '.join(SHA256)}), verify their pinned SHA-256 and cache "
                    f"them: ${DIR_ENV}, then ../shared/kuberay, then .cache/kuberay/v{VERSION}/, else a download from "
                    f"${BASE_URL_ENV} (docs/setup.md: KubeRay CRDs).").parse_args(argv)
    for file in SHA256:
        _, downloaded = resolve(file)
        if downloaded:
            print(f"KubeRay {VERSION} CRD {file}: downloaded from {base_url()}, sha256 verified, cached in "
                  f"{cache_dir()}")
    return 0


if __name__ == "__main__":
    run_cli(main)
