"""The RayJob submitter's `follow.sh` against a real local Ray head, through a proxy that drops the log stream.

The head has token auth, as the cluster runs with `ray.auth: token` (tests/ray_head.py), and every call carries
the token variables KubeRay sets in the submitter container then.

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

import re
import subprocess
import sys
from pathlib import Path

import pytest

from charts import bundle
from tests.loopback import DroppingProxy
from tests.ray_head import RAY as _RAY
from tests.ray_head import RayHead, cli_env
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

JOB = """\
import os, sys, time
for i in range(3):
    print(f"line {i}", flush=True)
deadline = time.monotonic() + 300
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.2)
print("done", flush=True)
"""


def _submit(head: RayHead, tmp_path: Path, submission_id: str) -> Path:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    release = tmp_path / "release"
    result = subprocess.run([str(_RAY), "job", "submit", "--address", head.url, "--no-wait", "--submission-id",
                             submission_id, "--", sys.executable, str(script), str(release)],
                            env=cli_env(head.token), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return release


def _status(head: RayHead, submission_id: str) -> str:
    out = subprocess.run([str(_RAY), "job", "status", "--address", head.url, submission_id], env=cli_env(head.token),
                         capture_output=True, text=True, timeout=60).stdout
    found = re.findall(r"(PENDING|RUNNING|STOPPED|SUCCEEDED|FAILED)", out)
    return found[-1] if found else ""


def test_a_dropped_stream_ends_ray_job_logs_while_the_job_runs(ray_head, tmp_path):
    """What KubeRay's default submitter command meets: the follow ends, with an error, mid-run."""
    release = _submit(ray_head, tmp_path, "follow-drop-plain")
    with DroppingProxy(ray_head.url, path_marker=b"/logs/tail", after=b"line 2") as proxy:
        result = subprocess.run([str(_RAY), "job", "logs", "--address", proxy.url, "--follow", "follow-drop-plain"],
                                env=cli_env(ray_head.token), capture_output=True, text=True, timeout=120)
        assert proxy.dropped == 1
    try:
        assert result.returncode != 0
        assert "line 2" in result.stdout and "done" not in result.stdout
        assert _status(ray_head, "follow-drop-plain") == "RUNNING"
    finally:
        release.touch()


def test_follow_sh_reattaches_and_ends_with_the_job(ray_head, tmp_path):
    release = _submit(ray_head, tmp_path, "follow-drop-sh")
    script = tmp_path / bundle.FOLLOW_SCRIPT
    script.write_text(bundle.follow_script())
    err = tmp_path / "follow.err"
    env = {**cli_env(ray_head.token), "RAY_DASHBOARD_ADDRESS": "", "RAY_JOB_SUBMISSION_ID": "follow-drop-sh"}
    with DroppingProxy(ray_head.url, path_marker=b"/logs/tail", after=b"line 2") as proxy:
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
                                f"{err.read_text()[-3000:]} (job status {_status(ray_head, 'follow-drop-sh')})")
            finally:
                if follow.poll() is None:
                    follow.kill()
        assert proxy.dropped == 1
    assert follow.returncode == 0, err.read_text()
    assert "log stream ended while the job is RUNNING; re-attaching" in err.read_text()
    assert "done" in out
    assert "follow.sh: job follow-drop-sh ended: SUCCEEDED" in out
