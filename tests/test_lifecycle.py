"""After the deploy and the next deploy (issue 17, point 6): kubectl access, teardown and redeploy over a
kept bucket, the image pin, and every `kubectl apply` the docs show working for the sizes in dist/."""

from __future__ import annotations

import re

import pytest

from config import ConfigError
from tests.helpers import REPO, load_variant
from tests.stack_synth import synth

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)


def _resources(variant: str, kind: str) -> dict[str, dict]:
    return {k: r for k, r in synth(variant).templates["storage"]["Resources"].items() if r["Type"] == kind}


# ---- kubectl access ------------------------------------------------------------------------------

def test_config_check_says_nobody_gets_kubectl_without_an_admin_role(capsys):
    from config.__main__ import main

    assert main(["check"]) == 0  # config/cluster.yaml ships admin_role_arn: null
    out = capsys.readouterr().out
    assert "warning: cluster.admin_role_arn is null: after the deploy no one can use kubectl" in out
    assert "aws eks create-access-entry --cluster-name ray-efa" in out
    assert "associate-access-policy" in out and "AmazonEKSClusterAdminPolicy" in out


def test_config_check_is_quiet_about_access_with_an_admin_role(tmp_path, capsys):
    from config.__main__ import main
    from tests.helpers import write_variant

    path = write_variant(tmp_path, {"cluster": {"admin_role_arn": "arn:aws:iam::123456789012:role/Admin"}})
    assert main(["check", str(path)]) == 0
    assert "admin_role_arn" not in capsys.readouterr().out


# ---- the image pin -------------------------------------------------------------------------------

TAG = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1.0"
PINNED = f"{TAG}@sha256:{'ab' * 32}"
MOVING = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"


def test_the_default_image_is_the_dlc_release_tag_and_gets_no_warning(capsys):
    from config.__main__ import main

    assert main(["check"]) == 0
    assert "can move" not in capsys.readouterr().out


def test_config_check_warns_about_a_moving_dlc_tag(tmp_path, capsys):
    from config.__main__ import main
    from tests.helpers import write_variant

    assert main(["check", str(write_variant(tmp_path, {"ray": {"image": MOVING}}))]) == 0
    out = capsys.readouterr().out
    assert f"warning: ray.image {MOVING} is a tag that can move" in out
    assert f"{MOVING}@sha256:<digest>" in out


def test_config_check_warns_about_another_publishers_tag(tmp_path, capsys):
    from config.__main__ import main
    from tests.helpers import write_variant

    assert main(["check", str(write_variant(tmp_path, {"ray": {"image": "rayproject/ray:2.58.0-py313-gpu"}}))]) == 0
    assert "warning: ray.image rayproject/ray:2.58.0-py313-gpu is a tag that can move" in capsys.readouterr().out


def test_a_tag_pinned_by_digest_gets_no_warning(tmp_path, capsys):
    from config.__main__ import main
    from tests.helpers import write_variant

    assert main(["check", str(write_variant(tmp_path, {"ray": {"image": f"{MOVING}@sha256:{'ab' * 32}"}}))]) == 0
    assert "can move" not in capsys.readouterr().out


def test_a_tag_pinned_by_digest_keeps_the_tags_ray_version(tmp_path):
    with pytest.raises(ConfigError, match=r"ray_version: 2\.57\.0 does not match the image, which ships Ray 2\.58"):
        load_variant(tmp_path, {"ray": {"image": PINNED, "ray_version": "2.57.0"}})


# ---- teardown and redeploy -----------------------------------------------------------------------

def test_a_kept_bucket_keeps_its_tls_only_policy():
    (policy,) = _resources("default", "AWS::S3::BucketPolicy").values()
    assert policy["DeletionPolicy"] == "Retain"
    (bucket,) = _resources("default", "AWS::S3::Bucket").values()
    assert bucket["DeletionPolicy"] == "Retain"


def test_a_destroyed_bucket_takes_its_policy_along():
    (policy,) = _resources("alt", "AWS::S3::BucketPolicy").values()
    assert policy.get("DeletionPolicy", "Delete") == "Delete"


def test_existing_bucket_is_not_created_again():
    # The "socket" variant sets storage.existing_bucket: true.
    assert synth("socket").config.storage.existing_bucket
    assert _resources("socket", "AWS::S3::Bucket") == {}


def _default_name_join() -> dict:
    (bucket,) = _resources("default", "AWS::S3::Bucket").values()
    return bucket["Properties"]["BucketName"]


def test_existing_bucket_is_used_by_the_name_the_first_deploy_gave_it():
    outputs = synth("socket").templates["storage"]["Outputs"]
    assert outputs["BucketName"]["Value"] == _default_name_join()


def test_existing_bucket_declares_no_second_bucket_policy():
    # The first deploy's TLS-only policy is retained with the bucket (test_a_kept_bucket_keeps_its_tls_only_policy);
    # a second AWS::S3::BucketPolicy for the same bucket fails the redeploy ("Bucket Policy Already Exists") and
    # rolls the storage stack back. `config check --online` verifies the kept one (tests/test_config_online.py).
    assert _resources("socket", "AWS::S3::BucketPolicy") == {}


def test_existing_bucket_grants_the_pod_role_the_same_prefix():
    policies = _resources("socket", "AWS::IAM::Policy")
    text = repr([p["Properties"]["PolicyDocument"] for p in policies.values()])
    prefix = synth("socket").config.storage.prefix
    assert "ObjectsUnderPrefix" in text and f"/{prefix}/*" in text


def test_existing_bucket_cannot_be_destroyed_by_the_stack(tmp_path):
    with pytest.raises(ConfigError, match=r"storage: existing_bucket: true with removal_policy: destroy"):
        load_variant(tmp_path, {"storage": {"existing_bucket": True, "removal_policy": "destroy"}})


# ---- kubectl apply as the docs show it -----------------------------------------------------------

# kubectl's client-side apply stores the whole object in the last-applied-configuration annotation,
# and the API server refuses annotations over 256 KiB in all (apimachinery's TotalAnnotationSizeLimitB);
# the code ConfigMap alone is larger (docs/lifecycle.md), so only server-side apply works.
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("workloads/**/*.sh")),
        *sorted(REPO.glob("scripts/**/*")), REPO / "Makefile"]


def _apply_lines() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        if path.is_file():
            for line in path.read_text().splitlines():
                if re.search(r"kubectl\s+apply", line):
                    found.append((path.name, line.strip()))
    return found


def test_the_docs_show_kubectl_apply():
    assert len(_apply_lines()) >= 4


def test_every_kubectl_apply_shown_is_server_side():
    # Prose that names the step (`kubectl apply` in backticks, the diagram's label) counts too.
    client_side = [(f, line) for f, line in _apply_lines() if "--server-side" not in line]
    assert client_side == []

