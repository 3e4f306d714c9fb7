"""The `ray up` tier (issue 34): Ray 2.58's own `ray up`, `ray exec`, `ray job submit` and `ray down` on the YAML
`python -m charts.launcher render` writes for the default file, against two namespace hosts with their own sshd
and dockerd and the DLC stand-in image (tests/ec2_tier/, docs/ec2.md "The ray up tier").

Only the declared substitutions differ from the rendered YAML (the first test prints them). Never skipped: a
machine that cannot make namespaces or start dockerd/sshd fails here (CI installs them: .ci/run).
Run alone: `make ec2-test` (about N minutes warm on two cores; bench/ec2_tier.py measures it).
"""

from __future__ import annotations

import copy
import json
import re
import time

import pytest

from tests.ec2_tier import substitutions

pytestmark = [pytest.mark.slow, pytest.mark.ec2_tier]


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    from tests.ec2_tier.tier import Tier

    with Tier(tmp_path_factory.mktemp("ec2-tier")) as tier:
        yield tier
        # Whatever a failed test left: `ray down` first (as a user would), then the hosts go (Lab.close).
        tier.ray("down", "-y", str(tier.yaml), check=False, timeout=300)


def _json_line(text: str):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith(("{", "[")):
            return json.loads(line)
    raise AssertionError(f"no JSON line in:\n{text[-3000:]}")


def test_only_the_declared_substitutions_differ_from_the_rendered_yaml(tier):
    print(substitutions.table_text(tier.table))
    assert substitutions.undeclared(tier.rendered, tier.yaml_data, tier.table) == []
    # The check itself: any other change to the rendered YAML is reported.
    tampered = copy.deepcopy(tier.yaml_data)
    tampered["head_start_ray_commands"][1] += " --num-cpus=1"
    tampered["docker"]["run_options"].append("--privileged")
    found = substitutions.undeclared(tier.rendered, tampered, tier.table)
    assert {c.path for c in found} == {"head_start_ray_commands", "docker.run_options"}


def test_the_stand_in_lacks_rsync_and_ssh_as_the_dlc_does(tier):
    head = tier.lab.hosts[0]
    probe = head.docker("run", "--rm", "--entrypoint", "sh", tier.image.tag, "-c",
                        "command -v rsync || command -v ssh || echo none; id -un; pwd", check=False)
    assert probe.stdout.split() == ["none", "root", "/workspace"], probe.stdout + probe.stderr


def test_ray_up_starts_the_head_alone(tier):
    start = time.monotonic()
    tier.ray("up", "-y", "--no-config-cache", str(tier.yaml))
    print(f"ray up (head alone): {time.monotonic() - start:.0f} s")
    assert tier.cloud.running() == {"head": "head"}
    head, worker = tier.lab.hosts
    assert head.containers() == ["ray_container"]
    assert worker.containers() == []
    # rsync and ssh inside the container are the host's, through the bind mounts the rendered YAML adds.
    inside = head.docker("exec", "ray_container", "sh", "-c", "command -v rsync ssh && rsync --version | head -1 "
                         "&& ssh -V 2>&1")
    assert "/usr/local/bin/rsync" in inside.stdout and "OpenSSH" in inside.stdout


def test_gpu_demand_makes_the_autoscaler_start_the_worker(tier):
    start = time.monotonic()
    out = tier.ray("exec", str(tier.yaml), "python /opt/ec2-tier/probe.py gpu-task")
    print(f"GPU task until it ran on the worker the autoscaler started: {time.monotonic() - start:.0f} s")
    worker = tier.lab.hosts[1]
    assert _json_line(out.stdout) == {"node_ip": worker.ip}
    assert tier.cloud.running() == {"head": "head", "gpu": "worker"}
    assert worker.containers() == ["ray_container"]
    status = tier.ray("exec", str(tier.yaml), "ray status")
    active = status.stdout.split("Active:")[1].split("Pending:")[0]
    assert re.search(r"1 head\b", active) and re.search(r"1 gpu\b", active), status.stdout[-3000:]


def test_ray_job_submit_runs_on_the_cluster(tier):
    out = tier.ray("exec", str(tier.yaml), "ray job submit --address http://127.0.0.1:8265 -- "
                   "python /opt/ec2-tier/probe.py nodes")
    nodes = _json_line(out.stdout)
    by_ip = {n["ip"]: n["resources"] for n in nodes}
    head, worker = tier.lab.hosts
    assert by_ip[worker.ip]["GPU"] == 4.0 and by_ip[head.ip].get("GPU", 0) == 0
    assert "succeeded" in out.stdout


def test_ray_down_removes_every_container(tier):
    start = time.monotonic()
    tier.ray("down", "-y", str(tier.yaml))
    print(f"ray down: {time.monotonic() - start:.0f} s")
    assert tier.cloud.running() == {}
    assert [h.containers() for h in tier.lab.hosts] == [[], []]


# ---- bad input and the start deadline: `python -m charts.launcher up` (charts/launcher_up.py) --------------
# Each ends non-zero with one message naming what to fix, and leaves no instance (no container) running.

def _launcher_up(tier, *, deadline_minutes: float = 30, yaml_path=None):
    import subprocess
    import sys

    from tests.helpers import write_variant

    # The EC2 target runs no watchdog (a KubeRay add-on), so its head rule does not bound the short deadline.
    config_file = write_variant(tier.work, {"job": {"start_deadline_minutes": deadline_minutes, "watchdog": False}},
                                name=f"deadline-{deadline_minutes:g}.yaml")
    from tests.ec2_tier.tier import REPO

    env = tier.env()
    env["PYTHONPATH"] = f"{REPO}:{env['PYTHONPATH']}"
    proc = subprocess.run([sys.executable, "-m", "charts.launcher", "up", str(config_file), "--yaml",
                           str(yaml_path or tier.yaml)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900, stdin=subprocess.DEVNULL)
    return proc, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""


def _nothing_running(tier) -> None:
    assert tier.cloud.running() == {}
    assert [h.containers() for h in tier.lab.hosts] == [[], []]


def test_a_wrong_key_path_is_refused_before_anything_starts(tier, tmp_path):
    broken = dict(tier.yaml_data, auth={**tier.yaml_data["auth"], "ssh_private_key": str(tmp_path / "no-such-key")})
    path = tmp_path / "wrong-key.yaml"
    import yaml

    path.write_text(yaml.safe_dump(broken))
    calls = len(tier.cloud.calls)
    proc, message = _launcher_up(tier, yaml_path=path)
    assert proc.returncode == 2
    assert "auth.ssh_private_key" in message and "no-such-key" in message and "does not exist" in message
    assert len(tier.cloud.calls) == calls  # nothing launched
    _nothing_running(tier)


def test_no_capacity_stops_ray_up_at_once_and_leaves_nothing_running(tier):
    tier.cloud.capacity_shortage = True
    try:
        proc, message = _launcher_up(tier)
    finally:
        tier.cloud.capacity_shortage = False
    assert proc.returncode == 3, proc.stdout[-3000:]
    assert "no EC2 capacity" in message and "terminated (`ray down`)" in message
    _nothing_running(tier)


def test_an_sshd_that_refuses_the_key_stops_ray_up_naming_the_key(tier):
    head = tier.lab.hosts[0]
    keys = head.dir / "authorized_keys"
    good = keys.read_text()
    from tests.ec2_tier.hosts import sh

    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tier.work / "other-key"))
    keys.write_text((tier.work / "other-key.pub").read_text())
    try:
        proc, message = _launcher_up(tier)
    finally:
        keys.write_text(good)
    assert proc.returncode == 3, proc.stdout[-3000:]
    assert "sshd refused the key" in message and "Permission denied (publickey" in message
    _nothing_running(tier)


def test_a_docker_daemon_that_is_not_running_stops_ray_up_naming_it(tier):
    head = tier.lab.hosts[0]
    tier.lab.stop_dockerd(head)
    try:
        proc, message = _launcher_up(tier)
    finally:
        tier.lab.start_dockerd(head)
    assert proc.returncode == 3, proc.stdout[-3000:]
    assert "Docker daemon is not running" in message
    _nothing_running(tier)


def test_a_head_that_never_answers_ssh_ends_ray_up_at_the_start_deadline(tier):
    head = tier.lab.hosts[0]
    tier.lab.stop_sshd(head)
    start = time.monotonic()
    try:
        proc, message = _launcher_up(tier, deadline_minutes=0.5)
    finally:
        tier.lab.start_sshd(head)
    took = time.monotonic() - start
    assert proc.returncode == 3, proc.stdout[-3000:]
    assert "did not finish within job.start_deadline_minutes (0.5 min)" in message
    print(f"stopped and cleaned up {took:.0f} s after the start (deadline 30 s)")
    _nothing_running(tier)
