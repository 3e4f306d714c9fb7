"""The `ray up` tier (issue 34): Ray 2.58's own `ray up`, `ray exec`, `ray job submit` and `ray down` on the YAML
`python -m ops.launcher render` writes for the default file, against two namespace hosts with their own sshd
and dockerd and the DLC stand-in image (tests/ec2_tier/, docs/ec2.md "The ray up tier").

Only the declared substitutions differ from the rendered YAML (the first test prints them). Never skipped: a
machine that cannot make namespaces or start dockerd/sshd fails here (CI installs them: .ci/run).
Run alone: `make ec2-test` (about 4.5 min warm on two idle cores, 15 tests; bench/ec2_tier.py measures it).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ec2_tier import substitutions

pytestmark = [pytest.mark.slow, pytest.mark.ec2_tier]


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    from tests.ec2_tier.tier import Tier

    with Tier(tmp_path_factory.mktemp("ec2-tier")) as tier:
        yield tier
        # Whatever a failed test left: `ray down` first (as a user would), then the hosts go (Lab.close).
        if _anything_running(tier):
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


def test_names_resolve_as_in_a_vpc_and_no_packet_leaves_the_subnet(tier):
    from tests.ec2_tier.hosts import ROUTER, sh

    head, worker = tier.lab.hosts
    # In the head's Ray container, as Ray and c10d look names up: the peer's name from /etc/hosts, and any other
    # lookup refused by the loopback resolver (this machine's resolver, reached through its forwarding, never
    # answered: 10 s per lookup).
    out = head.docker("exec", "ray_container", "sh", "-c",
                      f"getent hosts {worker.ip}; getent hosts example.com; echo exit=$?; cat /etc/resolv.conf")
    assert f"{worker.ip}" in out.stdout and worker.dns_name in out.stdout, out.stdout
    assert "exit=2" in out.stdout, out.stdout  # getent: 2 = not found
    assert [line for line in out.stdout.splitlines() if line.startswith("nameserver")] == ["nameserver 127.0.0.1"]
    # Off-subnet packets go to the switch namespace's address, which forwards nothing.
    for host in tier.lab.hosts:
        assert sh("ip", "-n", host.netns, "route", "show", "default").stdout.split()[:3] == ["default", "via", ROUTER]
    forward = sh("ip", "netns", "exec", tier.lab.switch, "cat", "/proc/sys/net/ipv4/ip_forward").stdout.strip()
    assert forward == "0"


def test_ray_job_submit_runs_on_the_cluster(tier):
    out = tier.ray("exec", str(tier.yaml), "ray job submit --address http://127.0.0.1:8265 -- "
                   "python /opt/ec2-tier/probe.py nodes")
    nodes = _json_line(out.stdout)
    by_ip = {n["ip"]: n["resources"] for n in nodes}
    head, worker = tier.lab.hosts
    assert by_ip[worker.ip]["GPU"] == 4.0 and by_ip[head.ip].get("GPU", 0) == 0
    assert "succeeded" in out.stdout


def test_the_ray_token_is_in_no_docker_inspect_and_the_cluster_authenticates(tier):
    from ops.launcher import AUTH_TOKEN_FILE, STOP_TIMEOUT_S

    inspected = 0
    for host in tier.lab.hosts:
        for name in host.containers():
            inspect = host.docker("inspect", name).stdout
            assert tier.token not in inspect, f"{host.name}/{name}: the Ray token is in docker inspect"
            assert f"RAY_AUTH_TOKEN_PATH={AUTH_TOKEN_FILE}" in inspect
            # The rendered --stop-timeout reached Docker: `ray down`'s `docker stop` waits 1 s, not 10.
            assert json.loads(inspect)[0]["Config"]["StopTimeout"] == STOP_TIMEOUT_S
            inspected += 1
            # The host's file as the container sees it: root-only, read-only.
            mode = host.docker("exec", name, "stat", "-c", "%a %u", AUTH_TOKEN_FILE).stdout.split()
            assert mode == ["600", "0"], mode
            write = host.docker("exec", name, "sh", "-c", f": >> {AUTH_TOKEN_FILE}", check=False)
            assert write.returncode != 0 and "Read-only" in write.stderr, write.stderr
    assert inspected == 2  # the head's container and the worker's
    # Still token auth: the Jobs API refuses a request without the token, takes one with the file's.
    answer = _json_line(tier.ray("exec", str(tier.yaml), "python /opt/ec2-tier/probe.py auth").stdout)
    assert answer["without"] in (401, 403) and answer["with"] == 200 and answer["token_in_env"] is False, answer


def test_ray_down_removes_every_container(tier):
    start = time.monotonic()
    tier.ray("down", "-y", str(tier.yaml))
    print(f"ray down: {time.monotonic() - start:.0f} s")
    _nothing_running(tier)


# ---- a fine-tune across both containers, the worker's container killed, an exact resume (issue 34 point 3) ------
# tests/fixtures/ec2-finetune.yaml: one CPU worker with two logical GPUs (two Ray Train workers on gloo in the
# worker's container; the driver and Ray Train's controller in the head's), the demo's tiny model from S3, a
# checkpoint every 20 of 80 steps to the tier's S3 server. Brought up with `python -m ops.launcher up` and
# submitted with /app/submit.sh, as docs/ec2.md says. The worker's container is killed (`docker kill`, as an OOM
# kill or a crashed daemon would end it; the instance lives on) once the first checkpoint is registered in S3; the
# head's autoscaler restarts Ray there, Ray Train restarts the worker group and resumes from that checkpoint. The
# run must then equal an unbroken one bit for bit: every step's loss and the exported weights
# (tests/ec2_tier/reference.py, trained on this machine during the bad-input tests: the `finetune` fixture).

SUBMISSION_ID = "ec2-tier-1"
FIRST_CHECKPOINT = "checkpoint_step_0000020"
FINETUNE_TIMEOUT_S = 900
# Production values for the cost (docs/failure-handling.md): the GPU nodes of config/cluster.yaml.
PRODUCTION_GPU_NODES = 2


@dataclasses.dataclass(frozen=True)
class FineTune:
    yaml: object  # tests.ec2_tier.tier.FineTuneYaml
    reference: subprocess.Popen
    reference_dir: Path


@pytest.fixture(scope="module")
def finetune(tier, tmp_path_factory):
    """The fine-tune's YAML, and its unbroken reference run started in the background (stopped at the end if it
    still runs). Asked for first by the YAML test, which runs before the bad-input tests: the reference trains on
    this machine's two cores while those mostly wait on `ray up`, not while the fine-tune's cluster starts."""
    from harness.driver_run import kill_group
    from tests.ec2_tier.tier import FINETUNE_FILE, REPO

    rendered = tier.render_finetune()
    ref_dir = tmp_path_factory.mktemp("reference")
    env = {k: v for k, v in tier.env().items() if k != "PYTHONPATH"}
    with (ref_dir / "reference.log").open("wb") as log:
        reference = subprocess.Popen([sys.executable, "-m", "tests.ec2_tier.reference", str(FINETUNE_FILE),
                                      str(rendered.model_dir), str(ref_dir)], cwd=REPO, env=env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield FineTune(rendered, reference, ref_dir)
    finally:
        if reference.poll() is None:
            kill_group(reference)


def test_the_fine_tune_yaml_differs_only_by_declared_substitutions(finetune):
    print(substitutions.table_text(finetune.yaml.table))
    assert substitutions.undeclared(finetune.yaml.rendered, finetune.yaml.data, finetune.yaml.table) == []
    worker = finetune.yaml.data["available_node_types"]["cpu"]
    assert worker["resources"]["logical_gpu"] == 2 and worker["resources"]["GPU"] == 0


# ---- bad input and the start deadline: `python -m ops.launcher up` (ops/launcher_up.py) --------------
# Each ends non-zero with one message naming what to fix, and leaves no instance (no container) running.

def _launcher_up(tier, *, deadline_minutes: float = 30, yaml_path=None, config_file=None):
    from tests.helpers import write_variant

    if config_file is None:
        # The EC2 target runs no watchdog (a KubeRay add-on), so its head rule does not bound the short deadline.
        config_file = write_variant(tier.work, {"job": {"start_deadline_minutes": deadline_minutes, "watchdog": False}},
                                    name=f"deadline-{deadline_minutes:g}.yaml")
    from tests.ec2_tier.tier import REPO

    env = tier.env()
    env["PYTHONPATH"] = f"{REPO}:{env['PYTHONPATH']}"
    proc = subprocess.run([sys.executable, "-m", "ops.launcher", "up", str(config_file), "--yaml",
                           str(yaml_path or tier.yaml)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900, stdin=subprocess.DEVNULL)
    return proc, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""


def _anything_running(tier) -> bool:
    return bool(tier.cloud.running()) or any(h.containers() for h in tier.lab.hosts)


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
    calls = len(tier.cloud.calls)
    start = time.monotonic()
    try:
        proc, message = _launcher_up(tier, deadline_minutes=0.25)
    finally:
        tier.lab.start_sshd(head)
    took = time.monotonic() - start
    assert proc.returncode == 3, proc.stdout[-3000:]
    assert "did not finish within job.start_deadline_minutes (0.25 min)" in message, proc.stdout[-3000:]
    # The head was launched and waited on (not stopped before it existed), then terminated by the `ray down`.
    assert tier.cloud.calls[calls:] == ["create head x1", "terminate head"], tier.cloud.calls[calls:]
    print(f"stopped and cleaned up {took:.0f} s after the start (deadline 15 s)")
    _nothing_running(tier)


# ---- the fine-tune itself (its YAML and reference: the section above) --------------------------------------------

def test_a_fine_tune_across_both_containers_resumes_exactly_after_the_worker_is_killed(tier, finetune):
    from harness.driver_run import same_weights, weights
    from harness.waiting import wait_for
    from tests.ec2_tier.finetune import RunInS3, Watch
    from tests.ec2_tier.tier import FINETUNE_FILE
    from workloads.fsdp_finetune.run_plan import cluster_plan

    config = finetune.yaml.config
    plan = cluster_plan(config, bucket=config.storage.bucket_name)
    run = RunInS3(tier.s3(), plan.run_dir, plan.export_uri)
    head, worker = tier.lab.hosts
    ref_dir, reference = finetune.reference_dir, finetune.reference
    yaml_path = str(finetune.yaml.path)
    watch = Watch(run, worker)
    follow = None
    try:
        start = time.monotonic()
        proc, message = _launcher_up(tier, yaml_path=finetune.yaml.path, config_file=FINETUNE_FILE)
        assert proc.returncode == 0, f"{message}\n{proc.stdout[-4000:]}"
        print(f"python -m ops.launcher up (the fine-tune's head): {time.monotonic() - start:.0f} s")
        watch.start = time.monotonic()
        out = tier.ray("exec", yaml_path, f"bash /app/submit.sh --no-wait --submission-id {SUBMISSION_ID}")
        assert "submitted successfully" in out.stdout + out.stderr, out.stdout[-3000:]
        watch.mark(f"submitted with /app/submit.sh (ray job submit {SUBMISSION_ID})")
        follow = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "exec", yaml_path,
                                   f"ray job logs --address http://127.0.0.1:8265 --follow {SUBMISSION_ID}"],
                                  cwd=tier.work, env=tier.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        watch.follow = follow
        watch.begin()
        # The kill is ordered by S3, not by a sleep: right after Ray's checkpoint manager registers the first one.
        wait_for(lambda: run.latest_checkpoint(), FINETUNE_TIMEOUT_S, "the first checkpoint registered in S3",
                 interval_s=0.3, detail=lambda: "\n" + watch.render("so far"))
        latest = run.latest_checkpoint()
        worker.docker("kill", "ray_container")
        killed_at = watch.mark(f"{latest} registered in S3; docker kill ray_container on the worker host")
        before = [r for r in run.metrics() if "loss" in r]
        logs, _ = follow.communicate(timeout=FINETUNE_TIMEOUT_S)
        watch.mark("the job's log stream ended")
    finally:
        watch.stop()
        print("\n" + watch.render("fine-tune, worker container killed after the first checkpoint"))
        if follow is not None and follow.poll() is None:
            follow.kill()
            follow.wait(timeout=30)
    status = tier.ray("exec", yaml_path, f"ray job status --address http://127.0.0.1:8265 {SUBMISSION_ID}")
    # `ray job status` prints "Job '<id>' succeeded" (ray 2.58.0 ray/dashboard/modules/job/cli.py, _log_job_status).
    assert f"Job '{SUBMISSION_ID}' succeeded" in status.stdout, f"{status.stdout[-2000:]}\n{logs[-6000:]}"
    assert latest == FIRST_CHECKPOINT, watch.render("")

    # Resumed from the checkpoint registered before the kill, in the same job, to the last step.
    rows = [r for r in run.metrics() if "loss" in r]
    steps = [r["step"] for r in rows]
    assert steps == list(range(1, config.job.max_steps + 1)), steps
    assert {r.get("resumed_from_step") for r in rows if r["step"] > 20} == {20}, rows[18:24]

    # Bit for bit the unbroken run: every step's loss (those trained before the kill too) and the exported weights.
    waited = time.monotonic()
    assert reference.wait(timeout=FINETUNE_TIMEOUT_S) == 0, (ref_dir / "reference.log").read_text()[-4000:]
    print(f"waited {time.monotonic() - waited:.1f} s for the reference run (started before the bad-input tests)")
    ref_rows = [json.loads(line) for line in (ref_dir / config.job.run_name / "metrics.jsonl").read_text().splitlines()
                if line.strip()]
    ref_loss = {r["step"]: r["loss"] for r in ref_rows if "loss" in r}
    assert {r["step"]: r["loss"] for r in rows} == ref_loss
    assert before and all(r["loss"] == ref_loss[r["step"]] for r in before), before
    assert same_weights(run.exported_weights(), weights(ref_dir / config.job.run_name / "model"))

    # Cost at production values: from the kill until the resumed run is back at the step the first attempt had
    # reached (the new container, Ray Train's restart, the steps trained again), on every GPU node.
    reached = max(r["step"] for r in before)
    back = next(t for t, step, resumed in watch.steps if t > killed_at and resumed and step >= reached)
    minutes = (back - killed_at) / 60 * PRODUCTION_GPU_NODES
    print(f"worker killed at {killed_at:.1f} s with step {reached} in S3; back at step {reached} at {back:.1f} s: "
          f"{back - killed_at:.1f} s lost = {minutes:.2f} GPU-node minutes at {PRODUCTION_GPU_NODES} GPU nodes")

    start = time.monotonic()
    tier.ray("down", "-y", yaml_path)
    print(f"ray down (the fine-tune's cluster): {time.monotonic() - start:.0f} s")
    _nothing_running(tier)
