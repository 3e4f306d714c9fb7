"""`main()`: validate the job, build Ray Train's configs from the variable file, run `fit()`.

    python -m workloads.fsdp_finetune [FILE] [--storage-path URI] [--max-steps N]
    python -m workloads.fsdp_finetune --local --output-dir DIR [--max-steps N]

On the cluster the job comes from the variable file and checkpoints go to the stacks' S3 bucket.
`--local` keeps the file's validation but swaps in the embedded tiny job (`local_job`): a random
Qwen2-architecture model, a generated arithmetic dataset, two CPU workers on gloo, all on this
machine. Every bad setting is reported before a worker starts, as `SOURCE: job.<field>: message`,
exit status 2; so is a rerun under a run name whose latest checkpoint is past `max_steps` (it would
train nothing and export the longer run's model).

`RAY_TRAIN_HEALTH_CHECK_INTERVAL_S` (Ray Train's default 2 s) is how often the train controller
polls the workers; reports, the end of training and worker failures are seen only on a poll. The
cluster's runtime env sets it (charts); a local run defaults it to 0.5 s (`workloads.local_ray`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from config import load_or_exit, resolve_path
from config.cli import add_file_argument, chosen_file
from config.model import ClusterConfig, JobConfig
from config.observability import PLAN_PREDICTION_FILE
from config.topology import LOGICAL_GPU_RESOURCE
from workloads.fsdp_finetune.data import dataset_epochs
from workloads.fsdp_finetune.run_folder import checkpoint_bucket
from workloads.local_ray import LOCAL_WORKERS, start_local_ray

LOCAL_SOURCE = "local job"


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


@dataclass(frozen=True)
class SettingProblem:
    """A job setting refused before training starts."""

    source: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: job.{self.field}: {self.message}"


def validate_job(job: JobConfig, *, world_size: int, source: str) -> list[SettingProblem]:
    """Every check that can run in the driver: batch split for this world size, dataset and columns.

    The loader already refuses zero or negative sizes and checks the batch split for the cluster's
    world size; this rechecks the split for the world size actually used (2 locally) and looks at
    the dataset (path exists, the named columns are there) through the data module's `check_dataset`.
    """
    from workloads.fsdp_finetune.data import JobSettingError, check_dataset

    problems = [SettingProblem(source, field, message) for field, message in job.batch_problems(world_size)]
    if job.attn_implementation == "flash_attention_2" and source == LOCAL_SOURCE:
        problems.append(SettingProblem(source, "attn_implementation", "flash_attention_2 needs a GPU; use sdpa"))
    try:
        check_dataset(job)
    except JobSettingError as exc:
        problems.append(SettingProblem(source, exc.field, exc.message))
    return problems


def latest_checkpoint_step(storage_path: str, run_name: str) -> int | None:
    """The step of the run's latest checkpoint in storage (`<storage>/<run>/checkpoint_step_NNNNNNN`), or None.

    Reads only the folder names (local path or any URI pyarrow understands, such as s3://); the
    names are the `checkpoint_dir_name` that `train_func` reports each checkpoint under.
    """
    import pyarrow.fs as pafs

    from workloads.fsdp_finetune.checkpoint import filesystem
    from workloads.fsdp_finetune.train import CHECKPOINT_PREFIX

    fs, root = filesystem(storage_path)
    run_dir = f"{root.rstrip('/')}/{run_name}"
    infos = fs.get_file_info(pafs.FileSelector(run_dir, allow_not_found=True))
    steps = [int(info.base_name.removeprefix(CHECKPOINT_PREFIX)) for info in infos
             if info.type == pafs.FileType.Directory and info.base_name.startswith(CHECKPOINT_PREFIX)
             and info.base_name.removeprefix(CHECKPOINT_PREFIX).isdigit()]
    return max(steps, default=None)


def resume_problem(plan: RunPlan, *, source: str) -> SettingProblem | None:
    """A rerun under the same name whose checkpoint is past `max_steps` would export the old model: refuse it.

    Checked in the driver before any worker starts (`train_func` checks again at resume). When the
    storage cannot be read from here (no credentials on this machine), the workers' check stands.
    """
    from workloads.fsdp_finetune.train import resume_conflict

    try:
        step = latest_checkpoint_step(plan.storage_path, plan.job.run_name)
    except Exception as exc:  # noqa: BLE001 - unreadable storage: the workers check at resume
        print(f"note: could not list checkpoints in {plan.storage_path} ({exc}); checked at resume",
              file=sys.stderr)
        return None
    conflict = None if step is None else resume_conflict(step, plan.job.max_steps, plan.job.run_name)
    return SettingProblem(source, "max_steps", f"{conflict} (in {plan.storage_path})") if conflict else None


def refuse(problems: list[SettingProblem]) -> None:
    """Print the problems and exit 2 (the loader's convention) when there are any."""
    from workloads.hf_token import scrub

    if problems:
        for problem in problems:
            print(scrub(str(problem)), file=sys.stderr)
        raise SystemExit(2)


def with_secret_arn(job: JobConfig) -> JobConfig:
    """`job` with `hf_token_secret` as the complete ARN the driver read (the workers then need no region)."""
    from workloads.hf_token import secret_arn

    arn = secret_arn(job.hf_token_secret)
    return job if arn == job.hf_token_secret else job.model_copy(update={"hf_token_secret": arn})


def token_problems(job: JobConfig, *, source: str, region: str | None) -> list[SettingProblem]:
    """Fetch `job.hf_token_secret` into this process ($HF_TOKEN, `workloads.hf_token`), then one bounded
    metadata request per Hub input (`workloads.preflight.hub`): a missing, unreadable or refused token is
    reported before any worker starts (within a minute: 2 x 10 s for Secrets Manager, 10 s per request)."""
    from workloads.hf_token import TokenError, current_token, install_token
    from workloads.preflight.hub import hub_problems

    try:
        install_token(job.hf_token_secret, region=region)
    except TokenError as exc:
        return [SettingProblem(source, "hf_token_secret", str(exc).removeprefix("job.hf_token_secret: "))]
    return [SettingProblem(source, field, message) for field, message in hub_problems(job, token=current_token())]


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


def evaluate_dir(model_dir: str | os.PathLike, records: list[dict], job: JobConfig) -> dict:
    """Score a saved model on held-out records in this process (`evaluate.evaluate`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workloads.fsdp_finetune.evaluate import evaluate

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return evaluate(model, tokenizer, records, instruction_field="instruction", response_field="response")


class DriverProgress:
    """A progress bar in the driver fed by the metrics file rank 0 appends to (local runs only).

    Drawn here rather than on a worker: Ray forwards worker output line by line, which turns a
    redrawn bar into a stream of lines.
    """

    def __init__(self, metrics_path: str, total: int, interval_s: float = 0.5):
        self.path, self.total, self.interval_s = Path(metrics_path), total, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        from tqdm import tqdm

        from workloads.fsdp_finetune.metrics import read_metrics

        # tqdm's own ETA divides the steps by the time since the bar appeared, which here includes starting Ray,
        # the workers and the model (most of a short run): it overstates the rest at first, then jumps. The ETA
        # shown is the rest of the steps at the pace of the steps seen so far (`StepEta`), and no ETA before two
        # reports; the export and the held-out evaluation after the last step are not in it, which the label says.
        eta = StepEta(self.total)
        fmt = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"
        with tqdm(total=self.total, desc="train", unit="step", file=sys.stdout, dynamic_ncols=True,
                  bar_format=fmt) as bar:
            bar.set_postfix_str("starting Ray and the workers", refresh=True)
            while True:
                stopping = self._stop.wait(self.interval_s)
                try:
                    records = [r for r in read_metrics(self.path) if "loss" in r]  # not step 0's held-out row
                except (OSError, ValueError):  # a line being written
                    records = []
                if records:
                    last = records[-1]
                    bar.n = last["step"]
                    eta.seen(last["step"], time.monotonic())
                    bar.set_postfix_str(f"loss={last['loss']:.3f}, tok/s={last['tokens_per_s']:.0f}, "
                                        f"{eta.text(time.monotonic())}", refresh=False)
                # Redrawn on every tick, reports or not: the elapsed time moves, so a slow start never looks hung.
                bar.refresh()
                if stopping:
                    return


class Heartbeat:
    """One line when a quiet step starts, then one every `every_s` while it lasts, so the console never looks hung
    (bench/newcomer.py fails a README command silent for more than 30 s)."""

    def __init__(self, label: str, every_s: float = 10.0):
        self.label, self.every_s = label, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._start = time.monotonic()
        print(f"{self.label} ...", flush=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            print(f"  still {self.label.split(' ', 1)[0]}: {time.monotonic() - self._start:.0f} s", flush=True)


class StepEta:
    """The time left to the last step, from the pace of the steps reported so far (the driver's own clock)."""

    def __init__(self, total: int):
        self.total = total
        self.first: tuple[int, float] | None = None
        self.last: tuple[int, float] | None = None

    def seen(self, step: int, now: float) -> None:
        if self.first is None:
            self.first = (step, now)
        if self.last is None or step > self.last[0]:
            self.last = (step, now)

    def seconds_left(self, now: float) -> float | None:
        """None until two different steps were seen; else the remaining steps times the seconds per step."""
        if not self.first or not self.last or self.last[0] <= self.first[0]:
            return None
        per_step = (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])
        # Time since the last report counts as progress on the next step, never as negative time.
        return max(0.0, (self.total - self.last[0]) * per_step - (now - self.last[1]))

    def text(self, now: float) -> str:
        left = self.seconds_left(now)
        if left is None:
            return "training ETA after the next report"
        return f"training ETA {int(left) // 60}:{int(left) % 60:02d} (then export and evaluation)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m workloads.fsdp_finetune", description=__doc__.split("\n")[0])
    add_file_argument(parser)
    parser.add_argument("--local", action="store_true", help="run the embedded tiny job on this machine's CPUs")
    parser.add_argument("--output-dir", default="out/local", help="local mode: metrics, plot, checkpoints, model")
    parser.add_argument("--max-steps", type=int, default=None, help="override job.max_steps")
    parser.add_argument("--storage-path", default=None,
                        help="Ray storage URI (default: s3://<bucket>/<storage.prefix>/checkpoints on the "
                             "cluster, DIR locally)")
    parser.add_argument("--verbose", action="store_true",
                        help="local mode: print Ray's and the workers' output too (always in DIR/ray.log)")
    args = parser.parse_args(argv)
    args.config = chosen_file(parser, args)
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point: validate, plan, (preflight,) fit, and for local runs evaluate before and after."""
    args = parse_args(argv)
    file = resolve_path(args.config)
    config = load_or_exit(file)
    if args.max_steps is not None and args.max_steps < 1:
        refuse([SettingProblem("--max-steps", "max_steps", f"must be positive, got {args.max_steps}")])
    if args.local:
        return _main_local(args, config)
    from botocore.exceptions import BotoCoreError

    try:
        return _main_cluster(args, config, str(file))
    except BotoCoreError as exc:  # no credentials, no route to AWS: one line, not botocore's traceback
        print(f"{file}: cannot reach AWS ({type(exc).__name__}: {exc}); a cluster run needs the job's AWS credentials "
              "(Pod Identity on EKS, the instance profile on EC2). On this machine: python -m workloads.fsdp_finetune "
              "--local", file=sys.stderr)
        return 2


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


def stage(name: str) -> None:
    """Mark the driver's log with the stage it enters; `workloads.verify` names the last one when a job fails."""
    print(f"JOB_STAGE {name}", file=sys.stderr, flush=True)


def _main_cluster(args, config: ClusterConfig, file: str) -> int:
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


def read_plan_prediction(path: str, *, run_name: str) -> dict | None:
    """The plan's prediction that job.sh had `python -m workloads.plan --prediction-out` write (None when it
    is missing, unreadable or for another run: the dashboards then show the measured figures alone)."""
    try:
        prediction = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return prediction if isinstance(prediction, dict) and prediction.get("run_name") == run_name else None


def _main_local(args, config: ClusterConfig) -> int:
    from workloads.fsdp_finetune.console import RunLog

    started = time.perf_counter()
    run_log = RunLog(Path(args.output_dir).resolve() / "ray.log", verbose=args.verbose)
    if run_log.previous:
        print(f"the previous run's log is kept as {_shown(run_log.previous)}", flush=True)
    with Heartbeat("preparing the demo's tiny model, tokenizer and data"):
        plan, assets = local_plan(args.output_dir, max_steps=args.max_steps, **local_method(config))
    if args.storage_path:
        plan.storage_path = args.storage_path
    problems = validate_job(plan.job, world_size=plan.num_workers, source=LOCAL_SOURCE)
    refuse(problems or [p for p in [resume_problem(plan, source=LOCAL_SOURCE)] if p])
    out = Path(args.output_dir).resolve()
    done = latest_checkpoint_step(plan.storage_path, plan.job.run_name)
    if done == plan.job.max_steps and (Path(exported_model(plan)) / "config.json").exists():
        # A rerun on a finished folder would resume at the end and train nothing: say so instead.
        print(f"{_shown(out)} already holds a finished run ({done} of {plan.job.max_steps} steps); nothing to "
              f"train.\n{_outputs(out, plan)}\nto train again: make clean && make demo (or "
              f"make demo DEMO_DIR={_shown(out)}-2, or --output-dir DIR)")
        return 0
    if done:
        print(f"resuming the run in {_shown(out)} from its checkpoint at step {done} of {plan.job.max_steps} "
              "(make clean to start over)", flush=True)
    dataset_epochs(plan.job, world_size=plan.num_workers)
    print(f"local run: {plan.job.max_steps} steps of {plan.job.global_batch_size} x {plan.job.seq_len} tokens on "
          f"{plan.num_workers} CPU workers; output in {out}", flush=True)

    with Heartbeat(f"evaluating the untrained model on {len(assets.eval_records)} held-out questions"):
        before = evaluate_dir(assets.model_dir, assets.eval_records, plan.job)
    print(f"before training: held-out exact match {before['exact_match']:.1%}, loss {before['loss']:.3f} "
          f"({len(assets.eval_records)} questions)", flush=True)

    try:
        # The bar first: it says "starting Ray and the workers" while the local cluster comes up.
        with DriverProgress(plan.metrics_path, plan.job.max_steps):
            start_local_ray()
            run_log.attach()
            result = run_training(plan)
    except Exception as exc:  # noqa: BLE001 - Ray Train raises TrainingFailedError once retries are spent
        return run_log.failed(exc)
    if result.error:
        return run_log.failed(result.error)

    from workloads.fsdp_finetune.metrics import read_metrics
    from workloads.fsdp_finetune.tracking import LOSS_PLOT

    png = out / LOSS_PLOT  # drawn by rank 0 beside metrics.jsonl and the TensorBoard events
    rows = read_metrics(plan.metrics_path)
    records = [r for r in rows if "loss" in r]
    held_out = [r for r in rows if "eval_loss" in r]
    with Heartbeat(f"evaluating the fine-tuned model on {len(assets.eval_records)} held-out questions"):
        after = evaluate_dir(exported_model(plan), assets.eval_records, plan.job)
    summary = {
        "train_loss_first": records[0]["loss"] if records else None,
        "train_loss_last": records[-1]["loss"] if records else None,
        "eval_loss_during_training": {r["step"]: round(r["eval_loss"], 4) for r in held_out},
        "eval_exact_match_before": before["exact_match"],
        "eval_exact_match_after": after["exact_match"],
        "eval_loss_before": before["loss"],
        "eval_loss_after": after["loss"],
        "wall_time_s": round(time.perf_counter() - started, 1),
        "checkpoint": result.checkpoint.path if result.checkpoint else None,
        "model_dir": plan.export_uri,
        "metrics": plan.metrics_path,
        "loss_png": str(png) if png.exists() else None,
        "tensorboard": f"tensorboard --logdir {out}",
    }
    if held_out:
        print("held-out loss during training (all ranks): "
              + ", ".join(f"step {r['step']} {r['eval_loss']:.3f}" for r in held_out))
    print(f"after training:  held-out exact match {after['exact_match']:.1%}, loss {after['loss']:.3f}")
    print(f"training loss {summary['train_loss_first']:.3f} -> {summary['train_loss_last']:.3f}; "
          f"{summary['wall_time_s']:.0f} s in all")
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    print(_outputs(out, plan))
    print(run_log.where())
    print("next: open loss.png; `tensorboard --logdir " + _shown(out) + "`; then plan a real job with "
          "`python -m workloads.plan` and deploy (docs/deploying.md)")
    return 0


SUMMARY_FILE = "summary.json"


def local_method(config: ClusterConfig) -> dict:
    """The variable file's training method for the local run (`job.method`, `job.lora`, `job.export`): the rest of
    the local job is its own (`local_job`), but `--config config/examples/lora.yaml` trains LoRA adapters."""
    job = config.job
    if job.method == "full":
        return {}
    return {"method": job.method, "lora": job.lora.model_dump(), "export": job.export.model_dump()}


def exported_model(plan: RunPlan) -> str:
    """The folder `from_pretrained` loads the trained model from: the export, or under LoRA without a merged
    model the adapter folder (transformers loads the base it names and the adapters through PEFT)."""
    from workloads.fsdp_finetune.lora import ADAPTER_DIR

    if plan.job.method == "lora" and not plan.job.export.merge:
        return str(Path(plan.export_uri) / ADAPTER_DIR)
    return plan.export_uri


def _shown(path: Path) -> str:
    """`path` relative to the working directory when inside it (what a user typed), else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _outputs(out: Path, plan: RunPlan) -> str:
    """The lines that say where a local run's results are."""
    from workloads.fsdp_finetune.tracking import LOSS_PLOT

    return "\n".join([
        f"outputs in {_shown(out)}/:",
        f"  model/          the fine-tuned model (transformers from_pretrained), from {plan.job.run_name}'s last step"
        + (" (LoRA: the adapters in PEFT's format under model/adapter/)" if plan.job.method == "lora" else ""),
        f"  {LOSS_PLOT:<15} training and held-out loss, learning rate",
        "  metrics.jsonl   one row per report; TensorBoard events beside it",
        f"  {SUMMARY_FILE:<15} before/after exact match and loss, wall time",
        f"  {plan.job.run_name + '/':<15} checkpoints (a rerun resumes from the last)",
    ])
