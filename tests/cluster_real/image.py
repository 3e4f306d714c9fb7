"""The stand-in for the DLC image: a Debian bookworm minbase root file system, imported into the node's containerd.

The DLC (`ray.image`) cannot be pulled here. The pods run the project's own pinned Python instead: the host's
CPython install and the project's virtualenv are mounted read-only at the same paths (a venv's shebangs and
`pyvenv.cfg` are absolute), so the image only needs a libc and the shared libraries a pyenv-built CPython links
(../shared/k8s-node/README.md, "a project's own Python environment in a pod"). No dockerd: the root file
system's tar becomes a one-layer OCI archive here and `ctr images import` reads it.

    python -m tests.cluster_real.image [CACHE_DIR]     # build (or reuse) and print the archive's path

The image's PATH starts with the venv's `bin/`, as the DLC's starts with its own Python's: KubeRay's commands
(`ray start`, the wait-gcs-ready init container's `ray health-check`) and follow.sh's `python` and `ray` find
the pinned Ray there.

Cache: `.cache/cluster-real/<key>.rootfs.tar`, the debootstrap result, where key hashes everything that build
depends on (suite, package list, mirror, recipe version); and `<key>-<venv key>.oci.tar`, the archive with the
image config (a second or two from the cached root file system). A changed recipe builds anew; an unchanged one
is reused as is.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
MIRROR = os.environ.get("CLUSTER_REAL_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What a pyenv CPython 3.11 and the venv's wheels (torch, pyarrow, ray) load beyond minbase, plus bash, which
# KubeRay's head and worker commands run under (minbase has it), and procps for Ray's own `ps` calls.
PACKAGES = ("libssl3", "libsqlite3-0", "libffi8", "libreadline8", "libbz2-1.0", "liblzma5", "zlib1g", "procps",
            "ca-certificates")
RECIPE = 1  # bump when the steps below change what the archive holds
IMAGE_REF = "docker.io/local/cluster-real-base"  # fully qualified: the CRI looks images up by the normalised name
BUILD_TIMEOUT_S = 600


def cache_key() -> str:
    text = json.dumps({"suite": SUITE, "mirror": MIRROR, "packages": PACKAGES, "recipe": RECIPE}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def venv_dir() -> Path:
    """The project's virtualenv as the pods mount it (its real path: `.venv` may be a link)."""
    return (REPO / ".venv").resolve()


def python_home() -> Path:
    """The CPython install the venv was made from (`home` in pyvenv.cfg, one level up from its bin/)."""
    cfg = dict(line.split(" = ", 1) for line in (venv_dir() / "pyvenv.cfg").read_text().splitlines() if " = " in line)
    return Path(cfg["home"]).resolve().parent


def image_key() -> str:
    return hashlib.sha256(f"{cache_key()} {venv_dir()} {IMAGE_REF} {DEFAULT_PATH}".encode()).hexdigest()[:16]


def image_name() -> str:
    """The image reference the pods use: tagged with its cache key, so a new recipe is a new image."""
    return f"{IMAGE_REF}:{image_key()}"


def build(cache_dir: Path | None = None, log=print) -> Path:
    """The OCI archive of the stand-in image, built with debootstrap unless the cache has it."""
    cache_dir = Path(cache_dir or REPO / ".cache" / "cluster-real")
    cache_dir.mkdir(parents=True, exist_ok=True)
    archive = cache_dir / f"{image_key()}.oci.tar"
    if archive.exists():
        log(f"image: cached {archive.name} ({archive.stat().st_size / 2**20:.0f} MiB)")
        return archive
    t0 = time.monotonic()
    layer = cache_dir / f"{cache_key()}.rootfs.tar"
    if not layer.exists():
        if shutil.which("debootstrap") is None:
            raise RuntimeError("debootstrap not found: apt-get install debootstrap (docs/cluster-tier.md)")
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix="build-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
                            str(rootfs), MIRROR], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=BUILD_TIMEOUT_S)
            for cruft in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
                shutil.rmtree(rootfs / cruft, ignore_errors=True)
            tmp_layer = Path(tmp) / "rootfs.tar"
            with tarfile.open(tmp_layer, "w") as tar:
                for entry in sorted(os.listdir(rootfs)):
                    tar.add(rootfs / entry, arcname=entry)
            tmp_layer.rename(layer)
        log(f"image: debootstrap {SUITE} minbase in {time.monotonic() - t0:.1f} s")
    for stale in cache_dir.glob("*.oci.tar"):  # an archive of an older recipe or venv: never read again
        stale.unlink()
    tmp_archive = archive.with_suffix(".tmp")
    write_oci_archive(layer, tmp_archive, image_name(), path=f"{venv_dir()}/bin:{DEFAULT_PATH}")
    tmp_archive.rename(archive)
    log(f"image: {archive.name} in {time.monotonic() - t0:.1f} s ({archive.stat().st_size / 2**20:.0f} MiB)")
    return archive


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def write_oci_archive(layer: Path, out: Path, ref: str, *, path: str) -> None:
    """A one-layer OCI image layout in a tar (what `ctr images import` reads), named `ref`, with PATH `path`."""
    layer_digest = _sha256(layer)
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": [f"PATH={path}"],
                   "Cmd": ["/bin/bash"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": f"sha256:{hashlib.sha256(config).hexdigest()}", "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": f"sha256:{layer_digest}", "size": layer.stat().st_size}],
    }, sort_keys=True).encode()
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": f"sha256:{hashlib.sha256(manifest).hexdigest()}", "size": len(manifest),
                       "annotations": {"io.containerd.image.name": ref,
                                       "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]}}],
    }, sort_keys=True).encode()
    with tarfile.open(out, "w") as tar:
        _add_bytes(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _add_bytes(tar, "index.json", index)
        _add_bytes(tar, f"blobs/sha256/{hashlib.sha256(config).hexdigest()}", config)
        _add_bytes(tar, f"blobs/sha256/{hashlib.sha256(manifest).hexdigest()}", manifest)
        tar.add(layer, arcname=f"blobs/sha256/{layer_digest}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else None, log=lambda m: print(m, file=sys.stderr)))
