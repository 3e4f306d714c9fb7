"""The trainer factory: Ray Train's `TorchTrainer` for a `RunPlan`, and `run_training` to fit it."""

from __future__ import annotations

from config.topology import LOGICAL_GPU_RESOURCE
from workloads.fsdp_finetune.run_plan import RunPlan


def build_trainer(plan: RunPlan, **extra):
    """The `TorchTrainer` with `ScalingConfig`, `RunConfig`, `FailureConfig` and `CheckpointConfig`."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from workloads.fsdp_finetune.train import make_train_config, train_func

    job = plan.job
    resources = {"CPU": plan.cpus_per_worker}
    if plan.use_gpu:
        resources["GPU"] = 1
    elif plan.logical_gpus:
        resources[LOGICAL_GPU_RESOURCE] = 1
    train_config = make_train_config(job.model_dump(), grad_accumulation=plan.grad_accumulation,
                                     gpu_peak_tflops=plan.gpu_peak_tflops, export_uri=plan.export_uri,
                                     run_dir=plan.run_dir, eval_records=plan.eval_records,
                                     driver_progress=plan.metrics_path is not None, sharding=plan.sharding,
                                     ranks_per_node=plan.ranks_per_node, storage_path=plan.storage_path,
                                     plan_prediction=plan.plan_prediction,
                                     scrape_interval_s=plan.scrape_interval_s, **extra)
    # A hung collective fails after job.collective_timeout_minutes (PyTorch's default is 30), and
    # the NCCL flight recorder (charts' pod env) dumps what every rank was doing. Ray Train 2.58 passes
    # whole seconds to init_process_group (ray/train/torch/config.py `_setup_torch_process_group`):
    # at least 1, since a setting under half a second rounded to 0 and a 0 s timeout fails the
    # process group's own rendezvous ("client socket has timed out after 0ms", PyTorch 2.13 TCPStore).
    timeout_s = max(1, round(job.collective_timeout_minutes * 60))
    return TorchTrainer(
        train_func,
        train_loop_config=train_config,
        torch_config=TorchConfig(backend="nccl" if plan.use_gpu else "gloo", timeout_s=timeout_s),
        scaling_config=ScalingConfig(num_workers=plan.num_workers, use_gpu=plan.use_gpu,
                                     resources_per_worker=resources),
        run_config=RunConfig(
            name=job.run_name,
            **_ray_storage(plan.storage_path, plan.storage_region),
            failure_config=FailureConfig(max_failures=job.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=job.keep_checkpoints),
        ),
    )


def _ray_storage(storage_path: str, region: str | None = None) -> dict:
    """`RunConfig`'s storage: on S3 the filesystem itself, with `checkpoint.patient`'s timeouts (Ray would build
    pyarrow's default one from the URI, whose 3 s stall limit can fail a fit mid-upload); elsewhere the path.
    `region` (`RunPlan.storage_region`) goes into the URI as pyarrow's `region=` option."""
    import pyarrow.fs as pafs

    from workloads.fsdp_finetune.checkpoint import filesystem

    if storage_path.startswith("s3://"):
        uri = f"{storage_path}?region={region}" if region and "?" not in storage_path else storage_path
        try:
            fs, path = filesystem(uri)  # without a region: resolves the bucket's, a request to S3
        except OSError:  # no route or no bucket from here: Ray resolves the URI itself at fit, as before
            return {"storage_path": storage_path}
        if isinstance(fs, pafs.S3FileSystem):
            return {"storage_path": path, "storage_filesystem": fs}
    return {"storage_path": storage_path}


def run_training(plan: RunPlan, **extra):
    """Run `fit()` for the plan and return Ray's `Result` (raises if training fails for good)."""
    return build_trainer(plan, **extra).fit()
