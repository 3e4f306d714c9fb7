"""Seconds from a failure to training again (or to a stop), on a local Ray cluster (2 CPU workers, gloo).

    python bench/failure_times.py [--out DIR]

Cases (the tiny job of tests/test_train_ray.py, 12 steps, a checkpoint every 4, reports every step):

* `worker_killed`: the last rank exits abruptly (os._exit) at step 10; Ray Train's FailureConfig
  restarts the group, which resumes from checkpoint 8. Measured: the kill marker's time to the
  first metrics record written after it (the first step trained again).
* `rerun_after_abort`: the same kill with no restart left ends `fit()`; a second `fit()` under the
  same name (what a RayJob retry or a resubmission does, minus the cluster start) resumes from
  checkpoint 8. Measured: the second `fit()` call to its first metrics record.
* `storage_check_refusal`: the driver's storage check against a bucket it may not write (moto's
  server, auth enforced, Pod Identity endpoint): the time to the refusal.

Bounded (a 12-step job per case); loopback only. Prints one JSON line. Figures depend on the
machine's load: on a shared 2-core machine they are upper bounds. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

JOB = dict(seq_len=64, micro_batch_size=4, global_batch_size=16, max_steps=12, warmup_steps=2,
           checkpoint_every=4, report_every=1, eval_every=6, learning_rate=3e-3)


def _first_record_after(path: Path, t0: float, timeout_s: float = 600) -> float | None:
    """Wall time of the first metrics record appended after `t0` (polls the file's size), or None."""
    deadline = time.time() + timeout_s
    size = path.stat().st_size if path.exists() else 0
    while time.time() < deadline:
        if path.exists() and path.stat().st_size > size:
            return time.time()
        time.sleep(0.05)
    return None


def main() -> int:
    import threading

    import ray

    from workloads.fsdp_finetune.run_plan import local_plan
    from workloads.fsdp_finetune.train_hooks import KillOnceAt
    from workloads.fsdp_finetune.trainer import run_training
    from workloads.local_ray import start_local_ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="failure-times-"))
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    start_local_ray()
    figures: dict[str, float | None] = {}
    try:
        # worker_killed
        plan, _ = local_plan(root / "worker", assets_dir=root / "assets", run_name="worker", max_failures=1, **JOB)
        marker = root / "worker.killed"
        found: dict[str, float | None] = {}

        def watch():
            while not marker.exists():
                time.sleep(0.05)
            t_kill = marker.stat().st_mtime
            t_next = _first_record_after(Path(plan.metrics_path), time.time())
            found["s"] = None if t_next is None else t_next - t_kill

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.time()
        run_training(plan, hooks=KillOnceAt(10, str(marker)))
        watcher.join(timeout=60)
        figures["worker_killed_to_training_s"] = found.get("s")
        figures["worker_killed_run_total_s"] = round(time.time() - started, 1)

        # rerun_after_abort
        plan, _ = local_plan(root / "abort", assets_dir=root / "assets", run_name="abort", max_failures=0, **JOB)
        marker = root / "abort.killed"
        try:
            result = run_training(plan, hooks=KillOnceAt(10, str(marker)))
            if result.error:
                raise result.error
        except Exception:  # noqa: BLE001 - the expected failure
            pass
        t0 = time.time()
        holder: dict[str, float | None] = {}
        watcher = threading.Thread(target=lambda: holder.update(s=_first_record_after(Path(plan.metrics_path), t0)),
                                   daemon=True)
        watcher.start()
        run_training(plan, hooks=KillOnceAt(10, str(marker)))
        watcher.join(timeout=60)
        figures["rerun_to_training_s"] = None if holder.get("s") is None else holder["s"] - t0
    finally:
        ray.shutdown()

    # storage_check_refusal
    from harness.loopback import MotoServer, PodIdentityEndpoint, s3_policy
    from workloads.fsdp_finetune.storage_check import storage_problem

    with MotoServer() as moto:
        moto.create_bucket("jobs-bucket")
        moto.create_bucket("other-bucket")
        keys = moto.assume_role(moto.create_role("pod", s3_policy("jobs-bucket")))
        with PodIdentityEndpoint(keys, moto.account_id) as endpoint:
            saved = dict(os.environ)
            os.environ.update(endpoint.exclusive_env(moto.endpoint_url))
            for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
                os.environ.pop(k, None)
            try:
                t0 = time.time()
                problem = storage_problem("s3://other-bucket/checkpoints", "run")
                figures["storage_check_refusal_s"] = time.time() - t0 if problem else None
            finally:
                os.environ.clear()
                os.environ.update(saved)
    print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
