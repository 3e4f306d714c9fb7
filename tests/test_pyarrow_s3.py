"""pyarrow's S3 filesystem takes Pod Identity credentials, in the pinned pyarrow and the oldest the image could carry.

Each interpreter runs tests/pyarrow_s3_probe.py with nothing but the credential endpoint in its
environment (harness/loopback.py), against moto's server with auth enforced. The oldest (24.0.0, from
aws/deep-learning-containers docker/ray-train/uv.lock at e0ecedea6a) lives in `.venv-pyarrow-oldest`
(`make pyarrow-oldest`); see requirements.txt for why the image's own pin is not known.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.loopback import PodIdentityEndpoint, s3_policy
from tests.helpers import REPO

pytestmark = pytest.mark.slow  # pyarrow in child processes against moto: `make check` leaves it out

OLDEST = REPO / ".venv-pyarrow-oldest" / "bin" / "python"


def _interpreters():
    yield pytest.param(sys.executable, "26.0.1", id="pinned")
    yield pytest.param(str(OLDEST), "24.0.0", id="oldest", marks=pytest.mark.skipif(
        not OLDEST.exists(), reason="no .venv-pyarrow-oldest: run `make pyarrow-oldest`"))


@pytest.fixture(scope="module")
def endpoint(moto_server):
    bucket = moto_server.create_bucket("pyarrow-versions")
    role = moto_server.create_role("pyarrow-pod", s3_policy(bucket))
    with PodIdentityEndpoint(lambda: moto_server.assume_role(role), moto_server.account_id) as ep:
        yield ep, bucket


@pytest.mark.parametrize(("python", "version"), list(_interpreters()))
def test_pyarrow_writes_and_reads_s3_with_pod_identity_only(endpoint, moto_server, python, version):
    ep, bucket = endpoint
    before = len(ep.calls)
    env = ep.exclusive_env(moto_server.endpoint_url, base={"PATH": "/usr/bin:/bin"})
    uri = f"s3://{bucket}/probe-{version}"
    done = subprocess.run([python, str(REPO / "tests" / "pyarrow_s3_probe.py"), uri], env=env,
                          capture_output=True, text=True, timeout=120)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"pyarrow": version, "ok": True, "error": ""}, done.stderr[-2000:]
    assert ep.calls[before:] and set(ep.calls[before:]) == {ep.token}
    assert moto_server.client("s3").get_object(Bucket=bucket, Key=f"probe-{version}")["Body"].read() == b"probe"
