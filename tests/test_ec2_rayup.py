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
    tier.ray("up", "-y", "--no-config-cache", str(tier.yaml))
    assert tier.cloud.running() == {"head": "head"}
    head, worker = tier.lab.hosts
    assert head.containers() == ["ray_container"]
    assert worker.containers() == []
    # rsync and ssh inside the container are the host's, through the bind mounts the rendered YAML adds.
    inside = head.docker("exec", "ray_container", "sh", "-c", "command -v rsync ssh && rsync --version | head -1 "
                         "&& ssh -V 2>&1")
    assert "/usr/local/bin/rsync" in inside.stdout and "OpenSSH" in inside.stdout


def test_gpu_demand_makes_the_autoscaler_start_the_worker(tier):
    out = tier.ray("exec", str(tier.yaml), "python /opt/ec2-tier/probe.py gpu-task")
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
    tier.ray("down", "-y", str(tier.yaml))
    assert tier.cloud.running() == {}
    assert [h.containers() for h in tier.lab.hosts] == [[], []]
