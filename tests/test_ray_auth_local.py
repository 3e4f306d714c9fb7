"""Ray token authentication end to end on a real local Ray head (loopback only; `tests/ray_head.py`).

The head runs as KubeRay starts it with `authOptions.mode: token`: RAY_AUTH_MODE=token and the token in
RAY_AUTH_TOKEN. The generated `submit.sh` (from the code bundle of the default variable file) submits with
the token, stops with exit 2 and how to read the token without it, and a wrong token is refused by the
head. The dashboard's browser login (what the README's port-forward instructions rely on) exchanges the
token for a cookie.
"""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from charts import bundle, inputs
from tests.helpers import REPO
from tests.ray_head import RAY as _RAY

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)

@pytest.fixture(scope="module")
def head(ray_head):
    """The session's Ray head with token auth (conftest `ray_head`, started as KubeRay starts it)."""
    return {"url": ray_head.url, "token": ray_head.token}


@pytest.fixture(scope="module")
def submit_sh(tmp_path_factory) -> Path:
    from config import load_config

    file = REPO / "config" / "cluster.yaml"
    code = inputs(load_config(file), file).code
    path = tmp_path_factory.mktemp("bundle") / bundle.SUBMIT_SCRIPT
    path.write_text(code.data[bundle.SUBMIT_SCRIPT])
    return path


def _submit(script: Path, url: str, token: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update({bundle.DASHBOARD_ADDRESS_ENV: url, "PATH": f"{_RAY.parent}{os.pathsep}{env.get('PATH', '')}"})
    if token is not None:
        env["RAY_AUTH_TOKEN"] = token
    return subprocess.run(["bash", str(script), "--no-wait"], env=env, capture_output=True, text=True, timeout=120)


def test_submit_sh_submits_with_the_token(head, submit_sh):
    result = _submit(submit_sh, head["url"], head["token"])
    assert result.returncode == 0, result.stderr
    assert "submitted successfully" in result.stdout + result.stderr


def test_submit_sh_without_a_token_says_how_to_read_it(head, submit_sh):
    result = _submit(submit_sh, head["url"], None)
    assert result.returncode == 2
    assert "RAY_AUTH_TOKEN is not set" in result.stderr
    assert "kubectl get secret -n ray ray-efa -o jsonpath='{.data.auth_token}'" in result.stderr


def test_head_refuses_a_wrong_token(head, submit_sh):
    result = _submit(submit_sh, head["url"], "not-the-token")
    assert result.returncode != 0
    assert "submitted successfully" not in result.stdout + result.stderr


def test_jobs_api_refuses_requests_without_the_token(head):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{head['url']}/api/jobs/", timeout=10)
    assert refused.value.code == 401
    request = urllib.request.Request(f"{head['url']}/api/jobs/", headers={"Authorization": f"Bearer {head['token']}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def test_dashboard_login_exchanges_the_token_for_a_cookie(head):
    request = urllib.request.Request(f"{head['url']}/api/authenticate", method="POST", data=b"",
                                     headers={"Authorization": f"Bearer {head['token']}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        assert "ray-authentication-token=" in response.headers.get("Set-Cookie", "")
