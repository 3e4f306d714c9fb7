"""A real Ray head with its dashboard (the Jobs API) and token authentication, on loopback, for the tests.

It runs as KubeRay starts the head of a cluster with `ray.auth: token` (`authOptions.mode: token`): RAY_AUTH_MODE=token
and the token in RAY_AUTH_TOKEN. One head serves the session's modules that need the Jobs API
(tests/test_ray_auth_local.py: submit.sh and the dashboard login; tests/test_follow.py: the RayJob submitter's
follow.sh), which `tests/conftest.py` keeps in one process: a head with its dashboard costs about 10 s on two
cores to start.

Every port the head binds is 0 (the kernel picks; ray 2.58.0 dashboard/http_server_head.py reads the bound port
back), so concurrent heads never collide; the dashboard's address is read from `ray start`'s own banner.

Not `--block`: that ends the head when any child exits, and the Ray Client server (which these tests do not use,
and which cannot be turned off: `--ray-client-server-port` must be 1024-65535, ray/_private/parameter.py) gives up
after 30 s without node info on a busy machine (services.py `get_node_with_retry`), or cannot bind its default
10001 where another head holds it. `ray start` returns once the head is up; its processes stay in the new
session's process group, which `stop` kills.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from harness.waiting import kill_session, wait_for
from workloads.local_ray import LOOPBACK_ENV

RAY = Path(sys.executable).with_name("ray")
START_S = 240  # `ray start` and the dashboard's modules on a loaded two-core machine
SLOW_START_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # The dashboard gives up on a module not ready in 30 s (ray 2.58.0 dashboard/consts.py
    # SUBPROCESS_MODULE_WAIT_READY_TIMEOUT): a cold import on two busy cores can take longer.
    "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT": "180",
    # And `ray start` gives up on a dashboard that has not published its URL in 60 s (ray 2.58.0
    # _private/ray_constants.py RAY_DASHBOARD_STARTUP_TIMEOUT_S, read in services.py start_api_server): it must
    # outwait the module wait above, or a slow module start still fails the head (seen in CI at 2 cores).
    "RAY_DASHBOARD_STARTUP_TIMEOUT_S": "220",
}
"""The Ray start-up limits of the test heads, raised for a loaded two-core machine."""


def cli_env(token: str | None = None) -> dict[str, str]:
    """The environment of the Ray CLI (and `ray start`): the venv's `ray` first on PATH; with `token`, the token
    variables KubeRay sets in the head and submitter containers with `ray.auth: token`; without, none of them.

    The dashboard starts each module in a subprocess and gives up on one not ready in 30 s (ray 2.58.0
    dashboard/consts.py SUBPROCESS_MODULE_WAIT_READY_TIMEOUT): a cold import on two busy cores can take longer,
    and then the head never serves the Jobs API."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update({**SLOW_START_ENV, "PATH": f"{RAY.parent}{os.pathsep}{env.get('PATH', '')}", **LOOPBACK_ENV})
    if token is not None:
        env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    return env


@dataclass
class RayHead:
    url: str
    """The dashboard (Jobs API), http://127.0.0.1:PORT."""
    token: str
    """The cluster's token: every Jobs API request needs it."""
    proc: subprocess.Popen
    temp: Path

    def stop(self) -> None:
        kill_session(self.proc)
        shutil.rmtree(self.temp, ignore_errors=True)


def start(token: str | None = None) -> RayHead:
    """A head with token auth, ready once its dashboard answers; `stop()` it (AssertionError if it never starts).

    `token`: the cluster's token (default: a new one); a head started with another head's token plays the head
    KubeRay recreates after losing the first (the token Secret outlives the head pod)."""
    token = token or secrets.token_urlsafe(32)
    temp = Path(tempfile.mkdtemp(prefix="rayhead", dir="/tmp"))  # short: Ray's unix sockets live here
    args = [str(RAY), "start", "--head", "--num-cpus=1", "--node-ip-address=127.0.0.1", "--port=0",
            "--dashboard-port=0", "--dashboard-agent-listen-port=0", "--dashboard-host=127.0.0.1",
            "--include-dashboard=true", f"--temp-dir={temp}"]
    proc = subprocess.Popen(args, env=cli_env(token), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    head = RayHead("", token, proc, temp)
    try:
        banner, _ = proc.communicate(timeout=START_S)
        assert proc.returncode == 0, f"ray start exited {proc.returncode}: {banner[-3000:]}"
        found = re.search(r"view the dashboard at.*?(127\.0\.0\.1:\d+)", banner, re.DOTALL)
        assert found, f"no dashboard address in ray start's output: {banner[-3000:]}"
        head.url = f"http://{found.group(1)}"

        def answers() -> bool:
            # Open without the token (the dashboard's login page asks it), so it shows the server is up.
            try:
                with urllib.request.urlopen(f"{head.url}/api/authentication_mode", timeout=2) as response:
                    return response.status == 200
            except (urllib.error.URLError, OSError):
                return False

        wait_for(answers, START_S, "the Ray head's Jobs API", interval_s=0.2)
        return head
    except BaseException:
        head.stop()
        raise
