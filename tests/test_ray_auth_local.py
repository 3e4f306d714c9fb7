"""Ray token authentication end to end on a real local Ray head (loopback only).

The head runs as KubeRay starts it with `authOptions.mode: token`: RAY_AUTH_MODE=token and the token in
RAY_AUTH_TOKEN. The generated `submit.sh` (from the code bundle of the default variable file) submits with
the token, stops with exit 2 and how to read the token without it, and a wrong token is refused by the
head. The dashboard's browser login (what the README's port-forward instructions rely on) exchanges the
token for a cookie.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from charts import bundle, inputs
from tests.helpers import REPO

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)

_RAY = Path(sys.executable).with_name("ray")
_PORT_FLAGS = ("--port", "--dashboard-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
               "--metrics-export-port", "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port",
               "--ray-client-server-port")


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _ready(url: str, proc: subprocess.Popen, deadline: float) -> bool:
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/api/authentication_mode", timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    return False


@pytest.fixture(scope="module")
def head():
    """A Ray head with token auth on free loopback ports, in its own process group (killed by its id)."""
    token = secrets.token_urlsafe(32)
    temp = Path(tempfile.mkdtemp(prefix="rayauth", dir="/tmp"))  # short: Ray's unix sockets live here
    ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS)), strict=True))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0"}
    args = [str(_RAY), "start", "--head", "--block", "--num-cpus=1", "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1", "--include-dashboard=true", f"--temp-dir={temp}",
            *(f"{flag}={port}" for flag, port in ports.items())]
    log = temp / "ray-start.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{ports['--dashboard-port']}"
    try:
        if not _ready(url, proc, time.monotonic() + 240):
            pytest.fail(f"Ray head did not start (exit {proc.poll()}): {log.read_text(errors='replace')[-3000:]}")
        yield {"url": url, "token": token}
    finally:
        _stop(proc)
        shutil.rmtree(temp, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    """End the head's process group (the session `ray start` led), SIGKILL after 5 s."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


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
