"""CPU throughput: the workload through Ray Train against a bare torch.distributed FSDP2 loop.

Both sides use the same tiny model, data, batch, sharding and `train_step` code, on 2 processes
over gloo; the bare side spawns them with torch.multiprocessing (no Ray). Steady-state tokens/s
excludes start-up: the workload's figure is the median over its report windows after the first
(windows include the cost of `ray.train.report` and checkpoints, as a real run pays them); the
bare loop's is the median over equal windows after the same warm-up.

    python bench/cpu_throughput.py [--steps 60] [--window 10]

The last line is JSON. Target: ratio >= 0.95.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _bare_worker(rank: int, world: int, store: str, job: dict, accum: int, steps: int, window: int, out: str):
    import torch
    import torch.distributed as dist

    from workloads.fsdp_finetune.data import ShardedBatches, build_datasets
    from workloads.fsdp_finetune.model import build_model, shard_model
    from workloads.fsdp_finetune.train import _job_for_data, build_optimizer, build_scheduler, train_step

    torch.set_num_threads(1)  # as Ray gives each 1-CPU worker
    # A file rendezvous: no port to pick (a probed free port can be taken by another process before gloo binds it).
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    device = torch.device("cpu")
    torch.manual_seed(job["seed"] + rank)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    data, _ = build_datasets(_job_for_data(job), tokenizer)
    batches = iter(ShardedBatches(data, rank=rank, world_size=world, micro_batch_size=job["micro_batch_size"],
                                  seed=job["seed"]))
    model = shard_model(build_model(job["model"], attn_implementation="sdpa", device=device), device=device)
    optimizer = build_optimizer(model, job, device)
    scheduler = build_scheduler(optimizer, job)
    rates, tokens, start = [], 0, time.perf_counter()
    for step in range(1, steps + 1):
        out_ = train_step(model, optimizer, [next(batches) for _ in range(accum)], grad_clip=job["grad_clip"],
                          device=device)
        scheduler.step()
        tokens += out_["tokens"]
        if step % window == 0:
            float(out_["loss_sum"])  # the same host sync the workload does per report
            now = time.perf_counter()
            rates.append(tokens / (now - start) * world)
            tokens, start = 0, now
    if rank == 0:
        Path(out).write_text(json.dumps(rates))
    dist.destroy_process_group()


def bare_loop(job: dict, accum: int, steps: int, window: int) -> list[float]:
    """Tokens/s (all workers) per window of a plain 2-process FSDP2 loop."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rates.json")
        mp.spawn(_bare_worker, args=(2, os.path.join(tmp, "store"), job, accum, steps, window, out), nprocs=2)
        return json.loads(Path(out).read_text())


def workload(root: Path, steps: int, window: int):
    """Tokens/s per report window of the workload through Ray Train (and its job)."""
    from workloads.fsdp_finetune.metrics import read_metrics
    from workloads.fsdp_finetune.run_plan import local_plan
    from workloads.fsdp_finetune.trainer import run_training
    from workloads.local_ray import start_local_ray

    # Held-out loss only after the last step: extra mid-run reports would cut the windows short.
    plan, _ = local_plan(root / "ray", assets_dir=root / "assets", max_steps=steps, report_every=window,
                         checkpoint_every=steps, eval_every=steps, warmup_steps=2, run_name="bench")
    start_local_ray()
    result = run_training(plan)
    if result.error:
        raise result.error
    return plan, [r["tokens_per_s"] for r in read_metrics(plan.metrics_path)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--window", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plan, ray_rates = workload(root, args.steps, args.window)
        import ray

        ray.shutdown()  # free the CPUs for the bare loop
        job = plan.job.model_dump()
        bare_rates = bare_loop(job, plan.grad_accumulation, args.steps, args.window)
    # Drop the first window (start-up, first-touch allocations) and, for the workload, the last
    # one (it ends in the final checkpoint, which the bare loop does not write).
    ray_steady = statistics.median(ray_rates[1:-1] or ray_rates)
    bare_steady = statistics.median(bare_rates[1:] or bare_rates)
    ratio = ray_steady / bare_steady
    print(f"tiny model, 2 CPU workers, gloo, {plan.job.global_batch_size} x {plan.job.seq_len} tokens per step")
    print(f"workload (Ray Train):   {ray_steady:9.0f} tokens/s  windows {[round(r) for r in ray_rates]}")
    print(f"bare torch.distributed: {bare_steady:9.0f} tokens/s  windows {[round(r) for r in bare_rates]}")
    print(f"ratio {ratio:.3f} (target >= 0.95)")
    print(json.dumps({"workload_tokens_per_s": round(ray_steady, 1), "bare_tokens_per_s": round(bare_steady, 1),
                      "ratio": round(ratio, 4), "steps": args.steps, "window": args.window}))


if __name__ == "__main__":
    main()
