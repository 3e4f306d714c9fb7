"""A driver process for tests/test_driver_kill.py: its own local Ray cluster, one fit() of the tiny job.

    python -m tests.driver_run OUTPUT_DIR RUN_NAME

The test runs it in a new process group and SIGKILLs the whole group mid-run, as a lost head or a
killed `ray job` entrypoint would end it, then runs it again under the same run name.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.test_train_ray import JOB


def main(out: str, name: str) -> int:
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    from workloads.fsdp_finetune.launch import local_plan, run_training, start_local_ray

    start_local_ray()
    root = Path(out)
    plan, _ = local_plan(root / name, assets_dir=root / "assets", run_name=name, **{**JOB, "report_every": 1})
    result = run_training(plan)
    return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
