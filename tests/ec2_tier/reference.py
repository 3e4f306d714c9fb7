"""The unbroken reference of the tier's fine-tune: the same plan, trained on this machine without a break.

    python -m tests.ec2_tier.reference VARIABLE_FILE MODEL_DIR OUT_DIR

The plan is `workloads.fsdp_finetune.run_plan.cluster_plan` of the variable file, the one the job's driver builds in
the head container (same job, world size, sharding, ranks per node, seed), with three differences that change
where things go, not what is trained: storage and export under OUT_DIR instead of the bucket, the model read from
MODEL_DIR (the files the tier uploaded to where `job.model` points), and the workers placed by CPU alone on a local
Ray cluster (`logical_gpus` only steers placement onto the worker node). The data order depends on the job's seed
alone (workloads/fsdp_finetune/data.py), so a resumed run on the cluster that restored its checkpoint exactly ends
with the same per-step losses and weights, bit for bit (tests/test_driver_kill.py compares the same way).

Writes OUT_DIR/<run_name>/metrics.jsonl and OUT_DIR/<run_name>/model/ (rank 0's tracker and the export), exit 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.ec2_tier.reference")
    parser.add_argument("file", type=Path)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from config import load_config
    from workloads.fsdp_finetune.run_plan import cluster_plan
    from workloads.fsdp_finetune.trainer import run_training
    from workloads.local_ray import start_local_ray

    config = load_config(args.file)
    job = config.job.model_copy(update={"model": str(args.model_dir.resolve())})
    args.out.mkdir(parents=True, exist_ok=True)
    plan = cluster_plan(config, job=job, storage_path=str(args.out.resolve()))
    plan.storage_region = None
    plan.logical_gpus = False  # placement only: a local cluster has CPUs, no logical-GPU resource
    start_local_ray()
    result = run_training(plan)
    return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
