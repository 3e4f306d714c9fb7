"""Every artifact the tests and the deploy read from upstream, pinned in one table, and the one fetcher for them.

`PINS` below is the table: name, version, URL, SHA-256 (and the kind of artifact). Nothing else in the repository
repeats a digest or a chart version: tests/vendored.py, tools/crds.py and stacks/versions.py read theirs from here
(tests/test_pins.py checks that the variable file's defaults and config/versions.py agree with it).

Where an artifact is looked for, first match wins:
  1. a folder named by the caller's own variable ($HELM_CHARTS_DIR, $KUBERAY_CRD_DIR), if set;
  2. the local mirror: `$PINS_MIRROR` if set, else `../shared` beside the repository (the team's checkout has it, a
     user's clone does not), at the pin's `mirror` path;
  3. the repository's cache `.cache/pins/` (gitignored), where earlier downloads were put;
  4. else a download from the pin's URL, verified, then cached.
Whatever the source, the bytes must match the pinned SHA-256. A copy that does not is an error (PinMismatch): it is
never passed over for the next source, never cached and never turned into a skip. An artifact that no source holds
and that cannot be downloaded is an error too (PinUnavailable), whose message says how to get it.

Kinds:
  * `file`: one file; `sha256` is its digest; `url` is where a clone downloads it.
  * `chart`: a Helm chart folder exactly as it is in its upstream repository at the release commit (Helm
    repositories publish packaged .tgz files whose Chart.yaml `helm package` rewrites, so they cannot match).
    `sha256` is the digest of the folder's `sha256sum`-style listing (`tree_digest`); the per-file listing is
    `tools/pins-charts.sha256sums` (the mirror's SHA256SUMS), and each file is downloaded from GitHub's raw
    content host at the pinned commit (`CHART_SOURCES`; `$PINS_GITHUB_RAW_URL` replaces the host, for a mirror).
  * `binary`: an xz-compressed Linux amd64 program the cluster test tiers run (../shared/k8s/bin,
    ../shared/k8s-node/bin). These are the team's own builds (OpenShift's Kubernetes v1.34.9 fork, kwok, the
    KubeRay operator; how: ../shared/k8s/README.md "How it was built", ../shared/k8s-node/README.md), published
    nowhere, so a clone without the mirror cannot download them: `url` says where the sources are, and the error
    says to build them (upstream's release binaries of the same versions work the same way but have other
    digests, so they are refused here by design). `sha256` is the .xz file's; `unpacked_sha256` the program's.
  * `ci`: what only the GitHub workflow's `cluster-kind` job uses, which the job's actions download themselves (kind
    and its node image through helm/kind-action): `sha256` is the image's manifest digest, or empty for a release
    the action fetches by tag. Never fetched here (this machine has no Docker registry); tests/test_ci_workflow.py
    checks that the workflow names exactly these versions and this digest.

`python -m tools.pins` (run by `make setup`) resolves every chart and file, printing one line per artifact and
where it came from; `--list` prints the table; `--binaries` also checks the cluster tiers' programs.
Standard library only: `config`, `charts`, `stacks` and the tests may all import it.
"""

from __future__ import annotations

import hashlib
import http.client
import lzma
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MIRROR_ENV = "PINS_MIRROR"
GITHUB_RAW_ENV = "PINS_GITHUB_RAW_URL"
GITHUB_RAW = "https://raw.githubusercontent.com"
CHART_LISTING = Path(__file__).with_name("pins-charts.sha256sums")
# A stalled connection should fail the set-up, not hang it; each file is at most about 1 MB.
DOWNLOAD_TIMEOUT_S = 60.0
DOWNLOAD_THREADS = 8


class PinError(Exception):
    """A pinned artifact could not be provided.

    Not a `config.errors.UserError`: CI runs `python3 -m tools.pins` before any package is installed, and importing
    `config` needs pydantic and PyYAML. Callers inside the project turn it into one (`tests/vendored.py`)."""


class PinMismatch(PinError):
    """A copy (local or downloaded) is not the pinned artifact."""


class PinUnavailable(PinError):
    """No source holds the artifact and it could not be downloaded; the message says how to get it."""


@dataclass(frozen=True, kw_only=True)
class Pin:
    """One pinned upstream artifact."""

    name: str
    """The key: a file name, a chart's `<chart>-<version>` folder, or a program's name."""
    kind: str
    """`file`, `chart`, `binary` or `ci` (module docstring)."""
    version: str
    """The upstream version (a chart's chart version, a release tag)."""
    url: str
    """Where a clone downloads it (file), the upstream folder at the pinned commit (chart), or the sources (binary)."""
    sha256: str
    """The file's SHA-256; a chart's tree digest; a binary's .xz digest."""
    mirror: str
    """Its path under the mirror (../shared)."""
    unpacked_sha256: str = ""
    """binary only: the SHA-256 of the unpacked program."""


KUBERAY_VERSION = "1.7.0"
KUBERAY_COMMIT = "59d663aeec13760646da3db9c1cf8cfe883e30b7"
_KUBERAY_CRD_URL = f"https://raw.githubusercontent.com/ray-project/kuberay/v{KUBERAY_VERSION}/ray-operator/config/crd/bases"
_K8S_BUILD = "https://github.com/openshift/microshift/tree/473c3de15d9aeeb399aa95250672c07655554015"


def _gh(repo: str, commit: str, path: str) -> str:
    return f"https://github.com/{repo}/tree/{commit}/{path}"


# Provenance of every chart: ../shared/charts/README.md (repository, path, tag and commit of each folder).
_TABLE: tuple[Pin, ...] = (
    # KubeRay's CRDs, from the v1.7.0 tag (commit 59d663aeec), ray-operator/config/crd/bases/.
    Pin(name="ray.io_rayclusters.yaml", kind="file", version=KUBERAY_VERSION,
        url=f"{_KUBERAY_CRD_URL}/ray.io_rayclusters.yaml", mirror="kuberay/ray.io_rayclusters.yaml",
        sha256="c44704442eef0c6721ad40c1d66782c8bd3fdab9d3344306a5820910a679baa1"),
    Pin(name="ray.io_rayjobs.yaml", kind="file", version=KUBERAY_VERSION,
        url=f"{_KUBERAY_CRD_URL}/ray.io_rayjobs.yaml", mirror="kuberay/ray.io_rayjobs.yaml",
        sha256="01a5cf3b17c1769fda44af7e82debcd98722f0c27b9ab84d084681c6649121f5"),
    # The configuration schema the EKS add-on of the node monitoring agent accepts (beside the chart upstream).
    Pin(name="eks-node-monitoring-agent-1.7.0.configuration.schema.json", kind="file", version="1.7.0",
        url=f"{GITHUB_RAW}/aws/eks-node-monitoring-agent/c399089dec78cb245306ca2a5f9806b7c32ca093/charts/"
            "configuration.schema.json",
        mirror="charts/eks-node-monitoring-agent-1.7.0.configuration.schema.json",
        sha256="cf9829b3a720bc0b0a8b5b806af5fed258b6fae12bc313f6dddbc4a49725c35a"),
    # Helm charts: the stacks install these versions, and the tests render these folders with the real helm.
    Pin(name="nvidia-device-plugin-0.20.0", kind="chart", version="0.20.0",
        url=_gh("NVIDIA/k8s-device-plugin", "1b826acc6af3079d8923bac395c3124b8861a9a6",
                "deployments/helm/nvidia-device-plugin"),
        mirror="charts/nvidia-device-plugin-0.20.0",
        sha256="8e3fe101c6f2d4997c6890c52c8b5ef468c0e951cc07c586128a694e63f7c48b"),
    Pin(name="aws-efa-k8s-device-plugin-v0.5.30", kind="chart", version="v0.5.30",
        url=_gh("aws/eks-charts", "bfe91c4b9257c80f754ad4b3d6a9a3c239b2b8ec", "stable/aws-efa-k8s-device-plugin"),
        mirror="charts/aws-efa-k8s-device-plugin-v0.5.30",
        sha256="9c15ef42fff8de670189712c3e7dbee6b03694037dab4a205bce82e511923e9d"),
    Pin(name="kuberay-operator-1.7.0", kind="chart", version=KUBERAY_VERSION,
        url=_gh("ray-project/kuberay", KUBERAY_COMMIT, "helm-chart/kuberay-operator"),
        mirror="charts/kuberay-operator-1.7.0",
        sha256="86d320521e7e86ece315063fbfdaf9f46d25b87ef66f0410f5cafffe68acc28a"),
    Pin(name="cluster-autoscaler-9.53.0", kind="chart", version="9.53.0",
        url=_gh("kubernetes/autoscaler", "a2db9eb71c285fe5779c622e9255b17b08e78147",
                "cluster-autoscaler/charts/cluster-autoscaler"),
        mirror="charts/cluster-autoscaler-9.53.0",
        sha256="ac1cac6c132eccbfc480c8fdc3cb02f91868649005dad2a20be278f7a95e8194"),
    Pin(name="eks-node-monitoring-agent-1.7.0", kind="chart", version="1.7.0",
        url=_gh("aws/eks-node-monitoring-agent", "c399089dec78cb245306ca2a5f9806b7c32ca093",
                "charts/eks-node-monitoring-agent"),
        mirror="charts/eks-node-monitoring-agent-1.7.0",
        sha256="c06f3239039b2676e3a552d12b29ceb2fd1f9479db004b5f7f5b640d9384da33"),
    Pin(name="kube-prometheus-stack-88.5.3", kind="chart", version="88.5.3",
        url=_gh("prometheus-community/helm-charts", "ea930baeebeba39f56d6b44e351f23b2a072a600",
                "charts/kube-prometheus-stack"),
        mirror="charts/kube-prometheus-stack-88.5.3",
        sha256="766e148d44899b2310ef6c3f6b134ef72e2827d3717c0822ce57d91aee8a19dd"),
    Pin(name="dcgm-exporter-4.8.2", kind="chart", version="4.8.2",
        url=_gh("NVIDIA/dcgm-exporter", "691c92762eb551313c825f6efe4ceeee20982801", "deployment"),
        mirror="charts/dcgm-exporter-4.8.2",
        sha256="6ef7bc1b0aee250359246b9646bec686ca41c03ba5dbdd3704ed0ced103c0608"),
    # The cluster test tiers' programs (../shared/k8s/bin/SHA256SUMS, ../shared/k8s-node/bin/SHA256SUMS).
    Pin(name="etcd", kind="binary", version="3.6.5 (openshift/etcd 806f690e)",
        url="https://github.com/openshift/etcd/tree/806f690e1f140e0aea2eb05ef5f288b756b62895",
        mirror="k8s/bin/etcd.xz", sha256="fe0bf9580c4612ee1e7e97ed23a3b911e737324a85c82e99cfe0ea5ccd69e1d7",
        unpacked_sha256="7a8893261c3d50606c9ca739558c325f05d79993a170c0b701a2019e9d7c5804"),
    Pin(name="kube-apiserver", kind="binary", version="v1.34.9", url=_K8S_BUILD, mirror="k8s/bin/kube-apiserver.xz",
        sha256="486b485048f6ed91ce7fd6bdd378ca527180354b181fb33cb31482d7d917176c",
        unpacked_sha256="b25842da49e88b2a3bcee874bf7fb8354cf91e2c3f57f7e2eb1bd0616c24d5f5"),
    Pin(name="kube-controller-manager", kind="binary", version="v1.34.9", url=_K8S_BUILD,
        mirror="k8s/bin/kube-controller-manager.xz",
        sha256="ebc5f46f5368a00cffb11ec8887318a904d5d1ea5ee5c67e6e6a9dc045a8cf24",
        unpacked_sha256="5f3fd9ec96a2543623d6a3f729eea49aa4814737ad3f20351ebcbbd5992753af"),
    Pin(name="kube-scheduler", kind="binary", version="v1.34.9", url=_K8S_BUILD, mirror="k8s/bin/kube-scheduler.xz",
        sha256="e09e170a6c604533a875e7cbd27585f2145cc962df0e7a78a888ab51e5741656",
        unpacked_sha256="e789b97f4c113c31b18a1144590a1bb8a48a561df8737eb7acfad4ae2452fc4d"),
    Pin(name="kwok", kind="binary", version="v0.8.0",
        url="https://github.com/kubernetes-sigs/kwok/tree/156033d7df7ea0e09cea82b715fe566ea68aeeb4/cmd/kwok",
        mirror="k8s/bin/kwok.xz", sha256="d89df438469c6c653c8d530870bb6e186e0253bdebffe9101a5b4b53d29bab5e",
        unpacked_sha256="eb63c2f5fe21dffca0b92c0bf0b8ff3a51d316c2017855e24733480cefb6f3e9"),
    Pin(name="kuberay-operator", kind="binary", version=f"v{KUBERAY_VERSION}",
        url=f"https://github.com/ray-project/kuberay/tree/{KUBERAY_COMMIT}/ray-operator",
        mirror="k8s/bin/kuberay-operator.xz",
        sha256="6d1d54bbc217ab90b95a1ad62e078e39977448ec616e57887622719bb67fbd09",
        unpacked_sha256="30fe2a9c824a9fd91d34735a5d99fba956e5967f3a6f5a3c64df33fdb191ae7b"),
    # The GitHub workflow's cluster-kind job: kind v0.30.0 and the node image its release notes list for
    # Kubernetes 1.34 (https://github.com/kubernetes-sigs/kind/releases/tag/v0.30.0), pinned by digest so the
    # runner cannot get another build of the same tag.
    Pin(name="kind", kind="ci", version="v0.30.0", url="https://github.com/kubernetes-sigs/kind/releases/tag/v0.30.0",
        mirror="", sha256=""),
    Pin(name="kindest/node", kind="ci", version="v1.34.0",
        url="https://github.com/kubernetes-sigs/kind/releases/tag/v0.30.0", mirror="",
        sha256="7416a61b42b1662ca6ca89f02028ac133a309a2a30ba309614e8ec94d976dc5a"),
    # k8s-node/bin/SHA256SUMS lists only the .xz files: the unpacked digest is checked when it is known.
    Pin(name="kubelet", kind="binary", version="v1.34.9", url=_K8S_BUILD, mirror="k8s-node/bin/kubelet.xz",
        sha256="a3a9485b13146fdd4f2dd2729a7e7d5646081db83afff65546f4183637e0c129"),
    Pin(name="kube-proxy", kind="binary", version="v1.34.9", url=_K8S_BUILD, mirror="k8s-node/bin/kube-proxy.xz",
        sha256="1978b569fff38abd0c93ea4c933da75f2eff01a3e50c1fa1447b74b39f32cbd3"),
    Pin(name="kubectl", kind="binary", version="v1.34.9", url=_K8S_BUILD, mirror="k8s-node/bin/kubectl.xz",
        sha256="e2d971b66101d54daa2ba9cc39a4bea11af1e7b99b3dd81aa92141e1b0c4c0dd"),
)
PINS: dict[str, Pin] = {pin.name: pin for pin in _TABLE}

# Where each chart folder's files come from: (folder prefix inside the chart, GitHub repo, commit, path in the
# repo). The longest prefix wins. LICENSE and NOTICE directly in a prefix come from the repository's root (no
# chart folder ships its own; ../shared/charts/README.md "Licenses").
CHART_SOURCES: dict[str, tuple[tuple[str, str, str, str], ...]] = {
    "kube-prometheus-stack-88.5.3": (
        ("", "prometheus-community/helm-charts", "ea930baeebeba39f56d6b44e351f23b2a072a600",
         "charts/kube-prometheus-stack"),
        ("charts/kube-state-metrics", "prometheus-community/helm-charts", "1982f1c5828920f5d4ea5d04956169e81f8c5129",
         "charts/kube-state-metrics"),
        ("charts/prometheus-node-exporter", "prometheus-community/helm-charts",
         "8b8e639cac80a3001412f187060068978f649a55", "charts/prometheus-node-exporter"),
        ("charts/prometheus-windows-exporter", "prometheus-community/helm-charts",
         "43a82e944bf3ca3aab1703613ca5cf09851b23ec", "charts/prometheus-windows-exporter"),
        ("charts/grafana", "grafana-community/helm-charts", "864f7794683680e5100a38670e103c4fa6e37e29",
         "charts/grafana"),
    ),
}
for _pin in _TABLE:
    if _pin.kind == "chart" and _pin.name not in CHART_SOURCES:
        _repo, _, _rest = _pin.url.removeprefix("https://github.com/").partition("/tree/")
        _commit, _, _path = _rest.partition("/")
        CHART_SOURCES[_pin.name] = (("", _repo, _commit, _path),)


def pin(name: str) -> Pin:
    """The table's entry `name`; an unknown name is an error naming the table."""
    if name not in PINS:
        raise PinError(f"{name}: not a pinned artifact (pinned: {', '.join(PINS)}); "
                       "add it to the table in tools/pins.py")
    return PINS[name]


def of_kind(kind: str) -> list[Pin]:
    """Every pin of one kind, in table order."""
    return [p for p in _TABLE if p.kind == kind]


def kind_node_image() -> str:
    """The kind node image the workflow's cluster-kind job runs, by tag and digest."""
    p = pin("kindest/node")
    return f"{p.name}:{p.version}@sha256:{p.sha256}"


def chart_version(chart: str) -> str:
    """The pinned version of Helm chart `chart` (its name without the version), e.g. `kuberay-operator`."""
    found = [p.version for p in of_kind("chart") if p.name == f"{chart}-{p.version}"]
    if not found:
        raise PinError(f"no pinned Helm chart named {chart} in tools/pins.py")
    return found[0]


def mirror_root(repo_root: Path = REPO_ROOT, environ: Mapping[str, str] = os.environ) -> Path:
    """The local mirror: $PINS_MIRROR, else ../shared beside the repository."""
    return Path(environ[MIRROR_ENV]) if environ.get(MIRROR_ENV) else repo_root.parent / "shared"


def cache_root(repo_root: Path = REPO_ROOT) -> Path:
    """The repository's download cache."""
    return repo_root / ".cache" / "pins"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_listing(folder: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of every file under `folder`."""
    return {path.relative_to(folder).as_posix(): sha256_file(path) for path in folder.rglob("*") if path.is_file()}


def listing_digest(listing: Mapping[str, str]) -> str:
    """SHA-256 of a `sha256sum`-style listing: `<sha256>  <path>` lines sorted bytewise by path."""
    text = "".join(f"{listing[name]}  {name}\n" for name in sorted(listing, key=str.encode))
    return hashlib.sha256(text.encode()).hexdigest()


def tree_digest(folder: Path) -> str:
    """The digest a chart pin holds: what `grep '  <folder>/' SHA256SUMS | sed 's#  <folder>/#  #' | LC_ALL=C sort
    -k2 | sha256sum` gives from ../shared/charts/SHA256SUMS."""
    return listing_digest(tree_listing(folder))


def chart_files(name: str) -> dict[str, str]:
    """The pinned per-file listing of chart folder `name` (from tools/pins-charts.sha256sums)."""
    prefix = f"{name}/"
    files = {}
    for line in CHART_LISTING.read_text().splitlines():
        digest, _, path = line.partition("  ")
        if path.startswith(prefix):
            files[path[len(prefix):]] = digest
    return files


def verify(p: Pin, path: Path) -> None:
    """Raise PinMismatch unless `path` is pin `p`'s artifact."""
    actual = tree_digest(path) if p.kind == "chart" else sha256_file(path)
    if actual != p.sha256:
        what = "tree sha256" if p.kind == "chart" else "sha256"
        raise PinMismatch(f"{path}: not the pinned {p.name}: {what} expected {p.sha256}, got {actual}; "
                          "replace it with an exact copy of the upstream artifact, or delete it to have it fetched "
                          "again (nothing was cached)")


def _local(p: Pin, dirs: Sequence[Path], repo_root: Path, environ: Mapping[str, str]) -> list[Path]:
    leaf = Path(p.mirror).name
    return [*(d / leaf for d in dirs), mirror_root(repo_root, environ) / p.mirror, cache_root(repo_root) / leaf]


def locate(name: str, *, dirs: Sequence[Path] = (), repo_root: Path = REPO_ROOT,
           environ: Mapping[str, str] = os.environ) -> Path | None:
    """The first local copy of `name` (verified), or None when no local source holds it."""
    p = pin(name)
    for path in _local(p, dirs, repo_root, environ):
        if path.is_dir() if p.kind == "chart" else path.is_file():
            verify(p, path)
            return path
    return None


def fetch(name: str, *, dirs: Sequence[Path] = (), repo_root: Path = REPO_ROOT,
          environ: Mapping[str, str] = os.environ, url: str | None = None,
          timeout_s: float = DOWNLOAD_TIMEOUT_S) -> tuple[Path, str]:
    """The verified local path of artifact `name`, and where it came from (`local` or the URL it was downloaded
    from). `dirs` are looked in before the mirror; `url` replaces a file pin's download URL (a mirror of it)."""
    p = pin(name)
    if p.kind == "ci":
        raise PinError(f"{name} {p.version}: used only by the GitHub workflow's own actions (kind), never fetched "
                       "here (tools/pins.py `ci`)")
    found = locate(name, dirs=dirs, repo_root=repo_root, environ=environ)
    if found is not None:
        return found, "local"
    looked = ", ".join(str(x) for x in _local(p, dirs, repo_root, environ))
    if p.kind == "binary":
        raise PinUnavailable(
            f"{name} {p.version} not found (looked in {looked}). It is the team's own build, published nowhere: "
            f"build it from {p.url} as shared/k8s/README.md ('How it was built') and shared/k8s-node/README.md say, "
            f"and put {Path(p.mirror).name} (xz-compressed) in "
            f"{mirror_root(repo_root, environ) / Path(p.mirror).parent} "
            f"or set {MIRROR_ENV} to a folder laid out like ../shared. Upstream's release binaries of the same version "
            "have other digests and are refused.")
    target = cache_root(repo_root) / Path(p.mirror).name
    if p.kind == "file":
        source = url or p.url
        if not url and environ.get(GITHUB_RAW_ENV) and source.startswith(GITHUB_RAW):
            source = environ[GITHUB_RAW_ENV].rstrip("/") + source[len(GITHUB_RAW):]
        data = _download(source, name, looked, timeout_s)
        actual = hashlib.sha256(data).hexdigest()
        if actual != p.sha256:
            raise PinMismatch(f"{source}: {name} is not the pinned {name} {p.version}: sha256 expected {p.sha256}, got "
                              f"{actual}; the URL must serve the pinned release's file (nothing was cached)")
        write_atomic(target, data)
        return target, source
    base = (environ.get(GITHUB_RAW_ENV) or GITHUB_RAW).rstrip("/")
    _download_chart(p, target, base, looked, timeout_s)
    return target, f"{base} ({p.url})"


def chart_file_url(name: str, relpath: str, base: str = GITHUB_RAW) -> str:
    """Where file `relpath` of chart folder `name` is downloaded from (CHART_SOURCES)."""
    prefix, repo, commit, path = max((s for s in CHART_SOURCES[name]
                                      if not s[0] or relpath == s[0] or relpath.startswith(s[0] + "/")),
                                     key=lambda s: len(s[0]))
    inner = relpath[len(prefix):].lstrip("/")
    if inner in ("LICENSE", "NOTICE"):
        return f"{base}/{repo}/{commit}/{inner}"
    return f"{base}/{repo}/{commit}/{path}/{inner}"


def _download_chart(p: Pin, target: Path, base: str, looked: str, timeout_s: float) -> None:
    files = chart_files(p.name)
    if listing_digest(files) != p.sha256:
        raise PinMismatch(f"tools/pins-charts.sha256sums: the listing of {p.name} does not give its pinned tree "
                          f"digest {p.sha256}; the listing and the table disagree")

    def get(relpath: str) -> tuple[str, bytes]:
        source = chart_file_url(p.name, relpath, base)
        data = _download(source, p.name, looked, timeout_s)
        actual = hashlib.sha256(data).hexdigest()
        if actual != files[relpath]:
            raise PinMismatch(f"{source}: not file {relpath} of the pinned {p.name}: sha256 expected "
                              f"{files[relpath]}, got {actual} (nothing was cached)")
        return relpath, data

    with ThreadPoolExecutor(DOWNLOAD_THREADS) as pool:
        fetched = list(pool.map(get, sorted(files)))
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{p.name}.", dir=target.parent))
    try:
        for relpath, data in fetched:
            (staging / relpath).parent.mkdir(parents=True, exist_ok=True)
            (staging / relpath).write_bytes(data)
        verify(p, staging)
        # Renamed into place whole: a concurrent reader sees the complete folder or none.
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():
                raise
            verify(p, target)  # another process put it there first
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _download(url: str, name: str, looked: str, timeout_s: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.read()
    except (OSError, ValueError, http.client.HTTPException) as exc:  # URLError and HTTPError are OSErrors
        reason = exc if isinstance(exc, urllib.error.HTTPError) else getattr(exc, "reason", exc)
        raise PinUnavailable(
            f"{name} not found (looked in {looked}) and the download from {url} failed ({reason}). Run "
            f"`python -m tools.pins` where the URL can be reached, or set {MIRROR_ENV} to a folder laid out like "
            "../shared (charts/, kuberay/) that holds it") from None


def write_atomic(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def unpack(name: str, dest: Path, **kwargs) -> Path:
    """Binary pin `name` unpacked into `dest/name` (mode 755), checked against its unpacked SHA-256 where known."""
    p = pin(name)
    if p.kind != "binary":
        raise PinError(f"{name}: not a binary pin")
    source, _ = fetch(name, **kwargs)
    dest.mkdir(parents=True, exist_ok=True)
    with lzma.open(source) as xz:
        data = xz.read()
    if p.unpacked_sha256 and hashlib.sha256(data).hexdigest() != p.unpacked_sha256:
        raise PinMismatch(f"{source}: unpacks to a program whose sha256 is not {p.unpacked_sha256}")
    write_atomic(dest / name, data)
    os.chmod(dest / name, 0o755)
    return dest / name


def main(argv: Iterable[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tools.pins",
        description="Resolve the pinned upstream artifacts (Helm charts, KubeRay CRDs, the add-on schema): from the "
                    "local mirror (../shared or $PINS_MIRROR), the cache .cache/pins/, else downloaded; every copy "
                    "checked against its pinned SHA-256 (docs/pins.md).")
    parser.add_argument("names", nargs="*", help="only these pins (default: every chart and file)")
    parser.add_argument("--list", action="store_true", help="print the table (name, version, URL, SHA-256) and exit")
    parser.add_argument("--binaries", action="store_true",
                        help="also check the cluster test tiers' programs (mirror only: they are not downloadable)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.list:
        for p in _TABLE:
            print(f"{p.name}\t{p.version}\t{p.url}\t{p.sha256}")
        return 0
    kinds = ("chart", "file", "binary") if args.binaries else ("chart", "file")
    names = args.names or [p.name for p in _TABLE if p.kind in kinds]
    start = time.monotonic()
    for i, name in enumerate(names, 1):
        try:
            path, source = fetch(name)
        except PinError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        how = "verified" if source == "local" else f"downloaded from {source}, verified, cached"
        print(f"[{i}/{len(names)}] {name} {pin(name).version}: {how} ({path})", flush=True)
    print(f"{len(names)} pinned artifacts ready in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())  # not config.errors.run_cli: see PinError
