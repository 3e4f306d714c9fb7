"""The training loop's test seam: a `TrainHooks` object that `train_func` calls at fixed points of each step.

Production runs get the no-op `TrainHooks` (`hooks_from` of a config without `hooks`). Tests and benches that
need a fault at a known point pass one of the fault hooks below through the trainer's config
(`run_training(plan, hooks=KillOnceAt(...))`): Ray pickles it with the rest of `train_loop_config`, and
`train_func` takes it once, at its top (`hooks_from`), so the loop itself holds no test-only branch.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("fsdp_finetune")  # train.py's logger: its per-rank handler formats these lines too

CHECKPOINT_PREFIX = "checkpoint_step_"  # checkpoint N is reported as f"{CHECKPOINT_PREFIX}{N:07d}"


class TrainHooks:
    """No-op hooks: what a production run calls."""

    def on_step(self, step: int, *, rank: int, world: int, job: dict) -> None:
        """Called on every rank before the step's first micro-batch (`step` steps done so far)."""


def hooks_from(config: dict) -> TrainHooks:
    """The hooks the driver put in the worker config (`make_train_config(..., hooks=...)`), else the no-ops."""
    return config.get("hooks") or TrainHooks()


@dataclass(frozen=True)
class KillOnceAt(TrainHooks):
    """The last rank kills its process (no clean-up, like an OOM kill) once at `step`; `marker` records that it did."""

    step: int
    marker: str

    def on_step(self, step: int, *, rank: int, world: int, job: dict) -> None:
        """At `self.step`, on the last rank and while no marker exists: wait for the last checkpoint, then die."""
        if step != self.step or rank != world - 1 or not self.marker or os.path.exists(self.marker):
            return
        # The failure lands at a known point of the run: once Ray Train's controller has registered the
        # last checkpoint before this step (it counts only once every rank's report of it is in). Waiting
        # for that, not for a fixed number of polls, holds on a loaded machine too.
        every = job["checkpoint_every"]
        if step >= every:
            _await_registered(f"{CHECKPOINT_PREFIX}{step // every * every:07d}", step)
        Path(self.marker).write_text(f"killed at step {step}\n")
        log.warning("fail_at_step=%d: rank %d exits abruptly", step, rank)
        os._exit(1)


def _await_registered(want: str, step: int) -> None:
    """Wait (at most 120 s) until Ray Train's controller registered the checkpoint folder `want`."""
    import ray.train

    storage = ray.train.get_context().get_storage()
    deadline = time.monotonic() + 120
    while (got := registered_checkpoint(storage)) != want and time.monotonic() < deadline:
        time.sleep(0.1)  # polling interval of a bounded wait on a condition
    if got != want:
        log.warning("fail_at_step=%d: %s not registered after 120 s (latest: %s)", step, want, got)


def registered_checkpoint(storage) -> str | None:
    """The folder name of the checkpoint Ray Train's controller registered last (in the run's storage), else None."""
    try:
        with storage.storage_filesystem.open_input_stream(storage.checkpoint_manager_snapshot_path) as stream:
            return latest_in_snapshot(stream.read())
    except OSError:  # not written yet
        return None


def latest_in_snapshot(snapshot: str | bytes | None) -> str | None:
    """The latest registered checkpoint's folder name in the snapshot Ray Train's controller writes to the run's
    storage after each registration, else None (no snapshot, or one read while being written).

    Ray 2.58.0 ray/train/v2/_internal/execution/checkpoint/checkpoint_manager.py: `_write_state_to_storage`,
    whose `latest_checkpoint_result.checkpoint_dir_name` is the name `train_func` reported it under; the next
    fit() under the same name resumes from it.
    """
    import json

    if not snapshot:
        return None
    try:
        state = json.loads(snapshot)
    except ValueError:
        return None
    return (state.get("latest_checkpoint_result") or {}).get("checkpoint_dir_name")


HANG_BOUND_S = 600.0
"""How long `HangOnceAt` blocks at most: Ray Train kills the hung rank long before (it raises after this)."""


@dataclass(frozen=True)
class HangOnceAt(TrainHooks):
    """The last rank stops once at `step`, before the step's first collective; `marker` records the hang.

    The other ranks enter the step's `all_reduce` and wait there: a hung collective, as a rank stuck
    in I/O or on another code path leaves it. Under gloo that wait ends after the process group's
    timeout (`job.collective_timeout_minutes`) with a RuntimeError in each waiting rank, which fails
    its `train_func`; Ray Train 2.58 then restarts the group and kills every worker actor, this hung
    one included (`ray.kill` in `_shutdown_workers`, ray/train/v2/_internal/execution/worker_group/state.py).
    This rank's own health checks keep passing meanwhile: `train_func` runs in a thread of the actor
    (worker_group/thread_runner.py), so the hang is seen only through the waiting ranks' timeout.
    The marker records the hang (and, if this rank was never killed, says so before raising).
    """

    step: int
    marker: str

    def on_step(self, step: int, *, rank: int, world: int, job: dict) -> None:
        """At `self.step`, on the last rank and while no marker exists: block until the restart kills this rank."""
        if step != self.step or rank != world - 1 or not self.marker or os.path.exists(self.marker):
            return
        Path(self.marker).write_text(f"hung at step {step}\n")
        log.warning("hang_at_step=%d: rank %d stops before the step's collectives", step, rank)
        # A blocking wait that nothing sets: only the restart's kill ends it. Bounded so that a restart
        # that never comes fails the run (and says why) instead of hanging it.
        threading.Event().wait(HANG_BOUND_S)
        Path(self.marker).write_text(f"hung at step {step}; not killed within {HANG_BOUND_S:.0f} s\n")
        raise RuntimeError(f"hang_at_step={step}: rank {rank} was not killed within {HANG_BOUND_S:.0f} s")
