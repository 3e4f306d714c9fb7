"""`make synth` synthesizes the EC2 target from every file too: `python -m config check` and synth apply the same
rules, so a file check passes always synthesizes (config/target.py). An EKS file the EC2 target refuses (a p4d
group of 4-GPU pods, a capacity block) is noted by check and skipped by synth-ec2 with the same reason."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import EXAMPLES, REPO


@pytest.fixture
def p4d_file(tmp_path):
    """The p5 example as on-demand p4d.24xlarge nodes with two 4-GPU pods each: fine on EKS, refused by ec2."""
    text = (EXAMPLES / "p5.yaml").read_text()
    text = text.replace("instance_type: p5.48xlarge", "instance_type: p4d.24xlarge")
    text = text.replace("capacity: capacity_block", "capacity: on_demand")
    text = text.replace("capacity_reservation_id: cr-0123456789abcdef0", "capacity_reservation_id: null")
    text = text.replace("gpus_per_pod: 8", "gpus_per_pod: 4")
    path = tmp_path / "p4d.yaml"
    path.write_text(text)
    return path


def run(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.slow
def test_check_notes_the_ec2_rule_that_synth_ec2_skips_for(p4d_file):
    check = run(sys.executable, "-m", "config", "check", str(p4d_file))
    assert check.returncode == 0, check.stderr
    assert ("note: make synth skips the EC2 target for this file (synth-ec2), which refuses "
            "cluster.worker_groups.0.gpus_per_pod: 4, but target: ec2") in check.stderr
    suits = run(sys.executable, "-m", "config", "suits", "ec2", str(p4d_file))
    assert suits.returncode == 1 and "cluster.worker_groups.0.gpus_per_pod: 4" in suits.stderr


@pytest.mark.slow
def test_synth_ec2_skips_such_a_file_with_the_reason_and_succeeds(p4d_file):
    # -o setup: the set-up is done; only synth-ec2's own recipe runs (it stops before the CDK for this file).
    make = run("make", "-s", "--no-print-directory", "-o", "setup", "synth-ec2", f"CONFIG={p4d_file}",
               "EC2_DIR=/nonexistent/never-written")
    assert make.returncode == 0, make.stdout + make.stderr
    assert "synth-ec2: skipped, the EC2 target refuses this file: cluster.worker_groups.0.gpus_per_pod: 4" \
        in make.stdout


@pytest.mark.slow
def test_a_file_that_suits_both_targets_has_no_note():
    check = run(sys.executable, "-m", "config", "check", str(REPO / "config" / "cluster.yaml"))
    assert check.returncode == 0 and "synth-ec2" not in check.stderr
    assert run(sys.executable, "-m", "config", "suits", "ec2").returncode == 0
