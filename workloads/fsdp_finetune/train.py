"""The per-worker training function (`train_func`) and the pieces it is built from.

`train_func(config)` runs once on every Ray Train worker. `config` is plain data (see
`make_train_config`): the job settings as a dict plus the numbers derived from the variable
file, so it pickles without the pydantic model. The same `train_step` drives the benchmarks.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from workloads.fsdp_finetune.checkpoint import export_hf_model, load_checkpoint, node_copy, save_checkpoint
from workloads.fsdp_finetune.data import IGNORE_INDEX, to_device
from workloads.fsdp_finetune.evaluate import HeldOutLoss
from workloads.fsdp_finetune.loss import DEFAULT_CHUNK_TOKENS, loss_sum
from workloads.fsdp_finetune.metrics import mfu, peak_memory_gib
from workloads.fsdp_finetune.model import build_model, count_params, fetch_weights, saved_dtype, shard_model
from workloads.fsdp_finetune.topology import build_mesh, check_placement, node_name, plan_from
from workloads.fsdp_finetune.train_hooks import CHECKPOINT_PREFIX, TrainHooks, hooks_from
from workloads.hf_token import install_token

log = logging.getLogger("fsdp_finetune")


class ResumeError(RuntimeError):
    """The run's latest checkpoint is past `job.max_steps` (a rerun with fewer steps under the same name)."""


def resume_conflict(checkpoint_step: int, max_steps: int, run_name: str) -> str | None:
    """Why resuming at `checkpoint_step` cannot honour `max_steps`, or None when it can."""
    if checkpoint_step <= max_steps:
        return None
    return (f"run '{run_name}' already has a checkpoint at step {checkpoint_step}, past max_steps={max_steps}; "
            f"resuming would train nothing and export that later model. Use a new job.run_name (or another "
            f"output/storage directory) for a shorter run, or max_steps >= {checkpoint_step} to continue it")


def make_train_config(job: dict, *, grad_accumulation: int, gpu_peak_tflops: float | None, export_uri: str,
                      run_dir: str | None = None, eval_records: list[dict] | None = None,
                      driver_progress: bool = False, sharding: str | None = None,
                      ranks_per_node: int | None = None, plan_prediction: dict | None = None,
                      scrape_interval_s: int | None = None, **extra) -> dict:
    """The plain-data config every worker receives.

    `job` is `JobConfig.model_dump()`; `export_uri` is where rank 0 writes the final Hugging Face
    model; `run_dir` (a local path or a storage URI) is where rank 0 keeps the run's metrics.jsonl,
    TensorBoard events and loss plot (`tracking.RunTracker`). `eval_records` replace the held-out
    split (the local assets hold out their own questions); `driver_progress` says the driver draws
    a progress bar from metrics.jsonl, so rank 0 does not also log every report. `sharding`
    (resolved: full or hybrid; default `job["sharding"]`) and `ranks_per_node` (default: all ranks
    on one node) are the variable file's topology (`topology.mesh_plan`). `plan_prediction` (the plan's
    `tokens_per_s` and `predicted_mfu` as `mfu`) is exported beside the measured figures. `extra` carries
    `storage_path` (Ray's storage; it keys the checkpoint staging folder, `checkpoint_staging_dir`) and, from tests,
    `hooks`: a `train_hooks.TrainHooks` that `train_func` calls at each step (`KillOnceAt` kills the last rank once,
    to exercise restarts; `HangOnceAt` stops it once before the step's collectives, a hung collective for the
    others).
    """
    return {
        "job": dict(job),
        "grad_accumulation": int(grad_accumulation),
        "gpu_peak_tflops": gpu_peak_tflops,
        "export_uri": export_uri,
        "run_dir": run_dir,
        "eval_records": eval_records,
        "driver_progress": driver_progress,
        "sharding": sharding or job.get("sharding", "auto"),
        "ranks_per_node": ranks_per_node,
        "plan_prediction": plan_prediction,
        "scrape_interval_s": scrape_interval_s,
        **extra,
    }


def worker_mesh_plan(config: dict, world: int):
    """The mesh plan of this run's `world` workers from the config's topology (`make_train_config`)."""
    return plan_from(config.get("sharding") or config["job"].get("sharding", "auto"), world_size=world,
                     ranks_per_node=config.get("ranks_per_node") or world)


# ---- optimisation ---------------------------------------------------------------------------


def build_optimizer(model, job: dict, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not on norms and biases); fused kernel on GPU."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": job["weight_decay"]},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=job["learning_rate"], betas=(0.9, 0.95), eps=1e-8,
                             fused=device.type == "cuda")


def lr_factor(step: int, *, warmup_steps: int, max_steps: int) -> float:
    """Multiplier of the peak learning rate at `step` (0-based): linear warm-up, then cosine to zero."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def build_scheduler(optimizer, job: dict) -> torch.optim.lr_scheduler.LambdaLR:
    """Warm-up then cosine, stepped once per optimizer step."""
    warmup, total = job["warmup_steps"], job["max_steps"]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, warmup_steps=warmup, max_steps=total))


def train_step(model, optimizer, micro_batches: list[dict], *, grad_clip: float, device: torch.device,
               chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> dict:
    """One optimizer step over `micro_batches` (this rank's share of the global batch).

    The loss is the sum of token losses over the whole accumulation window on every rank,
    divided by the number of label tokens in that window across all ranks, so accumulation and
    data parallelism give exactly the gradient of one big batch, whatever the padding or prompt
    masking per micro-batch. FSDP averages gradients over ranks; the `world` factor undoes that.
    The loss is `loss.loss_sum` (LM head and cross-entropy in chunks of `chunk_tokens` positions).
    Returns tensors (no host sync): `loss_sum`, `label_tokens` (global), `grad_norm`, and the
    int `tokens` this rank processed.
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    # Every micro-batch goes to the device first and the labels are counted there: counting on the
    # host and copying the scalar over would be a blocking host-to-device copy at each step's start.
    # (position_ids and flash's varlen arguments travel with them.)
    micro_batches = [to_device(mb, device) for mb in micro_batches]
    label_tokens = torch.zeros((), dtype=torch.int64, device=device)
    for mb in micro_batches:
        label_tokens += (mb["labels"][:, 1:] != IGNORE_INDEX).sum()
    if dist.is_initialized():
        dist.all_reduce(label_tokens)
    scale = world / label_tokens.clamp(min=1).to(torch.float32)
    summed_loss = torch.zeros((), dtype=torch.float32, device=device)
    tokens = 0
    # Gradients are reduce-scattered after every micro-batch (FSDP2's default), not only after the
    # last one (`set_requires_gradient_sync(False)`): skipping the sync keeps each rank's full,
    # unsharded fp32 gradients alive across the window, 4 bytes per parameter (6 GB for 1.5B, a
    # quarter of an L4), while reducing every time keeps only this rank's 1/world shard, into which
    # FSDP2 accumulates. Reduction is linear, so the sum of reduced micro-batch gradients is the
    # reduced sum: the step is the same up to float rounding, for one extra reduce-scatter per
    # micro-batch that overlaps the backward pass. Under hybrid sharding that reduce-scatter stays in
    # the node; the all-reduce across nodes (the replicate dimension) runs only on the window's last
    # micro-batch, on the sum FSDP2 has accumulated in each rank's gradient shard
    # (`set_requires_all_reduce`; a no-op under full sharding, which has no replicate dimension).
    fsdp = hasattr(model, "set_requires_all_reduce")
    for i, mb in enumerate(micro_batches):
        inputs = dict(mb)  # position_ids (and flash's varlen arguments) go to the model too
        input_ids, labels = inputs.pop("input_ids"), inputs.pop("labels")
        if fsdp:
            model.set_requires_all_reduce(i == len(micro_batches) - 1)
        token_loss = loss_sum(model, input_ids, labels, chunk_tokens=chunk_tokens, **inputs)
        (token_loss * scale).backward()
        summed_loss += token_loss.detach()
        tokens += input_ids.numel()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if dist.is_initialized():
        dist.all_reduce(summed_loss)
    return {"loss_sum": summed_loss, "label_tokens": label_tokens, "grad_norm": grad_norm, "tokens": tokens}


# ---- the model ---------------------------------------------------------------------------------


def build_sharded_model(job: dict, path: str, *, device: torch.device, mesh=None, local_rank: int = 0,
                        local_world: int = 1):
    """(the sharded model to train, the PeftModel around it or None): `job.method` full or lora.

    full: fp32 master weights, every parameter trained. lora (`lora.py`): the base loaded in bf16 on GPU (fp32
    on CPU), frozen, PEFT's adapters injected before sharding, only they train. Under LoRA the node's ranks load
    one after the other (each frees its full host copy once `fully_shard` has moved its shard to the GPU): the
    models LoRA is for do not fit the host memory once per GPU (Qwen2.5-32B in bf16 is 61 GiB; four at once
    would be 244 GiB on a 192 GiB g6.12xlarge). `fully_shard` involves no collective, so the barriers between
    turns are the only waits. Every rank must call this (it contains collectives under LoRA).
    """
    lora = job.get("method", "full") == "lora"
    peft_model = None
    for turn in range(local_world if lora and dist.is_initialized() else 1):
        if not lora or turn == local_rank or not dist.is_initialized():
            dtype = torch.bfloat16 if lora and device.type == "cuda" else torch.float32
            model = build_model(path, attn_implementation=job["attn_implementation"], device=device, dtype=dtype)
            if lora:
                from workloads.fsdp_finetune.lora import apply_lora

                peft_model = apply_lora(model, job["lora"], seed=job["seed"], base_model=job["model"])
            shard_model(model, device=device, mesh=mesh, reduce_dtype=job["reduce_dtype"],
                        activation_checkpointing=job["activation_checkpointing"], compile=job["compile"])
        if lora and dist.is_initialized():
            dist.barrier()
    return model, peft_model


# ---- the worker ------------------------------------------------------------------------------


def _setup_logging(rank: int) -> None:
    # Rank 0 speaks for the group; other ranks only report problems.
    level = logging.INFO if rank == 0 else logging.WARNING
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[fsdp_finetune rank %(rank)s] %(message)s"))
        handler.addFilter(lambda record: setattr(record, "rank", rank) or True)
        log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False


def train_func(config: dict) -> None:
    """Fine-tune on this worker: build, shard, restore, train, checkpoint, report, export."""
    import ray.train

    ctx = ray.train.get_context()
    rank, world, local_rank = ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank()
    _setup_logging(rank)
    # Every rank's last lines go beside the metrics, so they outlive the Ray cluster (job_logs).
    from workloads.fsdp_finetune.job_logs import attach_rank_tail

    tail = attach_rank_tail(log, config.get("run_dir"), rank)
    hooks = hooks_from(config)  # the one test seam: the no-op TrainHooks unless a test passed its own
    try:
        _train(config, ctx, rank, world, local_rank, hooks)
    except BaseException:
        log.exception("rank %d failed", rank)
        raise
    finally:
        if tail is not None:
            tail.flush()


@dataclass
class _Worker:
    """What this rank trains with: the config, the sharded model, its optimizer and data, where reports go."""

    config: dict
    rank: int
    world: int
    local_rank: int
    device: torch.device
    mesh_plan: object
    mesh: object
    path: str
    tokenizer: object
    batches: object
    held_out_records: list
    model: object = None
    peft_model: object = None
    export_dtype: object = None
    n_params: int = 0
    optimizer: object = None
    scheduler: object = None
    step: int = 0
    start_step: int = 0

    @property
    def job(self) -> dict:
        return self.config["job"]


@dataclass
class _Window:
    """The steps since the last report: their tokens, losses and data waits, averaged at the next report."""

    start: float = field(default_factory=time.perf_counter)
    steps: int = 0
    tokens: int = 0
    data_wait: float = 0.0
    loss: list = field(default_factory=list)
    label_tokens: list = field(default_factory=list)

    def add(self, out: dict) -> None:
        """Count one step's `train_step` output."""
        self.steps += 1
        self.tokens += out["tokens"]
        self.loss.append(out["loss_sum"])
        self.label_tokens.append(out["label_tokens"])

    def clear(self) -> None:
        """Start the next window's counts (its clock was restarted at the report)."""
        self.steps, self.tokens, self.data_wait = 0, 0, 0.0
        self.loss, self.label_tokens = [], []


def _train(config: dict, ctx, rank: int, world: int, local_rank: int, hooks: TrainHooks) -> None:
    """The body of `train_func`, on this rank."""
    worker = _prepare(config, rank=rank, world=world, local_rank=local_rank)
    _build(worker, local_rank=local_rank, local_world=ctx.get_local_world_size())
    _restore(worker)
    job = worker.job
    log.info("model %s: %.1fM parameters, world size %d, %d micro-batches of %d x %d per step, %s sharding "
             "(mesh %s over %d node(s))", job["model"], worker.n_params / 1e6, world, config["grad_accumulation"],
             job["micro_batch_size"], job["seq_len"], worker.mesh_plan.sharding, worker.mesh_plan.mesh_shape,
             worker.mesh_plan.nodes)
    from workloads.fsdp_finetune.prometheus import training_gauges

    reports = _Reports(
        held_out=_held_out(config, worker.held_out_records, worker.tokenizer, rank=rank, world=world),
        tracker=_tracker(config, resume_step=worker.step, world=world) if rank == 0 else None,
        gauges=training_gauges(job["run_name"], rank=rank, plan_prediction=config.get("plan_prediction")),
        staging=_checkpoint_staging(job["run_name"], rank, config.get("storage_path")),
        peak=config.get("gpu_peak_tflops") if worker.device.type == "cuda" else None,
    )
    _loop(worker, reports, hooks)
    _export(worker)
    reports.close(config.get("scrape_interval_s"))


def _prepare(config: dict, *, rank: int, world: int, local_rank: int) -> _Worker:
    """Seed, placement and mesh, the Hub token, the weights, tokenizer and this rank's batches."""
    import ray.train
    import ray.train.torch
    from transformers import AutoTokenizer

    from workloads.fsdp_finetune.data import ShardedBatches, build_datasets, uses_varlen
    from workloads.fsdp_finetune.model import resolve_attn_implementation

    job = config["job"]
    device = ray.train.torch.get_device()
    if device.type == "cpu":
        # Ray sets OMP_NUM_THREADS to the worker's CPUs; keep torch's intra-op pool to that.
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    # A different seed per rank, on purpose. Nothing that must agree across ranks draws from this
    # generator: the weights come from the checkpoint (`from_pretrained`), and the data order from
    # its own (seed, epoch) permutation. What does draw from it (dropout, if the model has any) should
    # differ per rank, or every data-parallel replica would drop the same units.
    torch.manual_seed(job["seed"] + rank)

    # Placement first: a shard group Ray spread over two nodes fails here, before any download.
    mesh_plan = worker_mesh_plan(config, world)
    check_placement(mesh_plan, node_name(ray.get_runtime_context().get_node_id()))
    mesh = build_mesh(mesh_plan, device.type)

    # The Hub token (job.hf_token_secret) into this process only, through the worker's own AWS
    # credentials: it never travels through Ray (workloads.hf_token).
    install_token(job.get("hf_token_secret"))
    path = fetch_weights(job["model"], local_rank=local_rank)
    tokenizer = AutoTokenizer.from_pretrained(path)
    train_ds, held_out_records = build_datasets(_job_for_data(job), tokenizer)
    batches = ShardedBatches(train_ds, rank=rank, world_size=world, micro_batch_size=job["micro_batch_size"],
                             seed=job["seed"], varlen=uses_varlen(resolve_attn_implementation(
                                 job["attn_implementation"], device)))
    return _Worker(config=config, rank=rank, world=world, local_rank=local_rank, device=device, mesh_plan=mesh_plan,
                   mesh=mesh, path=path, tokenizer=tokenizer, batches=batches, held_out_records=held_out_records)


def _build(worker: _Worker, *, local_rank: int, local_world: int) -> None:
    """The sharded model on this rank's mesh, its optimizer and learning-rate schedule."""
    job, path = worker.job, worker.path
    worker.model, worker.peft_model = build_sharded_model(job, path, device=worker.device, mesh=worker.mesh,
                                                          local_rank=local_rank, local_world=local_world)
    worker.export_dtype = saved_dtype(path)
    worker.n_params = count_params(worker.model)
    if worker.peft_model is not None:
        from workloads.fsdp_finetune.lora import trainable_count

        log.info("LoRA rank %d on %s: %.2fM trainable parameters (%.2f%%), the base frozen", job["lora"]["rank"],
                 ",".join(job["lora"]["target_modules"]), trainable_count(worker.model) / 1e6,
                 100 * trainable_count(worker.model) / worker.n_params)
    worker.optimizer = build_optimizer(worker.model, job, worker.device)
    worker.scheduler = build_scheduler(worker.optimizer, job)


def _restore(worker: _Worker) -> None:
    """Resume from the checkpoint Ray Train hands this attempt, if any (model, optimizer, schedule, data order)."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return
    with node_copy(checkpoint, local_rank=worker.local_rank) as directory:
        restored = load_checkpoint(directory, model=worker.model, optimizer=worker.optimizer,
                                   scheduler=worker.scheduler, device=worker.device)
    worker.step = worker.start_step = restored["step"]
    # The driver refuses this before starting workers (settings.resume_problem) when it can read
    # the storage; this is the backstop.
    conflict = resume_conflict(worker.step, worker.job["max_steps"], worker.job["run_name"])
    if conflict:
        raise ResumeError(conflict)
    worker.batches.load_state_dict(restored["data"])
    log.info("resumed from %s at step %d", checkpoint.path, worker.step)


@dataclass
class _Reports:
    """Where this rank's reports go: the held-out scorer, rank 0's tracker, the gauges, the checkpoint staging."""

    held_out: HeldOutLoss | None
    tracker: object
    gauges: object
    staging: str
    peak: float | None

    def publish(self, metrics: dict, *, plot: bool) -> None:
        """The report's figures to the tracker (metrics.jsonl, TensorBoard) and the Prometheus gauges."""
        if self.tracker is not None:
            self.tracker.log(metrics, plot=plot)
        if self.gauges is not None:
            self.gauges.report(metrics)

    def close(self, scrape_interval_s: int | None) -> None:
        """Close the tracker, then the gauges."""
        if self.tracker is not None:
            self.tracker.close()
        if self.gauges is not None:
            # Last: the final report's values stay up through the export, and until a scrape has surely seen them.
            self.gauges.close(scrape_interval_s=scrape_interval_s)


def _loop(worker: _Worker, reports: _Reports, hooks: TrainHooks) -> None:
    """Train from `worker.step` to `max_steps`, reporting, evaluating and checkpointing on the job's schedule."""
    job, config = worker.job, worker.config
    batch_iter = iter(worker.batches)
    window = _Window()
    last_grad_norm = torch.zeros(())
    if reports.held_out is not None and worker.step == 0:
        # The untrained model's held-out loss: the curve's starting point (a collective: every rank scores).
        baseline = {"step": 0, **reports.held_out(worker.model, worker.device)}
        if reports.tracker is not None:
            reports.tracker.log(baseline)
        if reports.gauges is not None:
            reports.gauges.report(baseline)
        window.start = time.perf_counter()
    while worker.step < job["max_steps"]:
        hooks.on_step(worker.step, rank=worker.rank, world=worker.world, job=job)
        lr = worker.scheduler.get_last_lr()[0]
        fetch_start = time.perf_counter()
        micro = [next(batch_iter) for _ in range(config["grad_accumulation"])]
        window.data_wait += time.perf_counter() - fetch_start
        out = train_step(worker.model, worker.optimizer, micro, grad_clip=job["grad_clip"], device=worker.device)
        worker.scheduler.step()
        worker.step += 1
        window.add(out)
        last_grad_norm = out["grad_norm"]
        step = worker.step
        save = step % job["checkpoint_every"] == 0 or step == job["max_steps"]
        evaluate_now = reports.held_out is not None and (step % job["eval_every"] == 0 or step == job["max_steps"])
        if save or evaluate_now or step % job["report_every"] == 0:
            _report(worker, reports, window, lr=lr, grad_norm=last_grad_norm, save=save, evaluate_now=evaluate_now)
            window.clear()


def _window_metrics(worker: _Worker, window: _Window, *, lr: float, grad_norm, peak: float | None) -> dict:
    """The report's figures: the window's averages (one host sync per report, not per step)."""
    job, device = worker.job, worker.device
    loss = float(torch.stack(window.loss).sum() / torch.stack(window.label_tokens).sum().clamp(min=1))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    now = time.perf_counter()
    # The next window starts here, so the report and checkpoint below count against throughput.
    elapsed, window.start = now - window.start, now
    tps_worker = window.tokens / elapsed
    return {
        "step": worker.step,
        "loss": loss,
        "lr": lr,
        "grad_norm": float(grad_norm),
        "tokens_per_s": tps_worker * worker.world,
        "tokens_per_s_per_gpu": tps_worker,
        "mfu": mfu(tps_worker, worker.model.config, job["seq_len"], peak),
        "step_time_s": elapsed / window.steps,
        "data_wait_s": window.data_wait / window.steps,
        "peak_memory_gib": peak_memory_gib(device),
        "epoch": worker.batches.state_dict().get("epoch", 0),
        "resumed_from_step": worker.start_step,
    }


def _report(worker: _Worker, reports: _Reports, window: _Window, *, lr: float, grad_norm, save: bool,
            evaluate_now: bool) -> None:
    """One report: the window's figures, the held-out loss and a checkpoint when due, to the tracker, gauges, Ray."""
    import ray.train

    step = worker.step
    metrics = _window_metrics(worker, window, lr=lr, grad_norm=grad_norm, peak=reports.peak)
    if evaluate_now:
        metrics.update(reports.held_out(worker.model, worker.device))
        # Held-out scoring is not training: the next throughput window starts after it.
        window.start = time.perf_counter()
    checkpoint_dir = None
    if save:
        # A fresh folder per checkpoint that outlives this call: Ray uploads it in the background
        # while training goes on (ASYNC), then deletes it.
        saving = time.perf_counter()
        checkpoint_dir = tempfile.mkdtemp(prefix=f"{CHECKPOINT_PREFIX}{step:07d}-", dir=reports.staging)
        save_checkpoint(checkpoint_dir, model=worker.model, optimizer=worker.optimizer, scheduler=worker.scheduler,
                        step=step, data_state=worker.batches.state_dict(), device=worker.device)
        metrics["checkpoint_s"] = time.perf_counter() - saving
    reports.publish(metrics, plot=save or evaluate_now)
    if not worker.config.get("driver_progress"):  # a local run's driver draws its own bar from metrics.jsonl
        log.info("step %d loss %.4f lr %.2e grad_norm %.3f tokens/s %.0f step %.3fs%s", step, metrics["loss"], lr,
                 metrics["grad_norm"], metrics["tokens_per_s"], metrics["step_time_s"],
                 f" eval_loss {metrics['eval_loss']:.4f}" if evaluate_now else "")
    if checkpoint_dir is not None:
        # Only checkpoints are reported to Ray; the figures of every report already went to the
        # tracker above (metrics.jsonl, TensorBoard) and to the Prometheus gauges. Ray Train 2.58's
        # controller takes one report per worker per poll (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S): each
        # worker's result queue has maxsize 1 and later reports wait their turn in order
        # (ray/train/v2/_internal/execution/context.py `_wait_then_report`, worker_group/worker.py
        # `poll_status`). Reporting every step queued reports faster than they were taken, so a
        # checkpoint was registered long after it was written, and a worker killed meanwhile restarted
        # from an older one (step 0 instead of 50 with report_every 1). With checkpoint reports alone,
        # one is registered within its upload plus one poll, whatever report_every is.
        # Asynchronous: training goes on while the checkpoint uploads.
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(checkpoint_dir),
                         checkpoint_dir_name=f"{CHECKPOINT_PREFIX}{step:07d}",
                         checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC)


def _export(worker: _Worker) -> None:
    """The trained model in Hugging Face's format at `export_uri` (under LoRA: the adapters, or the merged model)."""
    config, job = worker.config, worker.job
    if worker.peft_model is None:
        export_hf_model(worker.model, worker.tokenizer, config["export_uri"], dtype=worker.export_dtype)
    else:
        from workloads.fsdp_finetune.lora import export_lora

        export_lora(worker.model, worker.peft_model, worker.tokenizer, config["export_uri"], lora=job["lora"],
                    merge=job.get("export", {}).get("merge", True), dtype=worker.export_dtype)
    log.info("exported the model to %s", config["export_uri"])


def _held_out(config: dict, records: list[dict], tokenizer, *, rank: int, world: int) -> HeldOutLoss | None:
    """The held-out scorer (None without held-out records): the split's records, or the config's own."""
    job = config["job"]
    records = config.get("eval_records") or records
    if not records:
        return None
    # The token budget of one training micro-batch: scoring needs no more memory than training.
    budget = job["micro_batch_size"] * job["seq_len"]
    return HeldOutLoss(tokenizer, records, seq_len=job["seq_len"], token_budget=budget, rank=rank, world_size=world)


def _tracker(config: dict, *, resume_step: int, world: int):
    """Rank 0's `RunTracker` in the run's folder (None when the plan names none)."""
    if not config.get("run_dir"):
        return None
    from workloads.fsdp_finetune.tracking import RunTracker

    settings = {"world_size": world, "grad_accumulation": config["grad_accumulation"]}
    return RunTracker(config["run_dir"], job=config["job"], resume_step=resume_step, settings=settings)


def checkpoint_staging_dir(run_name: str, storage_path: str | None, rank: int) -> Path:
    """This rank's local folder for checkpoints waiting for upload (see `_checkpoint_staging`).

    Keyed on the run's storage location as well as its name and rank: two runs with the same
    name but different storage (two local runs on one machine, two output folders) never share
    one, so neither deletes the other's staged checkpoints. The same run (same storage and name)
    finds its own folder again after a restart.
    """
    import hashlib

    where = f"{(storage_path or '').rstrip('/')}/{run_name}"
    digest = hashlib.sha256(where.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"fsdp-finetune-{run_name}-{digest}-rank{rank}"


def _checkpoint_staging(run_name: str, rank: int, storage_path: str | None = None) -> str:
    """This rank's local folder for checkpoints waiting for upload, emptied of a killed attempt's leftovers.

    Per rank, so ranks sharing a node never touch each other's; a restarted group starts only after
    the old one is gone, so nothing left here is still being uploaded. Per storage location too
    (`checkpoint_staging_dir`), so another run that merely shares the name is left alone.
    """
    staging = checkpoint_staging_dir(run_name, storage_path, rank)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return str(staging)


def _job_for_data(job: dict):
    """The job in the form the data module takes (it reads fields by attribute)."""
    from config.model import JobConfig

    return JobConfig.model_validate(job)
