"""A hung collective on a real local Ray cluster (2 CPU workers, FSDP2 over gloo): it ends at the job's
`collective_timeout_minutes` and Ray Train restarts the group, which resumes exactly.

The last rank stops once before step 7's first collective (`train_hooks.HangOnceAt`, a blocking wait that
only a kill ends); rank 0 enters that step's `all_reduce` and waits. How the hang surfaces, from the
sources of the pinned versions:

* PyTorch 2.13's ProcessGroupGloo gives every gloo context the process group's timeout
  (`context->setTimeout(options->timeout)`, torch/csrc/distributed/c10d/ProcessGroupGloo.cpp), which
  Ray Train 2.58 sets from `TorchConfig(timeout_s)` (`_setup_torch_process_group`,
  ray/train/torch/config.py); gloo's recv then raises "Timed out waiting <ms>ms for recv operation"
  (third_party/gloo/gloo/transport/tcp/unbound_buffer.cc) in the waiting rank, a RuntimeError that
  fails its `train_func`.
* The hung rank's health checks keep passing: `train_func` runs in a thread of the worker actor
  (ray/train/v2/_internal/execution/worker_group/thread_runner.py), and a missed poll only counts
  after RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S (10 minutes, ray/train/v2/_internal/constants.py).
  So the waiting rank's timeout is what ends the hang, not the health check.
* On that error the controller retries within `FailureConfig(max_failures)` and shuts the group down,
  `ray.kill`-ing every worker actor after 5 s of patience, the hung one included (`_shutdown_workers`,
  ray/train/v2/_internal/execution/worker_group/state.py); the new group resumes from the last
  checkpoint.

`collective_timeout_minutes` is 0.1 (6 s) here: long enough for the tiny job's legitimate waits, short
enough for a test. The job is `harness.driver_run.JOB`, which scores the held-out set only on checkpoint steps (see
there); the unbroken reference is the session's (conftest `reference_run`): the collective timeout does not
change the weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from harness.driver_run import HANG_AT, JOB  # noqa: E402
from tests.test_train_ray import _assert_same_weights, _weights  # noqa: E402
from workloads.fsdp_finetune.metrics import read_metrics  # noqa: E402
from workloads.fsdp_finetune.run_plan import local_plan  # noqa: E402
from workloads.fsdp_finetune.train_hooks import HangOnceAt  # noqa: E402
from workloads.fsdp_finetune.trainer import build_trainer, run_training  # noqa: E402

pytestmark = pytest.mark.slow  # a real Ray cluster: `make check` leaves it out, the full suite runs it

# At a checkpoint the loss plot is drawn before `ray.train.report`, whose rank barrier (Ray's sync actor, not
# gloo) has no collective timeout; JOB evaluates only there, so no rank-0-only work sits between two
# collectives while the other rank waits in the second under the 6 s timeout.
TIMEOUT_MINUTES = 0.1


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("hang")


def _plan(root, assets_dir, name, **overrides):
    plan, _ = local_plan(root / name, assets_dir=assets_dir, run_name=name, **{**JOB, **overrides})
    return plan


@pytest.fixture(scope="module")
def hung(local_ray, root, driver_assets):
    """The job whose last rank hangs at step 6 on the first attempt (the marker file keeps it to one)."""
    marker = root / "hung.marker"
    plan = _plan(root, driver_assets, "hung", max_failures=1, collective_timeout_minutes=TIMEOUT_MINUTES)
    result = run_training(plan, hooks=HangOnceAt(HANG_AT, str(marker)))
    return plan, marker, result


def _rank_log(plan, rank: int) -> str:
    return (Path(plan.run_dir) / "logs" / f"rank-{rank}.log").read_text()


def test_waiting_rank_fails_at_the_jobs_collective_timeout_and_the_hung_rank_is_killed(hung):
    plan, marker, result = hung
    assert result.error is None  # the one restart allowed (max_failures=1) was enough
    waiting, stuck = _rank_log(plan, 0), _rank_log(plan, 1)
    # The job's 0.1 minutes reached gloo: rank 0's step-7 all_reduce gave up after 6,000 ms.
    assert "rank 0 failed" in waiting and "Timed out waiting 6000ms for" in waiting
    assert f"hang_at_step={HANG_AT}: rank 1 stops before the step's collectives" in stuck
    # The hung rank never woke from its wait: the restart killed it (it would have rewritten the marker).
    assert marker.read_text() == f"hung at step {HANG_AT}\n"
    assert "rank 1 failed" not in stuck and "not killed" not in stuck


def test_the_restarted_group_resumes_from_the_last_checkpoint_with_the_unbroken_runs_weights(hung, reference_run):
    plan, _, result = hung
    assert result.error is None
    records = read_metrics(plan.metrics_path)
    assert [r["step"] for r in records] == [0, 2, 4, 6, 8, 10, 12]  # step 6 retrained, not logged twice
    assert {r["resumed_from_step"] for r in records if r["step"] > 4} == {4}
    _assert_same_weights(_weights(plan.export_uri), _weights(reference_run[0].export_uri))


def test_a_sub_second_collective_timeout_is_not_rounded_to_zero(root, driver_assets):
    """0.005 minutes (0.3 s) passes the field's `> 0`, but Ray's `timeout_s` is whole seconds and 0 s would
    fail the process group's own rendezvous (PyTorch 2.13's TCPStore: "client socket has timed out after
    0ms", tried here): it becomes 1 s."""
    plan = _plan(root, driver_assets, "short", collective_timeout_minutes=0.005)
    assert build_trainer(plan).backend_config.timeout_s == 1
    plan = _plan(root, driver_assets, "six", collective_timeout_minutes=TIMEOUT_MINUTES)
    assert build_trainer(plan).backend_config.timeout_s == 6
