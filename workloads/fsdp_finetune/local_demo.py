"""The local demo (`--local`): the embedded tiny job on this machine's CPUs, evaluated before and after training.

Its console: a `Heartbeat` line while a quiet step lasts, the driver's progress bar (`DriverProgress`, with
`StepEta`), and at the end where the results are (`outputs`).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from config.model import ClusterConfig, JobConfig
from workloads.fsdp_finetune.data import dataset_epochs
from workloads.fsdp_finetune.run_plan import RunPlan, local_plan
from workloads.fsdp_finetune.settings import (
    LOCAL_SOURCE,
    latest_checkpoint_step,
    refuse,
    resume_problem,
    validate_job,
)
from workloads.fsdp_finetune.trainer import run_training
from workloads.local_ray import start_local_ray


def main_local(args, config: ClusterConfig) -> int:
    """The local demo: plan, refuse bad settings, evaluate, train with a progress bar, evaluate again, summarize."""
    from workloads.fsdp_finetune.console import RunLog

    started = time.perf_counter()
    run_log = RunLog(Path(args.output_dir).resolve() / "ray.log", verbose=args.verbose)
    if run_log.previous:
        print(f"the previous run's log is kept as {_shown(run_log.previous)}", flush=True)
    plan, assets = _checked_plan(args, config)
    out = Path(args.output_dir).resolve()
    done = latest_checkpoint_step(plan.storage_path, plan.job.run_name)
    if done == plan.job.max_steps and (Path(exported_model(plan)) / "config.json").exists():
        # A rerun on a finished folder would resume at the end and train nothing: say so instead.
        print(f"{_shown(out)} already holds a finished run ({done} of {plan.job.max_steps} steps); nothing to "
              f"train.\n{outputs(out, plan)}\nto train again: make clean && make demo (or "
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
    _report(out, plan, assets, before=before, result=result, started=started, run_log=run_log)
    return 0


def _checked_plan(args, config: ClusterConfig) -> tuple[RunPlan, object]:
    """The local run's plan and assets, its settings refused (`settings.refuse`) before anything runs."""
    with Heartbeat("preparing the demo's tiny model, tokenizer and data"):
        plan, assets = local_plan(args.output_dir, max_steps=args.max_steps, **local_method(config))
    if args.storage_path:
        plan.storage_path = args.storage_path
    problems = validate_job(plan.job, world_size=plan.num_workers, source=LOCAL_SOURCE)
    refuse(problems or [p for p in [resume_problem(plan, source=LOCAL_SOURCE)] if p])
    return plan, assets


def _report(out: Path, plan: RunPlan, assets, *, before: dict, result, started: float, run_log) -> None:
    """After a good fit: evaluate the fine-tuned model, write the summary, print the results and where they are."""
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
    print(outputs(out, plan))
    print(run_log.where())
    print("next: open loss.png; `tensorboard --logdir " + _shown(out) + "`; then plan a real job with "
          "`python -m workloads.plan` and deploy (docs/deploying.md)")


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


def outputs(out: Path, plan: RunPlan) -> str:
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


def evaluate_dir(model_dir: str | os.PathLike, records: list[dict], job: JobConfig) -> dict:
    """Score a saved model on held-out records in this process (`evaluate.evaluate`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workloads.fsdp_finetune.evaluate import evaluate

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return evaluate(model, tokenizer, records, instruction_field="instruction", response_field="response")


class _InBackground:
    """A context manager that runs `self._run` in a daemon thread until the block ends (`self._stop` is then set)."""

    def __init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        raise NotImplementedError


class DriverProgress(_InBackground):
    """A progress bar in the driver fed by the metrics file rank 0 appends to (local runs only).

    Drawn here rather than on a worker: Ray forwards worker output line by line, which turns a
    redrawn bar into a stream of lines.
    """

    def __init__(self, metrics_path: str, total: int, interval_s: float = 0.5):
        super().__init__()
        self.path, self.total, self.interval_s = Path(metrics_path), total, interval_s

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


class Heartbeat(_InBackground):
    """One line when a quiet step starts, then one every `every_s` while it lasts, so the console never looks hung
    (bench/newcomer.py fails a README command silent for more than 30 s)."""

    def __init__(self, label: str, every_s: float = 10.0):
        super().__init__()
        self.label, self.every_s = label, every_s

    def __enter__(self):
        self._start = time.monotonic()
        print(f"{self.label} ...", flush=True)
        return super().__enter__()

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
