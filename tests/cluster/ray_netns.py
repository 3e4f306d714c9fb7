"""A real Ray head (the project's .venv Ray 2.58) in a network namespace the test creates, as the lab's head pod.

The lab's operator runs with `--use-kubernetes-proxy`: it reaches a RayJob's dashboard through the API server's
service proxy, which dials the head Service's endpoint, i.e. the head pod's IP (kuberay v1.7.0
ray-operator/controllers/ray/utils/dashboardclient, `UseKubernetesProxy`). kwok reports the IP a pod's
`kwok.lab/pod-ip` annotation names (../shared/k8s/README.md). That address must be real and not loopback
(EndpointSlices refuse 127.0.0.0/8), and never this machine's own: so the head runs inside a namespace behind a veth
pair (10.250.N.1 host side, 10.250.N.2 inside), entered with `nsenter --net` (`ip netns exec` remounts /sys). It is
stopped by its process group (`kill_session`), and the links and the namespace are deleted, also on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.waiting import kill_session, wait_for
from tests.ray_head import SLOW_START_ENV

RAY = Path(sys.executable).with_name("ray")
DASHBOARD_PORT = 8265
"""The head pod's dashboard containerPort, which the head Service (and so the proxy) targets."""
START_S = 240


@dataclass
class NetnsHead:
    ip: str
    netns: str

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{DASHBOARD_PORT}"

    def jobs(self) -> list[dict]:
        with urllib.request.urlopen(f"{self.url}/api/jobs/", timeout=10) as response:
            return json.loads(response.read())


def _run(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, timeout=30)


def _free_subnet() -> int:
    used = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    for n in [os.getpid() % 200 + 20, *range(20, 250)]:
        if f"10.250.{n}." not in used:
            return n
    raise RuntimeError("no free 10.250.N.0/24 subnet for the Ray head's network namespace")


def ray_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update({**SLOW_START_ENV, "PATH": f"{RAY.parent}{os.pathsep}{env.get('PATH', '')}"})
    return env


@contextlib.contextmanager
def ray_head() -> Iterator[NetnsHead]:
    """A Ray head listening on 10.250.N.2 inside its own network namespace, for the length of the block."""
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        raise RuntimeError("the cluster tier's Ray head needs `ip` (iproute2) and `nsenter` (util-linux), and root")
    n = _free_subnet()
    netns, host_if, ns_if = f"ctier{n}", f"ctier{n}h", f"ctier{n}n"
    temp = Path(tempfile.mkdtemp(prefix="rayns", dir="/tmp"))  # short: Ray's unix sockets live here
    proc = None
    try:
        _run("ip", "netns", "add", netns)
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _run("ip", "link", "set", ns_if, "netns", netns)
        _run("ip", "addr", "add", f"10.250.{n}.1/24", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        _run("ip", "netns", "exec", netns, "ip", "addr", "add", f"10.250.{n}.2/24", "dev", ns_if)
        _run("ip", "netns", "exec", netns, "ip", "link", "set", ns_if, "up")
        _run("ip", "netns", "exec", netns, "ip", "link", "set", "lo", "up")
        head = NetnsHead(ip=f"10.250.{n}.2", netns=netns)
        # Not `--block`, which ends the head when any of its children exits (tests/ray_head.py says why): `ray start`
        # returns once the head is up, and its processes stay in the process group `kill_session` ends. On a
        # loaded machine (load average 40 measured) the dashboard's modules can miss their start-up wait and
        # `ray start` exits 1; that start's processes are killed and it is tried once more.
        for attempt in (1, 2):
            proc = subprocess.Popen(
                ["nsenter", f"--net=/var/run/netns/{netns}", str(RAY), "start", "--head", "--num-cpus=1",
                 f"--node-ip-address={head.ip}", "--port=6379", f"--dashboard-port={DASHBOARD_PORT}",
                 "--dashboard-host=0.0.0.0", "--include-dashboard=true", f"--temp-dir={temp}"],
                env=ray_env(), stdout=open(temp / f"ray-start-{attempt}.log", "wb"), stderr=subprocess.STDOUT,
                start_new_session=True)
            proc.wait(timeout=START_S)
            if proc.returncode == 0:
                break
            log = (temp / f"ray-start-{attempt}.log").read_text()
            kill_session(proc)
            if attempt == 2:
                errors = [line for line in log.splitlines() if "rror" in line or "Exception" in line]
                raise AssertionError(f"ray start exited {proc.returncode} twice: {errors[-20:]} ... {log[-1500:]}")

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"{head.url}/api/version", timeout=2) as response:
                    return response.status == 200
            except (urllib.error.URLError, OSError):
                return False

        wait_for(answers, START_S, "the Ray head's dashboard in its network namespace", interval_s=0.5)
        # The Jobs API comes up with the dashboard's job module; wait until it answers too.
        wait_for(lambda: _jobs_answers(head), START_S, "the Ray head's Jobs API", interval_s=0.5)
        yield head
    finally:
        if proc is not None:
            kill_session(proc)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30, check=False)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30, check=False)
        shutil.rmtree(temp, ignore_errors=True)


def _jobs_answers(head: NetnsHead) -> bool:
    try:
        head.jobs()
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False
