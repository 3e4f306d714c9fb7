"""Seconds from a hung collective to training again, on a local Ray cluster (2 CPU workers, gloo).

    python bench/hang_time.py [--out DIR] [--timeout-minutes 0.1]

The job of tests/test_hang.py (`harness.driver_run.JOB`: 12 steps, a checkpoint every 4): the last rank stops
before step 7's collectives (`hang_at_step=6`, `train_hooks.HangOnceAt`); rank 0's all_reduce fails after
`collective_timeout_minutes`, Ray Train restarts the group, which resumes from checkpoint 4.
Printed (one JSON line):

* `hang_to_timeout_s`: the hang marker's time to rank 0's error line in `logs/rank-0.log`
  (the collective timeout plus the steps rank 0 still trains before it waits);
* `timeout_to_training_s`: that error to the resumed group's first metrics record (group shutdown
  and kill, a new group, model load, checkpoint restore, then 2 steps to the first report);
* `hang_to_training_s`: the sum; `run_total_s`: the whole `fit()`.

Loopback only, bounded (one 12-step job). Figures depend on the machine's load: on a shared 2-core
machine they are upper bounds. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _first_resumed_record(path: Path, timeout_s: float = 600) -> float | None:
    """Wall time at which `path` first holds a record trained after a resume (polled), or None."""
    from workloads.fsdp_finetune.metrics import read_metrics

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if any(r.get("resumed_from_step") for r in read_metrics(path)):
                return time.time()
        except (OSError, ValueError):  # not there yet, or a line being written
            pass
        time.sleep(0.05)
    return None


def _error_time(rank_log: Path) -> float | None:
    """Wall time of the first `rank 0 failed` line (RankTail's asctime, local time, millisecond precision)."""
    for line in rank_log.read_text().splitlines():
        if "rank 0 failed" in line:
            stamp = " ".join(line.split(" ", 2)[:2])  # "2026-12-03 09:30:01,123"
            return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def main() -> int:
    import ray

    from harness.driver_run import HANG_AT, JOB
    from workloads.fsdp_finetune.run_plan import local_plan
    from workloads.fsdp_finetune.train_hooks import HangOnceAt
    from workloads.fsdp_finetune.trainer import run_training
    from workloads.local_ray import start_local_ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--timeout-minutes", type=float, default=0.1)
    args = parser.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="hang-time-"))
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    start_local_ray()
    try:
        plan, _ = local_plan(root / "hung", assets_dir=root / "assets", run_name="hung", max_failures=1,
                             collective_timeout_minutes=args.timeout_minutes, **JOB)
        marker = root / "hung.marker"
        found: dict[str, float | None] = {}

        def watch():
            while not marker.exists():
                time.sleep(0.05)
            found["hang"] = marker.stat().st_mtime
            found["training"] = _first_resumed_record(Path(plan.metrics_path))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.time()
        result = run_training(plan, hooks=HangOnceAt(HANG_AT, str(marker)))
        total = time.time() - started
        watcher.join(timeout=60)
    finally:
        ray.shutdown()
    error = _error_time(Path(plan.run_dir) / "logs" / "rank-0.log")
    hang, training = found.get("hang"), found.get("training")
    figures = {
        "collective_timeout_s": round(args.timeout_minutes * 60, 1),
        "hang_to_timeout_s": None if None in (hang, error) else error - hang,
        "timeout_to_training_s": None if None in (error, training) else training - error,
        "hang_to_training_s": None if None in (hang, training) else training - hang,
        "run_total_s": total,
        "ok": result.error is None,
    }
    print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
