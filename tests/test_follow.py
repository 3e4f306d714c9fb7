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

import contextlib
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from charts import bundle
from harness.loopback import DroppingProxy
from harness.waiting import wait_for
from tests.ray_head import RAY as _RAY
from tests.ray_head import RayHead, cli_env

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


class SwitchingProxy:
    """A TCP relay on 127.0.0.1 (port 0) to an upstream the test can change: the head Service's DNS name, which
    points at whichever head pod KubeRay runs. `point_at(None)` refuses connections (no head: no endpoint) and
    closes the open ones, as the head pod's end does."""

    def __init__(self, upstream: str | None):
        self._lock = threading.Lock()
        self._sockets: list = []
        self._upstream = None
        self.point_at(upstream)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True, name="switching-proxy").start()

    def point_at(self, upstream: str | None) -> None:
        with self._lock:
            if upstream is None:
                self._upstream = None
            else:
                host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
                self._upstream = (host, int(port))
            for sock in self._sockets:
                # shutdown first: close() alone does not wake a thread blocked in recv() on Linux, so the
                # relay kept the client's connection open and `ray job logs --follow` never saw the head go.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
            self._sockets.clear()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        self.point_at(None)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                upstream = self._upstream
            if upstream is None:
                client.close()
                continue
            try:
                server = socket.create_connection(upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.close()


RESUMABLE_JOB = """\
import os, sys, time
marker = sys.argv[1] + ".starts"
with open(marker, "a") as f:
    f.write("start\\n")
starts = open(marker).read().count("start")
print(f"attempt {starts}", flush=True)
deadline = time.monotonic() + 300
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.2)
print(f"done after {starts} start(s)", flush=True)
"""


def test_follow_sh_resubmits_when_a_new_head_has_no_record_of_the_job(ray_head, tmp_path):
    """The head pod lost mid-run: the new head's Jobs API answers 404 for the id; follow.sh submits it again
    (the same id, through submit.sh), follows the new attempt and ends with its status.

    The first head is a real one started for this test with the session head's token; it is killed (its whole
    process group, as the head pod's end kills every Ray process in it) while the job runs. The session head
    then plays the head KubeRay recreates: same token (the Secret outlives the pod), no record of the job."""
    from tests import ray_head as heads

    script = tmp_path / "job.py"
    script.write_text(RESUMABLE_JOB)
    release = tmp_path / "release"
    # The stand-in for the bundle's submit.sh beside follow.sh (the product's is tested in test_ray_auth_local):
    # the same contract, `RAY_JOB_ADDRESS=... submit.sh --no-wait --submission-id ID`, submitting this job.
    (tmp_path / bundle.SUBMIT_SCRIPT).write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        f'exec ray job submit --address "$RAY_JOB_ADDRESS" "$@" -- {sys.executable} {script} {release}\n')
    follow_sh = tmp_path / bundle.FOLLOW_SCRIPT
    follow_sh.write_text(bundle.follow_script())
    first = heads.start(token=ray_head.token)
    proxy = SwitchingProxy(first.url)
    err = tmp_path / "follow.err"
    env = {**cli_env(ray_head.token), "RAY_DASHBOARD_ADDRESS": proxy.url.removeprefix("http://"),
           "RAY_JOB_SUBMISSION_ID": "follow-head-lost"}
    follow = None
    try:
        with err.open("w") as stderr:
            follow = subprocess.Popen(["bash", str(follow_sh)], env=env, stdout=subprocess.PIPE, stderr=stderr,
                                      text=True)
            wait_for(lambda: _status(first, "follow-head-lost") == "RUNNING", 180, "the first attempt to run")
            wait_for(lambda: Path(f"{release}.starts").exists(), 120, "the first attempt's driver")
            proxy.point_at(None)  # the head Service has no endpoint while the pod is gone
            first.stop()
            wait_for(lambda: "unreachable; re-attaching" in err.read_text(), 120,
                     "follow.sh to find the Jobs API gone", detail=lambda: err.read_text()[-2000:])
            assert follow.poll() is None
            proxy.point_at(ray_head.url)  # the recreated head: no record of the job
            wait_for(lambda: _status(ray_head, "follow-head-lost") == "RUNNING", 240,
                     "follow.sh to resubmit on the new head", detail=lambda: err.read_text()[-2000:])
            release.touch()
            try:
                out, _ = follow.communicate(timeout=180)
            except subprocess.TimeoutExpired as exc:
                pytest.fail(f"follow.sh still running 180 s after the job was released: {exc.stdout!r} "
                            f"{err.read_text()[-3000:]}")
    finally:
        if follow is not None and follow.poll() is None:
            follow.kill()
        proxy.close()
        first.stop()
    log = err.read_text()
    assert follow.returncode == 0, log
    assert "the Jobs API has no job follow-head-lost (a new head: the old one was lost); resubmitting (1)" in log
    assert Path(f"{release}.starts").read_text().count("start") == 2
    assert "attempt 2" in out and "done after 2 start(s)" in out
    assert "follow.sh: job follow-head-lost ended: SUCCEEDED" in out


def test_follow_sh_waits_for_the_jobs_api_before_submitting(ray_head, tmp_path):
    """No dashboard yet (the proxy refuses, as a head Service without a ready endpoint does): follow.sh waits,
    then submits once the Jobs API answers, and follows the job to its end."""
    script = tmp_path / "job.py"
    script.write_text(RESUMABLE_JOB)
    release = tmp_path / "release"
    release.touch()  # the job ends as soon as it starts
    (tmp_path / bundle.SUBMIT_SCRIPT).write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        f'exec ray job submit --address "$RAY_JOB_ADDRESS" "$@" -- {sys.executable} {script} {release}\n')
    follow_sh = tmp_path / bundle.FOLLOW_SCRIPT
    follow_sh.write_text(bundle.follow_script())
    proxy = SwitchingProxy(None)
    env = {**cli_env(ray_head.token), "RAY_DASHBOARD_ADDRESS": proxy.url.removeprefix("http://"),
           "RAY_JOB_SUBMISSION_ID": "follow-wait-dashboard"}
    try:
        follow = subprocess.Popen(["bash", str(follow_sh)], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            out, errs = follow.communicate(timeout=8)
            pytest.fail(f"follow.sh ended while the Jobs API did not answer: {out} {errs}")
        except subprocess.TimeoutExpired:
            pass
        assert _status(ray_head, "follow-wait-dashboard") == ""  # nothing submitted yet
        proxy.point_at(ray_head.url)
        out, errs = follow.communicate(timeout=180)
    finally:
        if follow.poll() is None:
            follow.kill()
        proxy.close()
    assert follow.returncode == 0, errs
    assert "follow.sh: job follow-wait-dashboard ended: SUCCEEDED" in out


FAILING_JOB = "import sys; print('bad entrypoint', flush=True); sys.exit(3)"


def test_follow_sh_keeps_every_attempts_log_in_the_run_folder(ray_head, moto_server, tmp_path):
    """Each RayJob attempt (a new submission id, a new submitter pod) copies its whole output to
    <run folder>/logs/submitter-<id>-<pod>.log at exit, a failed job's included: KubeRay deletes the submitter Job
    at every retry, and its pod's log with it. A TERM (the pod deleted) copies the log too."""
    import os
    import signal

    from config import load_config
    from harness.loopback import REGION, s3_policy
    from tests.helpers import write_variant
    from workloads.fsdp_finetune.run_folder import run_dir_of

    bucket = moto_server.create_bucket("follow-submitter-logs")
    (tmp_path / "config").mkdir()
    file = write_variant(tmp_path / "config", {"storage": {"bucket_name": bucket}})  # the bundle's path beside it
    script = tmp_path / "job.py"
    script.write_text(FAILING_JOB + "\n")
    release = tmp_path / "release"
    (tmp_path / "long.py").write_text(JOB)
    # The stand-in for the bundle's submit.sh (as above): a failing entrypoint, or one that runs until released.
    (tmp_path / bundle.SUBMIT_SCRIPT).write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        'if [ -n "${LONG_JOB:-}" ]; then ARGS="' + f'{tmp_path / "long.py"} {release}' + '"; else ARGS="' +
        f'{script}"; fi\n'
        f'exec ray job submit --address "$RAY_JOB_ADDRESS" "$@" -- {sys.executable} $ARGS\n')
    follow_sh = tmp_path / bundle.FOLLOW_SCRIPT
    follow_sh.write_text(bundle.follow_script())
    keys = moto_server.create_user("follow-submitter", s3_policy(bucket))
    s3_env = {**keys.env(), "AWS_ENDPOINT_URL": moto_server.endpoint_url, "AWS_REGION": REGION,
              "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}
    base = {**{k: v for k, v in cli_env(ray_head.token).items() if not k.startswith("AWS_")}, **s3_env,
            "RAY_DASHBOARD_ADDRESS": ray_head.url.removeprefix("http://")}
    attempts = [("follow-keep-1", "ray-efa-job-abcde"), ("follow-keep-2", "ray-efa-job-fghij")]
    for job_id, pod in attempts:
        done = subprocess.run(["bash", str(follow_sh)], env={**base, "RAY_JOB_SUBMISSION_ID": job_id,
                                                             "HOSTNAME": pod},
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr
        assert f"follow.sh: job {job_id} ended: FAILED" in done.stdout
        assert f"submitter log is kept at s3://{bucket}/" in done.stdout
    # A submitter pod deleted mid-run (TERM from the kubelet): the trap still copies what it had.
    follow = subprocess.Popen(["bash", str(follow_sh)], env={**base, "RAY_JOB_SUBMISSION_ID": "follow-keep-term",
                                                              "HOSTNAME": "ray-efa-job-klmno", "LONG_JOB": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen: list[str] = []  # the follower's stdout, read as it comes: TERM only once the job's output reached it
    reader = threading.Thread(target=lambda: seen.extend(follow.stdout), daemon=True)
    reader.start()
    try:
        # Not a fixed sleep: on two loaded cores `ray job logs --follow` took over 3 s to stream the first line.
        wait_for(lambda: any("line 0" in line for line in seen), 180, "the long job's first line at the follower")
        os.kill(follow.pid, signal.SIGTERM)
        follow.wait(timeout=60)
        reader.join(timeout=60)
        errs = follow.stderr.read()
    finally:
        if follow.poll() is None:
            os.killpg(follow.pid, signal.SIGKILL)
        release.touch()
    out = "".join(seen)
    assert follow.returncode == 143, errs
    assert "submitter log is kept at" in out
    prefix = run_dir_of(load_config(file)).removeprefix(f"s3://{bucket}/") + "/logs/"
    s3 = moto_server.client("s3")
    kept = {o["Key"].removeprefix(prefix): s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read().decode()
            for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])}
    assert sorted(kept) == ["submitter-follow-keep-1-ray-efa-job-abcde.log",
                            "submitter-follow-keep-2-ray-efa-job-fghij.log",
                            "submitter-follow-keep-term-ray-efa-job-klmno.log"]
    for job_id, pod in attempts:
        text = kept[f"submitter-{job_id}-{pod}.log"]
        assert "bad entrypoint" in text and f"follow.sh: job {job_id} ended: FAILED" in text
    assert "line 0" in kept["submitter-follow-keep-term-ray-efa-job-klmno.log"]
