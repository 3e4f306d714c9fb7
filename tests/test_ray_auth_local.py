"""Ray token authentication end to end on a real local Ray head (loopback only; conftest `ray_head`,
`tests/ray_head.py`).

The head runs as KubeRay starts it with `authOptions.mode: token`: RAY_AUTH_MODE=token and the token in
RAY_AUTH_TOKEN. The generated `submit.sh` (from the code bundle of the default variable file) submits with
the token, stops with exit 2 and how to read the token without it, and a wrong token is refused by the
head. The dashboard's browser login (what the README's port-forward instructions rely on) exchanges the
token for a cookie.
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from charts import bundle, inputs
from tests.helpers import REPO
from tests.ray_head import cli_env

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)

@pytest.fixture(scope="module")
def submit_sh(tmp_path_factory) -> Path:
    from config import load_config

    file = REPO / "config" / "cluster.yaml"
    code = inputs(load_config(file), file).code
    path = tmp_path_factory.mktemp("bundle") / bundle.SUBMIT_SCRIPT
    path.write_text(code.data[bundle.SUBMIT_SCRIPT])
    return path


def _submit(script: Path, url: str, token: str | None) -> subprocess.CompletedProcess:
    # The token alone: submit.sh must set RAY_AUTH_MODE itself.
    env = {**cli_env(), bundle.DASHBOARD_ADDRESS_ENV: url}
    if token is not None:
        env["RAY_AUTH_TOKEN"] = token
    return subprocess.run(["bash", str(script), "--no-wait"], env=env, capture_output=True, text=True, timeout=120)


def test_submit_sh_submits_with_the_token(ray_head, submit_sh):
    result = _submit(submit_sh, ray_head.url, ray_head.token)
    assert result.returncode == 0, result.stderr
    assert "submitted successfully" in result.stdout + result.stderr


def test_submit_sh_without_a_token_says_how_to_read_it(ray_head, submit_sh):
    result = _submit(submit_sh, ray_head.url, None)
    assert result.returncode == 2
    assert "RAY_AUTH_TOKEN is not set" in result.stderr
    assert "kubectl get secret -n ray ray-efa -o jsonpath='{.data.auth_token}'" in result.stderr


def test_head_refuses_a_wrong_token(ray_head, submit_sh):
    result = _submit(submit_sh, ray_head.url, "not-the-token")
    assert result.returncode != 0
    assert "submitted successfully" not in result.stdout + result.stderr


def test_jobs_api_refuses_requests_without_the_token(ray_head):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{ray_head.url}/api/jobs/", timeout=10)
    assert refused.value.code == 401
    request = urllib.request.Request(f"{ray_head.url}/api/jobs/", headers={"Authorization": f"Bearer {ray_head.token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def test_dashboard_login_exchanges_the_token_for_a_cookie(ray_head):
    request = urllib.request.Request(f"{ray_head.url}/api/authenticate", method="POST", data=b"",
                                     headers={"Authorization": f"Bearer {ray_head.token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        assert "ray-authentication-token=" in response.headers.get("Set-Cookie", "")
