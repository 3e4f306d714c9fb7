"""`make checkov`'s CloudFormation scan inside `make test`: checkov (its own venv, requirements-checkov.txt) over every
synthesized template of every variant finds nothing unacknowledged, and every acknowledgment carries its reason.

Of checkov's EKS cluster checks only CKV_AWS_58 (secrets encryption) exists for CloudFormation: CKV_AWS_37
(control-plane logging), CKV_AWS_38 (public endpoint CIDRs) and CKV_AWS_39 (public endpoint) are Terraform-only, their
CloudFormation files empty but for "CloudFormation does not currently support" (checkov 3.3.30,
checkov/cloudformation/checks/resource/aws/EKSControlPlaneLogging.py, EKSPublicAccess.py, EKSPublicAccessCIDR.py).
The project's own nag rules (stacks/nag.py, tests/test_nag_rules.py) check all three in synthesis.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.helpers import REPO
from tests.stack_synth import VARIANTS, synth

pytestmark = pytest.mark.slow  # checkov in a child process (about 15 s on the 2-core machine)

CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    if not CHECKOV.exists():
        pytest.skip(f"{CHECKOV} missing: `make test` builds it (make .venv-checkov/.installed)")
    folder = tmp_path_factory.mktemp("checkov")
    for variant in VARIANTS:
        for path in synth(variant).template_files:
            shutil.copy(path, folder / f"{variant}-{path.name}")
    result = subprocess.run([str(CHECKOV), "--compact", "--skip-download", "--framework", "cloudformation",
                             "-d", str(folder), "-o", "json"], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode in (0, 1), result.stderr[-2000:]
    out = json.loads(result.stdout)
    (cfn,) = out if isinstance(out, list) else [out]
    return cfn


def test_no_unacknowledged_finding(report):
    failed = [(f["check_id"], f["resource"], f["file_path"]) for f in report["results"]["failed_checks"]]
    assert failed == []
    assert report["summary"]["passed"] > 100


def test_the_eks_secrets_check_ran_and_passed_on_every_variant(report):
    passed = [f["file_path"] for f in report["results"]["passed_checks"] if f["check_id"] == "CKV_AWS_58"]
    assert len(passed) == len(VARIANTS)


def test_every_acknowledgment_says_why(report):
    skipped = report["results"].get("skipped_checks", [])
    assert skipped
    for check in skipped:
        reason = (check.get("check_result") or {}).get("suppress_comment", "")
        assert len(reason) > 40, (check["check_id"], check["resource"], reason)


# ---- the Kubernetes side of `make checkov`: dist/ with the Ray pods as Pods (ops/scan.py) ----------------------

@pytest.fixture(scope="module")
def k8s_report(tmp_path_factory) -> dict:
    if not CHECKOV.exists():
        pytest.skip(f"{CHECKOV} missing: `make test` builds it (make .venv-checkov/.installed)")
    from charts import build_app, inputs
    from config import DEFAULT_FILE, load_config
    from ops.scan import main as scan

    root = tmp_path_factory.mktemp("checkov-k8s")
    build_app(inputs(load_config(DEFAULT_FILE), DEFAULT_FILE), outdir=str(root / "dist")).synth()
    assert scan([str(root / "dist"), str(root / "scan")]) == 0
    result = subprocess.run([str(CHECKOV), "--compact", "--skip-download", "--framework", "kubernetes",
                             "-d", str(root / "scan"), "-o", "json"], capture_output=True, text=True,
                            timeout=TIMEOUT_S)
    assert result.returncode in (0, 1), result.stderr[-2000:]
    out = json.loads(result.stdout)
    (k8s,) = out if isinstance(out, list) else [out]
    return k8s


def test_the_manifests_and_ray_pods_have_no_unacknowledged_finding(k8s_report):
    failed = [(f["check_id"], f["resource"]) for f in k8s_report["results"]["failed_checks"]]
    assert failed == []
    assert k8s_report["summary"]["passed"] > 100


def test_every_kubernetes_acknowledgment_says_why(k8s_report):
    skipped = k8s_report["results"].get("skipped_checks", [])
    assert skipped
    for check in skipped:
        reason = (check.get("check_result") or {}).get("suppress_comment", "")
        assert len(reason) > 20, (check["check_id"], check["resource"], reason)
