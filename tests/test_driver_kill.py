"""The driver killed mid-run (SIGKILL of its whole process group: driver, its local Ray cluster, the workers),
then resubmitted under the same run name: it resumes from the last checkpoint Ray registered and ends with
the same weights as the session's unbroken run (conftest `reference_run`; the exact comparison of
tests/test_train_ray.py). Local storage here; through S3 (moto's server with auth, credentials from a
Pod-Identity-style endpoint only) the same kill lands mid-upload in tests/test_train_s3.py, which also shows
the resubmitted driver resuming from the checkpoint its snapshot in S3 names.

The kill lands at a known point, not by timing: rank 0 stops right after reporting checkpoint 4
(`harness/driver_run.py --gate`), and the test kills once Ray's checkpoint manager snapshot in storage
names checkpoint 4 as the latest. Before, the kill followed a poll of the run's files, and a driver that
trained faster than the poll finished all its steps first.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # driver processes with their own Ray clusters: `make check` leaves it out

from harness import driver_run  # noqa: E402
from harness.driver_run import SNAPSHOT  # noqa: E402
from workloads.fsdp_finetune.train_hooks import latest_in_snapshot as latest_registered  # noqa: E402

CHECKPOINT = "checkpoint_step_0000004"  # the gate: rank 0 stops after reporting it
RESUME_STEP = 4
REGISTER_TIMEOUT_S = 300.0  # driver start, Ray start, model build and 4 steps on a loaded two-core machine


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("driverkill")


def _read(path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def test_driver_killed_and_resubmitted_resumes_and_ends_with_unbroken_weights(out, driver_assets, reference_run):
    name, marker = "killed", out / "killed.gate"
    job = ["--assets", str(driver_assets)]
    proc = driver_run.start(out, name, *job, "--gate", CHECKPOINT, "--gate-marker", str(marker))
    snapshot = out / name / name / SNAPSHOT  # local_plan: storage OUT/<name>, Ray's run folder <storage>/<name>
    try:
        driver_run.wait_for(lambda: marker.exists() and latest_registered(_read(snapshot)) == CHECKPOINT,
                            REGISTER_TIMEOUT_S, f"{CHECKPOINT} registered with rank 0 at the gate", proc, out, name)
    finally:
        driver_run.kill_group(proc)
    assert not (out / name / "model").exists()

    assert driver_run.wait_exit(driver_run.start(out, name, *job), out, name) == 0  # resubmitted under the same name
    records = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert {r["resumed_from_step"] for r in records if r["step"] > RESUME_STEP} == {RESUME_STEP}
    reference = driver_run.weights(reference_run[0].export_uri)
    assert driver_run.same_weights(driver_run.weights(out / name / "model"), reference)
