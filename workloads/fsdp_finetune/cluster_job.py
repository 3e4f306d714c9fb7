"""The cluster run of the driver: settings and token checks, the plan, storage check, job deadline, preflight, fit.

The driver marks its log with each stage it enters (`stage`); `workloads.verify` names the last one when a job
fails.
"""

from __future__ import annotations

import json
import sys

from config.errors import UserError
from config.model import ClusterConfig, JobConfig
from config.observability import PLAN_PREDICTION_FILE
from workloads.fsdp_finetune.data import dataset_epochs
from workloads.fsdp_finetune.run_plan import RunPlan, cluster_plan, read_plan_prediction
from workloads.fsdp_finetune.settings import refuse, resume_problem, token_problems, validate_job, with_secret_arn
from workloads.fsdp_finetune.trainer import run_training


def stage(name: str) -> None:
    """Mark the driver's log with the stage it enters; `workloads.verify` names the last one when a job fails."""
    print(f"JOB_STAGE {name}", file=sys.stderr, flush=True)


def main_cluster(args, config: ClusterConfig, file: str) -> int:
    """The cluster driver: refuse bad settings, plan, then storage check, deadline, preflight and fit."""
    from botocore.exceptions import BotoCoreError

    try:
        return _checked_run(args, config, file)
    except BotoCoreError as exc:  # no credentials, no route to AWS: one line, not botocore's traceback
        raise UserError(f"cannot reach AWS ({type(exc).__name__}: {exc}); a cluster run needs the job's AWS "
                        "credentials (Pod Identity on EKS, the instance profile on EC2). On this machine: python -m "
                        "workloads.fsdp_finetune --local", file=file) from None


def _checked_run(args, config: ClusterConfig, file: str) -> int:
    stage("settings")
    job = config.job if args.max_steps is None else config.job.model_copy(update={"max_steps": args.max_steps})
    # The Hub token first: the dataset check below may already ask the Hub. Then settings: the bucket
    # lookup below needs AWS credentials, and a bad setting should be reported as such, not hidden
    # behind an STS error.
    refuse(token_problems(job, source=file, region=config.region))
    job = with_secret_arn(job)
    refuse(validate_job(job, world_size=config.world_size, source=file))
    dataset_epochs(job, world_size=config.world_size)  # formatted tokens and epochs, before any worker starts
    plan = cluster_plan(config, job=job, storage_path=args.storage_path)
    plan.plan_prediction = read_plan_prediction(PLAN_PREDICTION_FILE, run_name=job.run_name)
    refuse([p for p in [resume_problem(plan, source=file)] if p])
    from workloads.fsdp_finetune.job_logs import DriverLog

    # From here on the driver's output (Ray's forwarded worker lines too) is copied beside the metrics.
    with DriverLog(plan.run_dir):
        return _run_cluster_job(config, job, plan)


def _run_cluster_job(config: ClusterConfig, job: JobConfig, plan: RunPlan) -> int:
    """Storage check, job deadline, preflight, training: the cluster driver once its plan is known."""
    from workloads.fsdp_finetune.storage_check import storage_problem

    stage("storage")
    problem = storage_problem(plan.storage_path, plan.job.run_name)
    if problem:
        print(f"storage check failed; not starting training: {problem}", file=sys.stderr)
        return 1
    from workloads.fsdp_finetune.deadline import (
        EXIT_DEADLINE,
        NOT_RETRIED,
        DeadlineWatch,
        current,
        spent_message,
        stale_after_s,
        start_or_resume,
    )

    # KubeRay restarts activeDeadlineSeconds at every retry: the job's own deadline spans them all. job.sh's first
    # step recorded it for this attempt (and stopped a spent one before any work); a driver started another way
    # (`ray job submit ... python -m workloads.fsdp_finetune`) records it here.
    stale = stale_after_s(job.start_deadline_minutes)
    deadline = current(plan.run_dir, stale_after_s=stale) or start_or_resume(
        plan.run_dir, timeout_s=job.timeout_hours * 3600, stale_after_s=stale)
    if deadline.remaining() <= 0:
        stage("deadline")
        print(f"{spent_message(deadline, job.timeout_hours)}; {NOT_RETRIED}", file=sys.stderr)
        return EXIT_DEADLINE
    if config.ray.preflight:
        from workloads.preflight import run_preflight

        stage("preflight")
        report = run_preflight(config, local=False)
        print(report.render())
        if not report.ok:
            print("preflight failed; not starting training", file=sys.stderr)
            return 1
    stage("train")
    with DeadlineWatch(plan.run_dir, deadline, job.timeout_hours):
        result = run_training(plan)
    print(json.dumps({"checkpoint": getattr(result.checkpoint, "path", None), "model": plan.export_uri,
                      "metrics": result.metrics}, default=str))
    return 0
