"""Where a cluster run keeps its files: the checkpoint bucket and `<checkpoint URI>/<job.run_name>`.

Its own module, importing nothing else of the workload: job.sh's deadline check and follow.sh's log copy
(`deadline`, `job_logs`) need the run folder without the driver's imports (`launch` imports the training code,
which imports `job_logs`).
"""

from __future__ import annotations

import os


def checkpoint_bucket(config) -> str:
    """The checkpoint bucket: $CHECKPOINT_BUCKET, the file's `storage.bucket_name`, or the stacks' derived name."""
    bucket = os.environ.get("CHECKPOINT_BUCKET") or config.storage.bucket_name
    if not bucket:
        import boto3

        account = boto3.client("sts", region_name=config.region).get_caller_identity()["Account"]
        bucket = config.bucket_name(account)
    return bucket


def run_dir_of(config) -> str:
    """The run's folder, as `run_plan.cluster_plan` names it without `--storage-path`."""
    return f"{config.checkpoint_uri(checkpoint_bucket(config)).rstrip('/')}/{config.job.run_name}"
