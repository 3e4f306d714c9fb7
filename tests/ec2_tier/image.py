"""The DLC stand-in image: what the Ray Train DLC is where the cluster launcher can tell.

Upstream (aws/deep-learning-containers, docker/ray-train/Dockerfile.cuda, stage `ec2`): Amazon Linux 2023,
no USER line (root, HOME /root), `WORKDIR /workspace`, `ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]`,
`CMD ["bash"]`, Ray and Python in /opt/venv on PATH, no rsync. The stand-in: Debian bookworm minbase
(`debootstrap --variant=minbase`, so neither rsync nor an ssh client), root, /workspace, an entrypoint that
execs its arguments, and the project's own Python environment on PATH (bind-mounted read-only by the tier's
run options, so no second copy of Ray and torch is made: Ray 2.58 as pinned in requirements.txt).

The rootfs tarball is cached under .cache/ec2-tier/ by a hash of what goes into it; the cold build
(debootstrap from deb.debian.org) is the slow step, `docker import` into a node's daemon takes seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.ray_head import SLOW_START_ENV

REPO = Path(__file__).resolve().parents[2]
# EC2_TIER_CACHE: another cache directory (bench/ec2_tier.py measures a cold run with an empty one).
CACHE = Path(os.environ.get("EC2_TIER_CACHE") or REPO / ".cache" / "ec2-tier")
SUITE = "bookworm"
MIRROR = os.environ.get("EC2_TIER_MIRROR", "http://deb.debian.org/debian")
# What a pyenv/python.org CPython and Ray's wheels load from the system (ldd of the interpreter, _ssl, _ctypes,
# _sqlite3, readline), plus procps (`ps`, which the DLC has too). Deliberately no rsync and no openssh-client.
PACKAGES = ("libssl3", "libffi8", "zlib1g", "libbz2-1.0", "liblzma5", "libsqlite3-0", "libreadline8",
            "libncursesw6", "libuuid1", "procps", "ca-certificates")
FORBIDDEN = ("usr/bin/rsync", "usr/bin/ssh")
WORKDIR = "/workspace"
ENTRYPOINT = "/usr/local/bin/entrypoint.sh"
# Amazon Linux 2023's /etc/profile keeps the PATH it inherits (pathmunge appends), so the DLC's
# /opt/venv/bin stays first in Ray's `bash --login` commands; Debian's resets PATH for login shells. The
# stand-in gets AL2023's behaviour.
_PROFILE = ("# The DLC stand-in: like Amazon Linux 2023, keep the inherited PATH (tests/ec2_tier/image.py)\n"
            "for i in /etc/profile.d/*.sh; do [ -r \"$i\" ] && . \"$i\"; done\nunset i\n")
# The DLC's entrypoint checks CUDA forward compatibility, then execs its command.
_ENTRYPOINT_SH = "#!/bin/sh\n# The DLC stand-in's entrypoint: exec the command.\nexec \"$@\"\n"


def python_env() -> tuple[Path, Path]:
    """(the project's virtual environment, the interpreter installation it was made from), both resolved."""
    venv = Path(sys.prefix).resolve()
    base = Path(sys.base_prefix).resolve()
    return venv, base


@dataclass(frozen=True)
class Image:
    tarball: Path
    tag: str
    changes: tuple[str, ...]
    build_seconds: float
    """Seconds this call spent building the rootfs (0.0 when it came from the cache)."""


def _key() -> str:
    venv, _ = python_env()
    text = json.dumps([SUITE, MIRROR, PACKAGES, _ENTRYPOINT_SH, str(venv), _PROFILE, 3])
    # The tarball is keyed by what goes into it; the imported image (and the hosts' data roots) by that and the
    # import's --change lines too.
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _changes() -> tuple[str, ...]:
    venv, _ = python_env()
    path = f"{venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    # Not the DLC's: Ray's dashboard gives each module 30 s to start (ray 2.58.0 dashboard/consts.py
    # SUBPROCESS_MODULE_WAIT_READY_TIMEOUT), which a cold import on two loaded shared cores overran (`ray start
    # --head` failed: "Module MetricsHead failed to start"); tests/ray_head.py raises it (and `ray start`'s own wait
    # for the dashboard, which must outwait it) the same way.
    return (f"ENV PATH={path}", "ENV LANG=C.UTF-8", "ENV LC_ALL=C.UTF-8", "ENV PYTHONUNBUFFERED=1",
            *(f"ENV {name}={value}" for name, value in SLOW_START_ENV.items() if name.startswith("RAY_DASHBOARD")),
            f"WORKDIR {WORKDIR}", f'ENTRYPOINT ["{ENTRYPOINT}"]', 'CMD ["bash"]')


def _prune(key: str, tag_key: str) -> None:
    """Drop the tarballs and hosts' data roots of other keys (an edit here makes a new key): the cache holds one."""
    for old in CACHE.glob("standin-*.tar"):
        if old.name != f"standin-{key}.tar":
            old.unlink(missing_ok=True)
    for old in (CACHE / "docker").glob("*"):
        if old.name != tag_key:
            shutil.rmtree(old, ignore_errors=True)


def build(log=print) -> Image:
    """The stand-in's rootfs tarball (built once per key, then cached) and the `docker import` arguments."""
    key = _key()
    tarball = CACHE / f"standin-{key}.tar"
    tag_key = hashlib.sha256(json.dumps([key, _changes()]).encode()).hexdigest()[:16]
    tag = f"ray-dlc-standin:{tag_key}"
    _prune(key, tag_key)
    if tarball.exists():
        return Image(tarball, tag, _changes(), 0.0)
    for tool in ("debootstrap", "tar"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} not found: the ray up tier builds its image with it "
                               "(apt-get install debootstrap)")
    CACHE.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="rootfs-") as tmp:
        root = Path(tmp) / "root"
        log(f"building the DLC stand-in rootfs ({SUITE} minbase) from {MIRROR} ...")
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(root),
                        MIRROR], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900)
        for path in FORBIDDEN:
            if (root / path).exists():
                raise RuntimeError(f"the stand-in must lack {path} as the DLC does")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(root / junk, ignore_errors=True)
        (root / WORKDIR.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (root / "etc" / "profile").write_text(_PROFILE)
        entry = root / ENTRYPOINT.lstrip("/")
        entry.write_text(_ENTRYPOINT_SH)
        entry.chmod(0o755)
        partial = tarball.with_suffix(".partial")
        with tarfile.open(partial, "w") as tar:
            tar.add(root, arcname=".")
        partial.rename(tarball)
    return Image(tarball, tag, _changes(), time.monotonic() - start)


if __name__ == "__main__":
    image = build()
    print(f"{image.tarball} {image.tag} built in {image.build_seconds:.1f} s")
