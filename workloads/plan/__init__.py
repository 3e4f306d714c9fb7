"""Know before you rent: per-GPU memory, step time and cost of the variable file's job, on a CPU.

    python -m workloads.plan [FILE] [--json] [--efficiency 0.4] [--reserve-gib 2]

* Memory: one steady-state training step of the real architecture (`architectures`), sharded by
  the workload's `shard_model` with the job's mesh, under PyTorch's FSDP2 memory tracker on fake
  tensors (`simulate`). Per-GPU peak by category, and the persistent state (this rank's shards of
  fp32 parameters, gradients and AdamW's two moments: 16 bytes per parameter / shard group).
* Fit: the peak against the GPU's memory as CUDA reports it, less `RESERVE_GIB` for what the
  tracker does not see (CUDA context and kernels, NCCL's communicator buffers, the caching
  allocator's fragmentation). A job over it is refused: exit 2 naming `job.micro_batch_size` (or
  `job.seq_len` when even one sequence is too many) with the largest value that fits.
* FLOPs: `FlopCounterMode` over the same step. Executed FLOPs (recomputation included) set the
  compute time; model FLOPs (3 x the counted forward) are shown beside `metrics.py`'s formula.
* Step time: executed FLOPs at `--efficiency` of the GPU's dense bf16 peak, plus the step's
  cross-node bytes (`topology.cross_node_bytes_per_step`; all ranks of a node share its link) at
  the catalog's network figure, added: no overlap of communication with compute is assumed, so
  the figure errs slow (the full-overlap bound is shown too). Intra-node traffic is not counted.
* Run: tokens/s, hours for `max_steps` and the on-demand cost of the whole cluster from the
  catalog (image pull, start-up, checkpoints and evaluation not included).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

GIB = 2**30
RESERVE_GIB = 2.0
"""Kept free per GPU: CUDA context (~0.5 GiB), NCCL buffers (two communicators under hybrid sharding),
and the caching allocator's fragmentation, none of which the memory tracker sees."""
DEFAULT_EFFICIENCY = 0.4
"""Fraction of the dense bf16 peak the GPU sustains on the executed FLOPs (a typical FSDP figure)."""
PARAM_BYTES = 2  # bf16 all-gathers (the GPU dtype policy)
REDUCE_BYTES = {"float32": 4, "bfloat16": 2}
MIN_SEQ_LEN = 128


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """The figures the plan takes from the catalog: the most constrained worker group's."""

    gpu: str
    visible_memory_gib: float
    bf16_tflops: float
    network_gbps: float


def hardware(config) -> Hardware:
    """The smallest GPU memory, slowest GPU and slowest network among the worker groups (the step
    waits for the slowest rank; the smallest GPU must hold its shard)."""
    types = [config.instance(g) for g in config.cluster.worker_groups]
    smallest = min(types, key=lambda t: t.gpu_visible_memory_mib)
    return Hardware(gpu=smallest.gpu_model, visible_memory_gib=smallest.gpu_visible_memory_mib / 1024,
                    bf16_tflops=min(t.gpu_bf16_tflops for t in types),
                    network_gbps=min(t.network_gbps for t in types))


class PlanRefusal(Exception):
    """The job does not fit; `field` (e.g. `micro_batch_size`) and `message` as the loader words them."""

    def __init__(self, field: str, message: str, plan: dict):
        super().__init__(f"job.{field}: {message}")
        self.field, self.message, self.plan = field, message, plan


def predict(arch, mesh, *, micro_batch_size: int, seq_len: int, grad_accumulation: int,
            activation_checkpointing: bool, bf16_tflops: float, network_gbps: float = 0.0,
            efficiency: float = DEFAULT_EFFICIENCY, reduce_dtype: str = "float32",
            reshard_after_forward: bool = True, limit_gib: float | None = None,
            flops: tuple[float, float] | None = None, lora: dict | None = None,
            search: bool | str = True) -> dict:
    """Memory, FLOPs and step time of one steady-state step of `arch` on `mesh` (`topology.MeshPlan`).

    No variable file needed (the GPU benchmark calls this for its own configuration). With
    `limit_gib` and a peak above it, also `largest_micro_batch` (at this `seq_len`, the global
    batch kept) and, when even one sequence is too many, `largest_seq_len` (halving). `flops` (executed,
    forward per micro-batch, from an earlier prediction of the same micro-batch) skips counting them again:
    they depend on the model and the micro-batch, not on the sharding, the GPU or the node count.
    `lora` (`job.lora` as a dict) plans LoRA (`simulate.FakeJob`); `search=False` skips the search for what fits,
    `search="micro_batch"` searches the micro-batch only (no shorter sequences).
    When the persistent state alone exceeds `limit_gib`, no step is simulated (`state_exceeds_limit`).
    """
    from workloads.fsdp_finetune.topology import cross_node_bytes_per_step, padded_numel
    from workloads.plan.simulate import FakeJob, StepMemory

    with FakeJob(arch, mesh_plan=mesh, activation_checkpointing=activation_checkpointing,
                 reduce_dtype=reduce_dtype, reshard_after_forward=reshard_after_forward, lora=lora) as fake:
        floor = fake.state_floor()
        out = {}
        if limit_gib is not None and sum(floor.values()) > limit_gib * GIB:
            # The persistent state alone does not fit: no step (and no smaller micro-batch or sequence) can, so
            # none is simulated (a 64-layer model's fake step takes minutes of CPU). FLOPs from metrics.py's
            # formula: forward 1/3 of 6N + 12LdT, recomputed once more under activation checkpointing.
            from workloads.fsdp_finetune.metrics import flops_per_token

            if flops is None:
                forward_mb = flops_per_token(arch, seq_len) / 3 * micro_batch_size * seq_len
                executed_mb = forward_mb * (4 if activation_checkpointing else 3)
            else:
                executed_mb, forward_mb = flops
            state = floor
            memory = StepMemory(peak=sum(floor.values()), by_category=dict(floor))
            out = {"largest_micro_batch": 0, "largest_seq_len": 0, "state_exceeds_limit": True}
        elif flops is None:
            executed_mb, forward_mb = fake.count_flops(micro_batch_size, seq_len)
        else:
            executed_mb, forward_mb = flops
            fake.warm_up(micro_batch_size, seq_len)
        if not out:
            memory = fake.measure(micro_batch_size, seq_len, grad_accumulation)
            state = fake.state_bytes()
        if search and limit_gib is not None and memory.peak > limit_gib * GIB and not out:
            out = _largest_fitting(fake, limit_gib * GIB, micro_batch_size=micro_batch_size, seq_len=seq_len,
                                   sequences=micro_batch_size * grad_accumulation, peak=memory.peak,
                                   shorter=search != "micro_batch")
        params_comm = padded_numel(fake.param_shapes, mesh.shard)
        root_comm = padded_numel(fake.root_param_shapes, mesh.shard)
        grad_comm = padded_numel(fake.trainable_shapes, mesh.shard)
        params, trainable = fake.params, fake.trainable
    compute_s = executed_mb * grad_accumulation / (efficiency * bf16_tflops * 1e12)
    cross_bytes = cross_node_bytes_per_step(mesh, params=params_comm, grad_accumulation=grad_accumulation,
                                            param_bytes=PARAM_BYTES, reduce_bytes=REDUCE_BYTES[reduce_dtype],
                                            root_params=root_comm, grad_params=grad_comm)
    # All ranks of a node send through its one network link at once.
    network_s = cross_bytes * mesh.ranks_per_node * 8 / (network_gbps * 1e9) if cross_bytes else 0.0
    return {
        "params": params,
        "trainable_params": trainable,
        "peak_bytes": memory.peak,
        "peak_by_category_bytes": memory.by_category,
        "state_bytes": state,
        "executed_flops_per_rank": executed_mb * grad_accumulation,
        "model_flops_per_rank": 3 * forward_mb * grad_accumulation,
        "compute_s": compute_s,
        "cross_node_bytes_per_rank": cross_bytes,
        "network_s": network_s,
        "step_time_s": compute_s + network_s,
        "efficiency": efficiency,
        "flops_per_micro_batch": (executed_mb, forward_mb),
        **out,
    }


def make_plan(config, *, efficiency: float = DEFAULT_EFFICIENCY, reserve_gib: float = RESERVE_GIB,
              flops: tuple[float, float] | None = None, search_smaller: bool | str = True, online: bool = False,
              token: str | None = None) -> dict:
    """The plan of `config`'s job as one JSON-ready dict; raise `PlanRefusal` when it does not fit.

    `flops` reuses an earlier plan's per-micro-batch FLOPs (`flops_per_micro_batch`) for the same model and
    micro-batch; `search_smaller=False` skips the search for the largest micro-batch or sequence that fits.
    `online`: a Hub model not cached here is read from the Hub (its config.json) with `token`.
    """
    from workloads.fsdp_finetune import metrics
    from workloads.fsdp_finetune.topology import mesh_plan
    from workloads.plan.architectures import resolve_architecture

    started = time.perf_counter()
    job = config.job
    arch, source = resolve_architecture(job.model, online=online, token=token)
    mesh = mesh_plan(config)
    hw = hardware(config)
    accum = config.grad_accumulation
    limit_gib = hw.visible_memory_gib - reserve_gib
    lora = job.lora.model_dump() if job.method == "lora" else None
    if lora:
        from workloads.fsdp_finetune.lora import check_targets

        check_targets(arch, lora["target_modules"], job.model)  # LoraTargetError: before any simulation
    step = predict(arch, mesh, micro_batch_size=job.micro_batch_size, seq_len=job.seq_len, grad_accumulation=accum,
                   activation_checkpointing=job.activation_checkpointing, bf16_tflops=hw.bf16_tflops,
                   network_gbps=hw.network_gbps, efficiency=efficiency, reduce_dtype=job.reduce_dtype,
                   limit_gib=limit_gib, search=search_smaller, flops=flops, lora=lora)
    world = mesh.world_size
    tokens_per_step = job.global_batch_size * job.seq_len
    formula_flops = metrics.flops_per_token(arch, job.seq_len) * tokens_per_step
    plan = {
        "model": job.model,
        "architecture_source": source,
        "params": step["params"],
        "method": job.method,
        "lora": {k: lora[k] for k in ("rank", "alpha", "target_modules")} if lora else None,
        "trainable_params": step["trainable_params"],
        "world_size": world,
        "nodes": mesh.nodes,
        "ranks_per_node": mesh.ranks_per_node,
        "sharding": mesh.sharding,
        "shard_group_size": mesh.shard,
        "micro_batch_size": job.micro_batch_size,
        "seq_len": job.seq_len,
        "grad_accumulation": accum,
        "activation_checkpointing": job.activation_checkpointing,
        **_memory_fields(step, hw, reserve_gib=reserve_gib, limit_gib=limit_gib),
        **_speed_fields(step, job, config, hw, efficiency=efficiency, formula_flops=formula_flops, world=world),
        "plan_seconds": round(time.perf_counter() - started, 1),
    }
    if not plan["fits"]:
        for key in ("largest_micro_batch", "largest_seq_len", "state_exceeds_limit"):
            if key in step:
                plan[key] = step[key]
        raise PlanRefusal(*_refusal(plan, job, reserve_gib), plan)
    return plan


def _memory_fields(step: dict, hw, *, reserve_gib: float, limit_gib: float) -> dict:
    """The plan's memory figures per GPU: the device's, the limit, the simulated peak and state, whether it fits."""
    peak_gib = step["peak_bytes"] / GIB
    return {
        "gpu": hw.gpu,
        "gpu_memory_gib": round(hw.visible_memory_gib, 3),
        "reserve_gib": reserve_gib,
        "limit_gib": round(limit_gib, 3),
        "peak_gib_per_gpu": round(peak_gib, 3),
        "peak_bytes_per_gpu": step["peak_bytes"],
        "peak_by_category_gib": {k: round(v / GIB, 3) for k, v in step["peak_by_category_bytes"].items()},
        "peak_by_category_bytes": step["peak_by_category_bytes"],
        "state_gib_per_gpu": round(sum(step["state_bytes"].values()) / GIB, 3),
        "state_bytes_per_gpu": sum(step["state_bytes"].values()),
        "state_by_category_gib": {k: round(v / GIB, 3) for k, v in step["state_bytes"].items()},
        "state_by_category_bytes": step["state_bytes"],
        "fits": peak_gib <= limit_gib,
    }


def _speed_fields(step: dict, job, config, hw, *, efficiency: float, formula_flops: float, world: int) -> dict:
    """The plan's FLOPs, step time, throughput, MFU, run time and cost."""
    tokens_per_step = job.global_batch_size * job.seq_len
    step_s = step["step_time_s"]
    run_hours = job.max_steps * step_s / 3600
    return {
        "flops_per_micro_batch": list(step["flops_per_micro_batch"]),
        "flops_per_step": step["executed_flops_per_rank"] * world,
        "model_flops_per_step_counted": step["model_flops_per_rank"] * world,
        "model_flops_per_step_formula": formula_flops,
        "counted_over_formula": round(step["model_flops_per_rank"] * world / formula_flops, 4),
        "efficiency": efficiency,
        "gpu_bf16_tflops": hw.bf16_tflops,
        "compute_s": round(step["compute_s"], 4),
        "cross_node_bytes_per_rank": step["cross_node_bytes_per_rank"],
        "network_gbps": hw.network_gbps,
        "network_s": round(step["network_s"], 4),
        "overlap": "none",
        "step_time_s": round(step_s, 4),
        "step_time_full_overlap_s": round(max(step["compute_s"], step["network_s"]), 4),
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": round(tokens_per_step / step_s, 1),
        "predicted_mfu": round(formula_flops / (step_s * world * hw.bf16_tflops * 1e12), 4),
        "max_steps": job.max_steps,
        "run_hours": round(run_hours, 4),
        "cost_per_hour_usd": round(config.cost_per_hour, 4),
        "run_cost_usd": round(run_hours * config.cost_per_hour, 2),
    }


def _largest_fitting(fake, limit: float, *, micro_batch_size: int, seq_len: int, sequences: int,
                     peak: int, shorter: bool = True) -> dict:
    """The largest micro-batch that fits at `seq_len` ({"largest_micro_batch": n}), else the largest
    `seq_len` (halving) that fits one sequence ({"largest_micro_batch": 0, "largest_seq_len": n}).

    The peak is close to affine in the micro-batch (activations and loss temporaries scale with
    it), so two measured points give a first guess, which is then measured and walked down.
    `sequences` (per rank per step) stays fixed: a smaller micro-batch means more accumulation, rounded up
    as the suggested file rounds `job.global_batch_size` up (`suggest._fit_batch`), so the value named is
    measured with the accumulation it will run with (under hybrid sharding a second micro-batch peaks higher).
    """
    def peak_at(mb: int, seq: int) -> int:
        return fake.measure(mb, seq, -(-sequences // mb)).peak

    mb = micro_batch_size
    one = peak_at(1, seq_len) if mb > 1 else peak
    if one <= limit:
        slope = (peak - one) / (mb - 1)
        best = max(1, min(mb - 1, 1 + math.floor((limit - one) / slope)))
        for _ in range(3):
            if best == 1 or peak_at(best, seq_len) <= limit:
                break
            best -= 1
        return {"largest_micro_batch": best}
    if not shorter:
        return {"largest_micro_batch": 0}
    seq = seq_len // 2
    while seq >= MIN_SEQ_LEN and peak_at(1, seq) > limit:
        seq //= 2
    return {"largest_micro_batch": 0, "largest_seq_len": seq if seq >= MIN_SEQ_LEN else 0}


def _refusal(plan: dict, job, reserve_gib: float) -> tuple[str, str]:
    """(field, message) of a job whose predicted peak does not fit."""
    head = (f"predicted peak {plan['peak_gib_per_gpu']:.1f} GiB per GPU exceeds the {plan['limit_gib']:.1f} GiB "
            f"limit ({plan['gpu']} {plan['gpu_memory_gib']:.1f} GiB less {reserve_gib:g} GiB reserved for the CUDA "
            f"context, NCCL buffers and allocator fragmentation)")
    hint = "" if job.activation_checkpointing else "; or set job.activation_checkpointing: true"
    if plan.get("state_exceeds_limit"):
        what = ("frozen bf16 base, fp32 adapters, their gradients and AdamW moments" if plan["method"] == "lora"
                else "fp32 parameters, gradients and AdamW moments: 16 bytes a parameter")
        return "method" if plan["method"] == "full" else "model", (
            f"{head}; the persistent state alone is {plan['state_gib_per_gpu']:.1f} GiB per GPU ({what}, sharded "
            f"{plan['shard_group_size']} ways), so no micro-batch or sequence length fits: train LoRA adapters "
            f"(job.method: lora), or shard over more GPUs or bigger ones (the suggestions below)")
    best = plan.get("largest_micro_batch", 0)
    if best:
        return "micro_batch_size", (
            f"{head}; the largest micro-batch that fits at seq_len {job.seq_len} is {best}: set "
            f"job.micro_batch_size: {best} (job.global_batch_size a multiple of {best * plan['world_size']}){hint}")
    seq = plan.get("largest_seq_len", 0)
    if not seq:
        return "micro_batch_size", f"{head}; even one sequence of {MIN_SEQ_LEN} tokens does not fit{hint}"
    return "seq_len", (f"{head}; even micro_batch_size 1 does not fit at seq_len {job.seq_len}: set job.seq_len: "
                       f"{seq} (fits one sequence per micro-batch){hint}")


def render(plan: dict, file: str) -> str:
    """The plan as a readable table."""
    p = plan
    gib = lambda v: f"{v:7.2f} GiB"  # noqa: E731
    lines = [
        f"{file}: {p['model']} ({p['params']:,} parameters; architecture from {p['architecture_source']})",
        (f"  method     LoRA rank {p['lora']['rank']} (alpha {p['lora']['alpha']:g}) on "
         f"{', '.join(p['lora']['target_modules'])}: {p['trainable_params']:,} trainable parameters "
         f"({p['trainable_params'] / p['params']:.2%}), frozen base in bf16" if p["method"] == "lora"
         else f"  method     full fine-tuning: all {p['trainable_params']:,} parameters train (fp32 master weights)"),
        f"  job        {p['world_size']} GPUs ({p['nodes']} nodes x {p['ranks_per_node']} {p['gpu']}), sharding "
        f"{p['sharding']} (shard group {p['shard_group_size']}), micro-batch {p['micro_batch_size']} x "
        f"{p['seq_len']} tokens, {p['grad_accumulation']} accumulation steps, activation checkpointing "
        f"{'on' if p['activation_checkpointing'] else 'off'}",
        "  memory per GPU at the peak of a steady-state step (FSDP2 memory tracker, fake tensors):",
    ]
    lines += [f"    {name:22s}{gib(v)}" for name, v in p["peak_by_category_gib"].items()]
    if p["sharding"] == "hybrid" and p["grad_accumulation"] > 1:
        lines.append("    (hybrid: until the window's last micro-batch the gradient shards accumulate in FSDP2's "
                     "reduce buffer, which the tracker counts as temporaries)")
    verdict = "fits" if p["fits"] else "DOES NOT FIT"
    lines += [
        f"    {'peak':22s}{gib(p['peak_gib_per_gpu'])}   limit {p['limit_gib']:.2f} GiB ({p['gpu']} "
        f"{p['gpu_memory_gib']:.2f} GiB less {p['reserve_gib']:g} GiB reserve): {verdict}",
        f"    {'state':22s}{gib(p['state_gib_per_gpu'])}   "
        + ("bf16 frozen base + fp32 adapters, their gradients and AdamW moments" if p["method"] == "lora"
           else "fp32 parameters + gradients + AdamW moments")
        + f", sharded {p['shard_group_size']} ways"
        + (" (the state alone exceeds the limit: no step simulated, FLOPs from the formula)"
           if p.get("state_exceeds_limit") else ""),
        f"  FLOPs/step {p['flops_per_step']:.3e} executed (FlopCounterMode, recomputation included); model FLOPs "
        f"{p['model_flops_per_step_counted']:.3e} counted (3 x forward) vs {p['model_flops_per_step_formula']:.3e} "
        f"metrics.py (6N + 12LdT), ratio {p['counted_over_formula']:.4f}",
        f"  step time  {p['step_time_s']:.3f} s = compute {p['compute_s']:.3f} s (at {p['efficiency']:.0%} of "
        f"{p['gpu_bf16_tflops']:g} TFLOP/s bf16) + network {p['network_s']:.3f} s "
        f"({p['cross_node_bytes_per_rank'] / 1e9:.2f} GB per rank across nodes, {p['ranks_per_node']} ranks on "
        f"{p['network_gbps']:g} Gbit/s); no overlap assumed (full overlap: {p['step_time_full_overlap_s']:.3f} s)",
        f"  throughput {p['tokens_per_s']:,.0f} tokens/s ({p['tokens_per_step']:,} tokens/step), predicted MFU "
        f"{p['predicted_mfu']:.1%}",
        f"  run        {p['max_steps']} steps = {p['run_hours']:.2f} h, ${p['run_cost_usd']:,.2f} on demand "
        f"(${p['cost_per_hour_usd']:.2f}/h for the cluster; start-up and image pull not included)",
        f"  (planned in {p['plan_seconds']:.0f} s on this CPU)",
    ]
    return "\n".join(lines)
