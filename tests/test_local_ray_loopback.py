"""Nothing the project runs locally listens beyond loopback: a local Ray cluster as the demo, the tests and the
benchmarks start it (workloads/local_ray.py `start_local_ray`), and the Jobs API tests' head (tests/ray_head.py),
have every listening TCP socket on 127.0.0.1 (or its IPv4-mapped IPv6 form)."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys

import psutil
import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow  # starts Ray in a child process

# The child starts the demo's local cluster, runs one task on it, and lists the listening sockets of every process
# of its session (found by the session folder on their command lines, as Ray's daemons are not all its children).
PROBE = r"""
import json, os, psutil
from workloads.local_ray import start_local_ray
start_local_ray()
import ray
ray.get(ray.remote(lambda: 1).remote())
session = ray._private.worker._global_node.get_session_dir_path()
pids = {os.getpid()} | {p.pid for p in psutil.Process().children(recursive=True)}
pids |= {p.pid for p in psutil.process_iter(["cmdline"]) if session in " ".join(p.info["cmdline"] or [])}
found = [(c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name()) for c in psutil.net_connections("inet")
         if c.status == psutil.CONN_LISTEN and c.pid in pids]
print("SOCKETS " + json.dumps({"sockets": found, "node": ray.nodes()[0]["NodeManagerAddress"]}))
ray.shutdown()
"""


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def test_loopback_addresses_are_recognised():
    assert is_loopback("127.0.0.1") and is_loopback("::ffff:127.0.0.1") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("192.0.2.2")


def test_every_socket_of_a_local_ray_cluster_listens_on_loopback():
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("SOCKETS ")]
    result = json.loads(line.removeprefix("SOCKETS "))
    assert result["node"] == "127.0.0.1"
    sockets = result["sockets"]
    assert len(sockets) >= 4, sockets  # the GCS, the raylet, agents, workers: a probe that saw nothing proves nothing
    assert [s for s in sockets if not is_loopback(s[0])] == []


def test_the_jobs_api_head_listens_on_loopback_only(ray_head):
    session = str(ray_head.temp)
    pids = {p.pid for p in psutil.process_iter(["cmdline"]) if session in " ".join(p.info["cmdline"] or [])}
    sockets = [(c.laddr.ip, c.laddr.port) for c in psutil.net_connections("inet")
               if c.status == psutil.CONN_LISTEN and c.pid in pids]
    assert len(sockets) >= 3, sockets
    assert [s for s in sockets if not is_loopback(s[0])] == []
