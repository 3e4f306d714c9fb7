"""The run plan: what a fit needs to know (`RunPlan`), for the embedded local job and for a cluster run.

`local_job` is the tiny job of `--local`; `local_plan` and `cluster_plan` place a job (workers, storage,
export); `read_plan_prediction` reads what `python -m workloads.plan` predicted for the run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from config.model import ClusterConfig, JobConfig
from workloads.fsdp_finetune.run_folder import checkpoint_bucket
from workloads.local_ray import LOCAL_WORKERS


def local_job(assets, **overrides) -> JobConfig:
    """The embedded job of `--local`: sized to finish in about two minutes on two CPU cores.

    The tiny model (~0.33M parameters) learns single-digit addition in ChatML from 4,000 generated
    examples: 2 workers x micro-batch 8 x 2 accumulation steps = 32 sequences of 128 tokens per step
    (~4,000 tokens, ~120 answers), a high learning rate because the model starts from random
    weights, a checkpoint every third of the run and the held-out loss every sixth.
    """
    values = dict(
        model=str(assets.model_dir),
        dataset=str(assets.dataset_path),
        dataset_split="train",
        instruction_field="instruction",
        response_field="response",
        eval_fraction=0.0,  # the assets hold out their own questions (disjoint from training)
        seq_len=128,
        micro_batch_size=8,
        global_batch_size=32,
        learning_rate=3e-3,
        weight_decay=0.0,
        warmup_steps=10,
        max_steps=150,
        max_epochs_warning=10,  # about 7 epochs: the 100 addition facts are learned by repetition, on purpose
        grad_clip=1.0,
        mask_prompt=True,
        checkpoint_every=50,
        keep_checkpoints=2,
        report_every=5,
        eval_every=25,
        max_failures=1,
        activation_checkpointing=False,
        compile=False,
        attn_implementation="sdpa",
        seed=0,
        run_name="local-demo",
    )
    values.update(overrides)
    if values["checkpoint_every"] > values["max_steps"]:
        values["checkpoint_every"] = values["max_steps"]
    if values["warmup_steps"] >= values["max_steps"]:
        values["warmup_steps"] = values["max_steps"] // 10
    return JobConfig.model_validate(values)


@dataclass
class RunPlan:
    """Everything `run_training` needs: the job, where things go, and how many workers."""

    job: JobConfig
    storage_path: str
    export_uri: str
    num_workers: int
    use_gpu: bool
    cpus_per_worker: int
    grad_accumulation: int
    gpu_peak_tflops: float | None
    metrics_path: str | None = None
    run_dir: str | None = None  # metrics.jsonl, TensorBoard events, loss plot (tracking.RunTracker)
    eval_records: list[dict] | None = None  # held-out records that replace the job's split (local assets)
    sharding: str = "full"
    """Resolved sharding (`topology.mesh_plan`): full or hybrid."""
    ranks_per_node: int | None = None
    """Workers per node (None: all on one machine, as in a local run)."""
    plan_prediction: dict | None = None
    """The plan's `tokens_per_s` and `mfu` (`workloads.plan`), exported beside the measured figures."""
    storage_region: str | None = None
    """The AWS region of an s3:// `storage_path` (the variable file's `region`, where the storage stack makes the
    bucket). Known, it spares the driver pyarrow's lookup of the bucket's region (`S3Options::FromUri` asks S3
    for it unless the URI has `region=` or an endpoint is set, pyarrow 24): a request that, from a machine
    with no route to S3, ends only at a network timeout. None: looked up as before."""
    logical_gpus: bool = False
    """The cluster's GPUs are logical (`WorkerGroup.logical_gpus`, a lab on CPU nodes): CPU workers on gloo, each
    holding one `LOGICAL_GPU_RESOURCE` of a worker pod."""
    scrape_interval_s: int | None = None
    """Seconds between Prometheus' scrapes of the run's metrics (`observability.scrape_interval_s`; None: nothing
    scrapes them). The workers keep the final report's values up until one scrape has seen them."""


def local_plan(output_dir: str | os.PathLike, *, max_steps: int | None = None, assets_dir=None,
               **job_overrides) -> tuple[RunPlan, object]:
    """The plan of a local run under `output_dir` (assets generated under it unless `assets_dir`)."""
    from workloads.fsdp_finetune.local_assets import prepare_local_assets
    from workloads.fsdp_finetune.metrics import METRICS_FILE

    out = Path(output_dir).resolve()
    assets = prepare_local_assets(Path(assets_dir).resolve() if assets_dir else out / "assets")
    if max_steps is not None:
        job_overrides["max_steps"] = max_steps
    job = local_job(assets, **job_overrides)
    plan = RunPlan(
        job=job,
        storage_path=str(out),
        export_uri=str(out / "model"),
        num_workers=LOCAL_WORKERS,
        use_gpu=False,
        cpus_per_worker=1,
        grad_accumulation=job.grad_accumulation(LOCAL_WORKERS),
        gpu_peak_tflops=None,
        metrics_path=str(out / METRICS_FILE),
        run_dir=str(out),
        eval_records=assets.eval_records,
    )
    return plan, assets


def cluster_plan(config: ClusterConfig, *, job: JobConfig | None = None, storage_path: str | None = None,
                 bucket: str | None = None) -> RunPlan:
    """The plan of a cluster run: one worker per GPU of the variable file, checkpoints and export on S3.

    Without `storage_path` the checkpoints go to `config.checkpoint_uri` (the prefix the bucket's
    lifecycle rule expires) and the model to `config.export_uri` (kept); `bucket` defaults to
    `checkpoint_bucket(config)`; `job` defaults to the file's job section.
    """
    from workloads.fsdp_finetune.topology import mesh_plan

    job = job or config.job
    mesh = mesh_plan(config.model_copy(update={"job": job}))
    if storage_path:
        storage, export = storage_path, f"{storage_path.rstrip('/')}/{job.run_name}/model"
    else:
        bucket = bucket or checkpoint_bucket(config)
        storage, export = config.checkpoint_uri(bucket), config.export_uri(bucket)
    return RunPlan(
        # The job's role may write only the storage stack's bucket (stacks/storage.py `grant_job_access`), which
        # that stack makes in the file's region; so a `--storage-path` that can work at all is there too.
        storage_region=config.region,
        job=job,
        storage_path=storage,
        export_uri=export,
        num_workers=config.world_size,
        # Logical GPUs (a lab's CPU nodes, `logical_gpus`): Ray places the workers on the worker pods all the same
        # (the head has num-cpus 0), and the workers train on CPU with gloo, as a local run does.
        use_gpu=not config.uses_logical_gpus,
        logical_gpus=config.uses_logical_gpus,
        cpus_per_worker=config.cpus_per_worker,
        grad_accumulation=config.grad_accumulation,
        gpu_peak_tflops=None if config.uses_logical_gpus else config.gpu_peak_tflops,
        run_dir=f"{storage.rstrip('/')}/{job.run_name}",  # the run's own folder, beside Ray's checkpoints
        sharding=mesh.sharding,
        ranks_per_node=mesh.ranks_per_node,
        # The cluster's Prometheus scrapes the Ray pods (charts.monitoring's PodMonitor) when the stack is on.
        # Only the EKS target runs the metrics stack (stacks/observability.py); on EC2 nothing scrapes, so no hold.
        scrape_interval_s=(config.observability.scrape_interval_s
                           if config.observability.enabled and config.target == "eks" else None),
    )


def read_plan_prediction(path: str, *, run_name: str) -> dict | None:
    """The plan's prediction that job.sh had `python -m workloads.plan --prediction-out` write (None when it
    is missing, unreadable or for another run: the dashboards then show the measured figures alone)."""
    try:
        prediction = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return prediction if isinstance(prediction, dict) and prediction.get("run_name") == run_name else None
