"""The RayJob submitter's `follow.sh` against a real local Ray head, through a proxy that drops the log stream.

KubeRay 1.7.0's default K8sJobMode command follows the driver with `ray job logs --follow` under `bash -e`
(common/job.go `BuildJobSubmitCommand`); when that stream drops mid-run the command fails, the submitter Job
ends and the controller fails a healthy RayJob (rayjob_controller.go
`checkSubmitterFinishedTimeoutAndUpdateStatusIfNeeded`). The first test shows the drop ending `ray job logs`
while the job still runs (Ray 2.58.0 `JobSubmissionClient.tail_job_logs` raises on an abnormal WebSocket close,
dashboard/modules/job/sdk.py); the second shows the generated `follow.sh` re-attaching and ending only with the
job, with its final status.

The job blocks on a file the test creates, so every observation happens while it is known to be running.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from charts import bundle
from tests.loopback import DroppingProxy
from tests.waiting import kill_session, wait_for

pytestmark = pytest.mark.slow

_RAY = Path(sys.executable).with_name("ray")
HEAD_START_S = 240
JOB = """\
import os, sys, time
for i in range(3):
    print(f"line {i}", flush=True)
deadline = time.monotonic() + 300
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.2)
print("done", flush=True)
"""


def _env() -> dict[str, str]:
    # The dashboard starts each module in a subprocess and gives up on one not ready in 30 s
    # (ray 2.58.0 dashboard/consts.py SUBPROCESS_MODULE_WAIT_READY_TIMEOUT): a cold import on two busy cores
    # can take longer, and then the head never serves the Jobs API.
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT": "180",
            "PATH": f"{_RAY.parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.fixture(scope="module")
def head():
    """A Ray head with its dashboard (the Jobs API) on ports the kernel picks (0: GCS, the dashboard, the agent's
    HTTP server; ray 2.58.0 dashboard/http_server_head.py reads the bound port back), so concurrent heads never
    collide; the dashboard's address is read from `ray start`'s own banner.

    Not `--block`: that ends the head when any child exits, and the Ray Client server (which these tests do not
    use, and which cannot be turned off: `--ray-client-server-port` must be 1024-65535, parameter.py) gives up
    after 30 s without node info on a busy machine (services.py `get_node_with_retry`). `ray start` returns once
    the head is up; its processes stay in the new session's process group, which teardown kills."""
    temp = Path(tempfile.mkdtemp(prefix="rayfollow", dir="/tmp"))  # short: Ray's unix sockets live here
    args = [str(_RAY), "start", "--head", "--num-cpus=1", "--node-ip-address=127.0.0.1", "--port=0",
            "--dashboard-port=0", "--dashboard-agent-listen-port=0", "--dashboard-host=127.0.0.1",
            "--include-dashboard=true", f"--temp-dir={temp}"]
    proc = subprocess.Popen(args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        banner, _ = proc.communicate(timeout=HEAD_START_S)
        assert proc.returncode == 0, f"ray start exited {proc.returncode}: {banner[-3000:]}"
        found = re.search(r"view the dashboard at.*?(127\.0\.0\.1:\d+)", banner, re.DOTALL)
        assert found, f"no dashboard address in ray start's output: {banner[-3000:]}"
        address = f"http://{found.group(1)}"

        def answers():
            try:
                with urllib.request.urlopen(f"{address}/api/version", timeout=2) as response:
                    return response.status == 200
            except (urllib.error.URLError, OSError):
                return False

        wait_for(answers, HEAD_START_S, "the Jobs API", interval_s=0.2)
        yield address
    finally:
        kill_session(proc)
        shutil.rmtree(temp, ignore_errors=True)


def _submit(head: str, tmp_path: Path, submission_id: str) -> Path:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    release = tmp_path / "release"
    result = subprocess.run([str(_RAY), "job", "submit", "--address", head, "--no-wait", "--submission-id",
                             submission_id, "--", sys.executable, str(script), str(release)],
                            env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return release


def _status(head: str, submission_id: str) -> str:
    out = subprocess.run([str(_RAY), "job", "status", "--address", head, submission_id], env=_env(),
                         capture_output=True, text=True, timeout=60).stdout
    found = re.findall(r"(PENDING|RUNNING|STOPPED|SUCCEEDED|FAILED)", out)
    return found[-1] if found else ""


def test_a_dropped_stream_ends_ray_job_logs_while_the_job_runs(head, tmp_path):
    """What KubeRay's default submitter command meets: the follow ends, with an error, mid-run."""
    release = _submit(head, tmp_path, "follow-drop-plain")
    with DroppingProxy(head, path_marker=b"/logs/tail", after=b"line 2") as proxy:
        result = subprocess.run([str(_RAY), "job", "logs", "--address", proxy.url, "--follow", "follow-drop-plain"],
                                env=_env(), capture_output=True, text=True, timeout=120)
        assert proxy.dropped == 1
    try:
        assert result.returncode != 0
        assert "line 2" in result.stdout and "done" not in result.stdout
        assert _status(head, "follow-drop-plain") == "RUNNING"
    finally:
        release.touch()


def test_follow_sh_reattaches_and_ends_with_the_job(head, tmp_path):
    release = _submit(head, tmp_path, "follow-drop-sh")
    script = tmp_path / bundle.FOLLOW_SCRIPT
    script.write_text(bundle.follow_script())
    err = tmp_path / "follow.err"
    env = {**_env(), "RAY_DASHBOARD_ADDRESS": "", "RAY_JOB_SUBMISSION_ID": "follow-drop-sh"}
    with DroppingProxy(head, path_marker=b"/logs/tail", after=b"line 2") as proxy:
        env["RAY_DASHBOARD_ADDRESS"] = proxy.url.removeprefix("http://")  # KubeRay sets host:port
        with err.open("w") as stderr:
            follow = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
            try:
                wait_for(lambda: "re-attaching" in err.read_text(), 120, "follow.sh to see the stream drop")
                assert follow.poll() is None  # still following the running job
                release.touch()
                try:
                    out, _ = follow.communicate(timeout=180)
                except subprocess.TimeoutExpired as exc:
                    pytest.fail(f"follow.sh still running 180 s after the job was released: {exc.stdout!r} "
                                f"{err.read_text()[-3000:]} (job status {_status(head, 'follow-drop-sh')})")
            finally:
                if follow.poll() is None:
                    follow.kill()
        assert proxy.dropped == 1
    assert follow.returncode == 0, err.read_text()
    assert "log stream ended while the job is RUNNING; re-attaching" in err.read_text()
    assert "done" in out
    assert "follow.sh: job follow-drop-sh ended: SUCCEEDED" in out
