"""`python -m tests.hf_token_run SPEC.json`: the job's start-up and a tiny Ray Train run, as on a pod.

Run by tests/test_hf_token_job.py in a child process whose environment holds only what a pod has:
the Pod-Identity-style credential endpoint, the S3/Secrets Manager endpoint, HF_ENDPOINT (the Hub
stand-in) and no token. The driver's start-up (`settings.token_problems`) fetches the token; the
workers fetch their own in `train_func`; the model comes from the Hub with it. Ray's session folder
is SPEC["ray_dir"], so the test can search all of it. Prints one JSON line with what it saw.
"""

from __future__ import annotations

import json
import os
import sys


def main(spec_file: str) -> int:
    spec = json.loads(open(spec_file).read())
    import ray

    from workloads.fsdp_finetune.run_plan import local_plan
    from workloads.fsdp_finetune.settings import refuse, token_problems, with_secret_arn
    from workloads.fsdp_finetune.trainer import run_training
    from workloads.local_ray import LOCAL_WORKERS, loopback_only

    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    # The cluster first, as on EKS where it runs before the job: its processes do not inherit the
    # driver's token (each worker fetches its own).
    loopback_only()
    ray.init(num_cpus=LOCAL_WORKERS + 1, include_dashboard=False, log_to_driver=True, configure_logging=False,
             _temp_dir=spec["ray_dir"])
    try:
        plan, _ = local_plan(spec["out"], assets_dir=spec["assets"], **spec["job"])
        plan.storage_path = spec["storage"]
        plan.run_dir = f"{spec['storage']}/{plan.job.run_name}"
        plan.export_uri = f"{spec['storage']}/{plan.job.run_name}/model"
        plan.metrics_path = None
        refuse(token_problems(plan.job, source="spec", region=None))
        plan.job = with_secret_arn(plan.job)  # as _main_cluster does
        driver_has_token = bool(os.environ.get("HF_TOKEN"))
        result = run_training(plan)
        print(json.dumps({"driver_has_token": driver_has_token, "error": repr(result.error) if result.error else None,
                          "checkpoint": result.checkpoint.path if result.checkpoint else None}), flush=True)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    from config.errors import run_cli

    run_cli(main, sys.argv[1])
