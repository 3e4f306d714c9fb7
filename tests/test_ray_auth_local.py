"""Ray token authentication end to end on a real local Ray head (loopback only).

The head runs as KubeRay starts it with `authOptions.mode: token`: RAY_AUTH_MODE=token and the token in
RAY_AUTH_TOKEN. The generated `submit.sh` (from the code bundle of the default variable file) submits with
the token, stops with exit 2 and how to read the token without it, and a wrong token is refused by the
head. The dashboard's browser login (what the README's port-forward instructions rely on) exchanges the
token for a cookie.
"""

from __future__ import annotations

import os
import random
import re
import secrets
import shutil
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
from tests.waiting import kill_session

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)

_RAY = Path(sys.executable).with_name("ray")
# Every port the head binds is 0 (the process binds whatever is free and reports it), except the Ray Client
# server's: `ray start` refuses 0 there and would otherwise take 10001, which another head on this machine may
# hold (ray 2.58.0 ray/_private/parameter.py: RayParams._check_usage wants 1024-65535; scripts/scripts.py: start
# defaults it to 10001 when grpc is installed). That one is drawn below the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range), where neither port-0 binds nor outgoing connections land; should
# another process hold it, the head exits (`--block` stops every process when one dies) and is started again
# on another, at most `_STARTS` times. The head is ready once its client server listens and its dashboard
# (whose port `ray start` prints) answers.
_ZERO_PORT_FLAGS = ("--port", "--dashboard-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                    "--metrics-export-port", "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port")
_STARTS = 3
_DASHBOARD = re.compile(r"RAY_API_SERVER_ADDRESS='(http://127\.0\.0\.1:\d+)'")


def _client_port() -> int:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return random.randrange(max(1024, low - 12000), low)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _ready_url(log: Path, proc: subprocess.Popen, client_port: int, deadline: float) -> str | None:
    """The dashboard's URL once the head is ready (above), None if it exited or the deadline passed."""
    url = None
    while time.monotonic() < deadline and proc.poll() is None:
        if url is None:
            found = _DASHBOARD.search(log.read_text(errors="replace"))
            url = found and found.group(1)
        if url is not None and _listening(client_port):
            try:
                with urllib.request.urlopen(f"{url}/api/authentication_mode", timeout=2) as response:
                    if response.status == 200 and proc.poll() is None:
                        return url
            except (urllib.error.URLError, OSError):
                pass
        time.sleep(0.5)  # polling interval of a bounded wait on a condition
    return None


@pytest.fixture(scope="module")
def head():
    """A Ray head with token auth on loopback ports it chose, in its own process group (killed by its id)."""
    token = secrets.token_urlsafe(32)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0"}
    for attempt in range(1, _STARTS + 1):
        temp = Path(tempfile.mkdtemp(prefix="rayauth", dir="/tmp"))  # short: Ray's unix sockets live here
        client_port = _client_port()
        args = [str(_RAY), "start", "--head", "--block", "--num-cpus=1", "--node-ip-address=127.0.0.1",
                "--dashboard-host=127.0.0.1", "--include-dashboard=true", f"--temp-dir={temp}",
                *(f"{flag}=0" for flag in _ZERO_PORT_FLAGS), f"--ray-client-server-port={client_port}"]
        log = temp / "ray-start.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = _ready_url(log, proc, client_port, time.monotonic() + 240)
            if url is not None:
                yield {"url": url, "token": token}
                return
            if proc.poll() is None or attempt == _STARTS:
                pytest.fail(f"Ray head did not start (attempt {attempt}, exit {proc.poll()}): "
                            f"{log.read_text(errors='replace')[-3000:]}")
        finally:
            kill_session(proc)
            shutil.rmtree(temp, ignore_errors=True)


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
