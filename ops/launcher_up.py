"""`python -m ops.launcher up`: Ray's `ray up` under the file's start deadline, with a clear stop.

`ray up` alone has no deadline: with no capacity, or a head that never answers SSH, Ray's updater retries SSH
for minutes per attempt (ray 2.58.0, ray/autoscaler/_private/updater.py NodeUpdater.wait_ready,
AUTOSCALER_NODE_START_WAIT_S) and a failed setup leaves the instance running. This wrapper runs `ray up`,
stops it at `job.start_deadline_minutes` or at the first line that names a failure no retry fixes (a
refused key, a Docker daemon that is not running, no capacity), then runs `ray down` so that no instance is
left running, and says what to fix. Exit 0 when `ray up` succeeded; 3 when it was stopped (non-zero).
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import yaml

DOWN_TIMEOUT_S = 300
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
EXIT_STOPPED = 3


@dataclass(frozen=True)
class Known:
    pattern: str
    fix: str


# Lines of `ray up`'s output that no retry fixes: stop at once. (Ray prints the remote command's stderr.)
KNOWN_FAILURES = (
    Known(r"Permission denied \(publickey", "the node's sshd refused the key (auth.ssh_private_key, or the key pair "
          "Ray made): check the key and the AMI's user (ssh_user)"),
    Known(r"Cannot connect to the Docker daemon|docker\.sock: connect: (no such file|connection refused)",
          "the node's Docker daemon is not running: start it (sudo systemctl enable --now docker) or use an AMI "
          "that runs it (the DLAMI)"),
    Known(r"InsufficientInstanceCapacity|Insufficient capacity|InstanceLimitExceeded|MaxSpotInstanceCountExceeded",
          "no EC2 capacity or quota for the instance type: try another availability zone or type, raise the "
          "quota, or wait"),
    # Anchored: Ray also prints each command's text, which contains these messages in its `echo`.
    Known(r"^\s*error: cannot read the Ray auth token", "the node cannot read the Ray token secret: check the "
          "instance profile (secretsmanager:GetSecretValue) and AuthTokenSecretArn"),
    Known(r"^\s*error: (rsync|ssh) is not installed on the host", "the AMI lacks rsync or an ssh client, which the "
          "Ray containers borrow from the host: install them in the AMI"),
)


def preflight(launcher_yaml: Path) -> list[str]:
    """What would make `ray up` hang or fail late, found before it starts: the file, the key."""
    if not launcher_yaml.is_file():
        return [f"{launcher_yaml}: no such file; render it first: python -m ops.launcher render --deployed"]
    try:
        data = yaml.safe_load(launcher_yaml.read_text())
    except yaml.YAMLError as exc:
        return [f"{launcher_yaml}: not YAML ({exc})"]
    problems = []
    key = (data.get("auth") or {}).get("ssh_private_key")
    if key:
        path = Path(os.path.expanduser(key))
        if not path.is_file():
            problems.append(f"{launcher_yaml}: auth.ssh_private_key {key} does not exist; point it at the private "
                            "key of the key pair the instances are launched with")
        elif not os.access(path, os.R_OK):
            problems.append(f"{launcher_yaml}: auth.ssh_private_key {key} is not readable by this user")
    return problems


def _kill_group(proc: subprocess.Popen) -> None:
    """`ray up` and the ssh/rsync children it started (its own session), by process group id."""
    if proc.poll() is None:
        with _suppress():
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with _suppress():
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        return kind is not None and issubclass(kind, (ProcessLookupError, PermissionError))


def ray_down(launcher_yaml: Path, env: dict | None = None) -> int:
    ray = str(Path(sys.executable).parent / "ray")
    proc = subprocess.run([ray, "down", "-y", str(launcher_yaml)], env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=DOWN_TIMEOUT_S)
    return proc.returncode


def up(launcher_yaml: Path, *, deadline_minutes: float, extra_args: list[str] | None = None,
       out=sys.stdout, err=sys.stderr, env: dict | None = None) -> int:
    """Run `ray up -y launcher_yaml` with the deadline; on a stop, `ray down` and one message naming the fix."""
    problems = preflight(launcher_yaml)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=err)
        return 2
    ray = str(Path(sys.executable).parent / "ray")
    argv = [ray, "up", "-y", *(extra_args or []), str(launcher_yaml)]
    start = time.monotonic()
    deadline = start + deadline_minutes * 60
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    tail: deque[str] = deque(maxlen=15)
    reason = None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    buffer = b""
    try:
        while reason is None:
            left = deadline - time.monotonic()
            if left <= 0:
                reason = (f"`ray up` did not finish within job.start_deadline_minutes ({deadline_minutes:g} min): "
                          "no capacity, or the head never answered SSH; see the last lines above")
                break
            if not selector.select(timeout=min(left, 1.0)):
                if proc.poll() is not None:
                    break
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                proc.wait()
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace")
                print(line, file=out, flush=True)
                tail.append(line)
                plain = _ANSI.sub("", line)
                for known in KNOWN_FAILURES:
                    if re.search(known.pattern, plain):
                        reason = f"{known.fix} (`ray up` printed: {plain.strip()[:200]})"
                        break
                if reason:
                    break
    finally:
        selector.close()
        _kill_group(proc)
    if reason is None and proc.returncode == 0:
        return 0
    if reason is None:
        reason = f"`ray up` exited {proc.returncode}; see its output above"
    down = ray_down(launcher_yaml, env=env)
    cleanup = ("every instance of the cluster was terminated (`ray down`)" if down == 0 else
               f"`ray down` exited {down}: check for running instances tagged ray-cluster-name and terminate them")
    print(f"error: {reason}; {cleanup}", file=err, flush=True)
    return EXIT_STOPPED
